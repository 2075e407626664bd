"""Known accelerators for `hyla plan`: datasheet dense figures of the SXM/OAM parts; memory as the
driver reports it; `link_bw` one direction of the GPU-to-GPU fabric."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GiB = 1 << 30
TB = 1e12


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator; `fp8_flops` None: no fp8 tensor cores (fp8 weights run at the bf16 rate)."""

    name: str
    memory: int
    memory_bw: float
    bf16_flops: float
    fp8_flops: float | None
    link_bw: float

    def __post_init__(self) -> None:
        for name in ("memory", "memory_bw", "bf16_flops", "link_bw"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"gpu.{name}: must be a positive number, got {value!r}")
        if self.fp8_flops is not None and self.fp8_flops <= 0:
            raise ValueError(f"gpu.fp8_flops: must be positive, got {self.fp8_flops!r}")

    def flops(self, dtype: str) -> float:
        return self.fp8_flops if self.peak_name(dtype) == "fp8" else self.bf16_flops

    def peak_name(self, dtype: str) -> str:
        """Which peak: "fp8", else "bf16" (float32 is timed at the bf16 rate too: optimistic)."""
        return "fp8" if dtype == "fp8" and self.fp8_flops is not None else "bf16"

    def replace(self, **changes: object) -> GPUSpec:
        """A copy with the given fields changed (None values ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def _gpu(
    name: str, mem_gib: float, bw_tb: float, bf16_tf: float, fp8_tf: float | None, link_gb: float
) -> GPUSpec:
    return GPUSpec(name=name, memory=int(mem_gib * GiB), memory_bw=bw_tb * TB,
                   bf16_flops=bf16_tf * 1e12, fp8_flops=None if fp8_tf is None else fp8_tf * 1e12,
                   link_bw=link_gb * 1e9)  # fmt: skip


# name -> spec; memory in GiB as the driver reports it, bandwidth TB/s, dense TFLOP/s, link GB/s
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        _gpu("A100", 80.0, 2.039, 312, None, 300),
        _gpu("H100", 79.6, 3.35, 989, 1979, 450),
        _gpu("H20", 95.6, 4.0, 148, 296, 450),
        _gpu("H200", 140.4, 4.8, 989, 1979, 450),
        _gpu("B200", 179.1, 8.0, 2250, 4500, 900),
        _gpu("GB200", 184.0, 8.0, 2500, 5000, 900),
        _gpu("L40S", 44.4, 0.864, 362, 733, 32),
        _gpu("MI300X", 191.5, 5.3, 1307, 2615, 448),
        _gpu("MI325X", 255.5, 6.0, 1307, 2615, 448),
    )
}


def gpu_spec(name: str) -> GPUSpec:
    """A known GPU's spec (case-insensitive). Raises ValueError listing the known ones."""
    for key, spec in GPUS.items():
        if key.lower() == name.lower():
            return spec
    raise ValueError(
        f"gpu: unknown {name!r}; known: {', '.join(GPUS)} (or pass --memory-gib, "
        "--memory-bw-tbs, --bf16-tflops to describe another)"
    )
