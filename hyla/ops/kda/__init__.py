"""Kimi Delta Attention on packed varlen rows: CUDA inputs go to fla-core (`kernels.py`) when
installed, others to `cpu.py`; `reference.py` is the definition both are tested against."""

from hyla.ops.kda import cpu, kernels

chunk_kda = kernels.dispatch(cpu.chunk_kda, kernels.chunk_kda)
recurrent_kda = kernels.dispatch(cpu.recurrent_kda, kernels.recurrent_kda)

__all__ = ["chunk_kda", "recurrent_kda"]
