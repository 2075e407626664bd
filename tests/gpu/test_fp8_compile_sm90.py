"""The fp8 decode kernels compile for the H200 (sm_90) on a machine without a GPU
(`triton.compile` with a CUDA target and the ptxas that triton ships), with no register spills:
a kernel that only the interpreter ever ran can still fail to compile or spill on the device.
The compiling runs in a subprocess (`python3 -m tests.gpu.test_fp8_compile_sm90`): this process
may have triton in interpreter mode. Skipped without triton or its NVIDIA backend tools."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BF16, FP8, F32, I32, I64 = "*bf16", "*fp8e4nv", "*fp32", "i32", "i64"
C = "constexpr"
# GEMV (rows, columns, k-groups of 128 per load, stages, warps, prefetch): the default pick,
# wider programs with a K loop (pipelined, prefetched), the multi-row form (sweep candidates)
GEMV_CASES = [(1, 4, 16, 1, 4, False), (1, 16, 4, 3, 4, False), (1, 16, 4, 1, 4, True),
              (1, 32, 2, 1, 8, True), (4, 4, 4, 2, 4, True), (16, 4, 2, 1, 8, False)]  # fmt: skip
# GEMM (block_m, block_n, x quantized in the kernel)
GEMM_CASES = [(16, 32, True), (64, 64, True), (16, 128, False), (64, 64, False)]
NUM_CASES = len(GEMV_CASES) + len(GEMM_CASES) + 6  # the kernels and tile picks `_cases` yields


def _tools() -> str:
    spec = importlib.util.find_spec("triton")
    root = os.path.dirname(spec.origin) if spec and spec.origin else ""
    return os.path.join(root, "backends", "nvidia", "bin")


pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(_tools(), "cuobjdump")), reason="no triton NVIDIA tools"
)


UNALIGNED = {"M", "P", "STEPS_SPLIT", "J_SPLIT", "I_BLOCKS", "SPLITS"}  # counts, not sizes


def _aligned(signature: dict) -> dict:
    """The specialization of a typical launch (decode shapes): pointers 16-byte aligned,
    strides and sizes divisible by 16. Without it the compile takes no vector loads and no
    software pipelining (cp.async): twice the GEMV's registers, the GEMM loop unpipelined."""
    return {
        (i,): [["tt.divisibility", 16]]
        for i, (name, ty) in enumerate(signature.items())
        if ty.startswith("*") or (ty == I32 and name not in UNALIGNED)
    }


def _compile(fn, signature: dict, constexprs: dict, num_warps: int, aligned: bool) -> str:
    """Resource usage line of `fn` compiled for sm_90 (cuobjdump), e.g. 'REG:128 ... LOCAL:0'."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = _aligned(signature) if aligned else None
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([os.path.join(_tools(), "cuobjdump"), "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    return next(line for line in out.splitlines() if "REG:" in line)


def _cases():
    from hyla.ops.fp8 import align_kernel, kernels, moe_kernels

    strides = lambda *names: {n: I32 for n in names}  # noqa: E731
    gemv = {"x_ptr": BF16, "w_ptr": FP8, "ws_ptr": F32, "o_ptr": BF16, "M": I32, "N": I32,
            "K": I32, "STEPS_SPLIT": I32,
            **strides("stride_xm", "stride_wn", "stride_wsn", "stride_om", "stride_os"),
            "BN_SCALE": C, "BLOCK_M": C, "BLOCK_N": C, "GROUP": C, "GROUPS": C,
            "NUM_STAGES": C, "PREFETCH": C}  # fmt: skip
    for rows, cols, groups, stages, warps, prefetch in GEMV_CASES:
        consts = dict(BN_SCALE=128, BLOCK_M=rows, BLOCK_N=cols, GROUP=128, GROUPS=groups,
                      NUM_STAGES=stages, PREFETCH=prefetch)  # fmt: skip
        yield kernels._gemv_kernel, gemv, consts, warps
    gemm = {"x_ptr": BF16, "xs_ptr": BF16, "w_ptr": FP8, "ws_ptr": F32, "o_ptr": BF16,
            "M": I32, "N": I32, "K": I32, "J_SPLIT": I32,
            **strides("stride_xm", "stride_xsm", "stride_wn", "stride_wsn", "stride_om",
                      "stride_os"),
            "BN_SCALE": C, "BLOCK_M": C, "BLOCK_N": C, "BLOCK_K": C, "QUANTIZE": C,
            "DOT_FP8": C}  # fmt: skip
    for bm, bn, quantize in GEMM_CASES:
        consts = dict(BN_SCALE=128, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, QUANTIZE=quantize,
                      DOT_FP8=True)  # fmt: skip
        yield kernels._gemm_kernel, gemm, consts, 4
    sums = {"p_ptr": F32, "o_ptr": BF16, "SPLITS": I32, "SIZE": I32, "BLOCK": C}
    yield kernels._sum_splits_kernel, sums, dict(BLOCK=1024), 4
    moe = strides("stride_we", "stride_wr", "stride_wse", "stride_wsr")
    gate_up = {"x_ptr": BF16, "w_ptr": FP8, "ws_ptr": F32, "sw_ptr": FP8, "ss_ptr": F32,
               "ids_ptr": "*i64", "h_ptr": BF16, "P": I32, "D": I32, "I": I32, "I_BLOCKS": I32,
               "stride_xt": I32, **moe, "stride_hp": I32,
               "TOPK": C, "BN_SCALE": C, "BLOCK_I": C, "GROUP": C, "GROUPS": C}  # fmt: skip
    consts = dict(TOPK=4, BN_SCALE=128, BLOCK_I=4, GROUP=128, GROUPS=16)
    yield moe_kernels._gate_up_gemv_kernel, gate_up, consts, 8
    down = {"h_ptr": BF16, "w_ptr": FP8, "ws_ptr": F32, "sw_ptr": FP8, "ss_ptr": F32,
            "ids_ptr": "*i64", "wts_ptr": F32, "out_ptr": BF16, "P": I32, "D": I32, "I": I32,
            "stride_hp": I32, **moe, "stride_ot": I32, "TOPK": C, "BLOCK_K": C, "BN_SCALE": C,
            "BLOCK_D": C, "GROUP": C, "GROUPS": C, "SHARED": C}  # fmt: skip
    consts = dict(TOPK=4, BLOCK_K=4, BN_SCALE=128, BLOCK_D=4, GROUP=128, GROUPS=4, SHARED=True)
    yield moe_kernels._down_gemv_kernel, down, consts, 4
    for x_type, quantize in ((BF16, True), (FP8, False)):
        grouped = {"x_ptr": x_type, "xs_ptr": F32, "w_ptr": FP8, "ws_ptr": F32,
                   "pairs_ptr": "*i64", "block_expert_ptr": "*i64", "h_ptr": BF16, "P": I32,
                   "D": I32, "I": I32, "I_BLOCKS": I32, "stride_xt": I32, "stride_xst": I32,
                   **moe, "stride_hp": I32, "TOPK": C, "BN_SCALE": C, "BLOCK_M": C,
                   "BLOCK_N": C, "BLOCK_K": C, "DOT_FP8": C, "QUANTIZE": C}  # fmt: skip
        consts = dict(TOPK=4, BN_SCALE=128, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, DOT_FP8=True,
                      QUANTIZE=quantize)  # fmt: skip
        yield moe_kernels._gate_up_grouped_kernel, grouped, consts, 4
    align = {"ids_ptr": "*i64", "pairs_ptr": "*i64", "block_expert_ptr": "*i64",
             "scratch_ptr": "*i32", "P": I32, "E": I32, "NUM_BLOCKS": I32,
             "BLOCK_M": C, "P2": C, "E2": C, "NB2": C}  # fmt: skip
    yield align_kernel._align_kernel, align, dict(BLOCK_M=16, P2=256, E2=32, NB2=64), 1


def main() -> None:
    for aligned in (True, False):  # a typical launch, and ragged shapes (K = 200, ...)
        for fn, signature, consts, warps in _cases():
            usage = _compile(fn, signature, consts, warps, aligned)
            print(fn.__name__, consts, "aligned" if aligned else "unaligned", usage, flush=True)


def test_fp8_kernels_compile_for_sm90_without_spills() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "tests.gpu.test_fp8_compile_sm90"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if "REG:" in line]
    assert len(lines) == 2 * NUM_CASES, run.stdout
    for line in lines:
        assert "LOCAL:0" in line, f"spills: {line}"


if __name__ == "__main__":
    main()
