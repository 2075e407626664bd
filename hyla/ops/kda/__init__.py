"""Kimi Delta Attention (per-channel gated delta rule). See `reference.py` for the math.

`recurrent_kda` is the token-by-token form (decode), `chunk_kda` the chunked form (prefill);
both take packed varlen inputs with `cu_seqlens` and per-sequence states. CUDA inputs go to
fla-core's kernels (`kernels.py`) when fla is installed; everything else to the vectorized
PyTorch ops of `cpu.py` (any device). `reference.py` keeps the readable definition both are
tested against. `recurrent_kda` also takes `state_indices` (a state pool; see `kernels.py`).
"""

from hyla.ops.kda import cpu, kernels

chunk_kda = kernels.dispatch(cpu.chunk_kda, kernels.chunk_kda)
recurrent_kda = kernels.dispatch(cpu.recurrent_kda, kernels.recurrent_kda)

__all__ = ["chunk_kda", "recurrent_kda"]
