"""DSA decode attention per layer on one GPU: lightning indexer + top-k + sparse MLA (Triton,
`hyla.ops.*.kernels`) vs dense absorbed-MLA attention over the same latent cache, same run.

DeepSeek-V3.2 shapes: 128 heads, latent R 512 + Dr 64 (bf16), indexer 64 heads x 128 (bf16
keys), top-k 2048, block size 64; one new token per sequence, contexts 8K .. 1M, batch 1 and 16.
Caches hold random data under a random block table (one permutation of all blocks), allocated
once for 16 x 1M tokens (19.3 GB latents + 4.3 GB keys) and sliced per point.

    times (ms, median of triton.testing.do_bench, L2 flushed between runs)
      index_scores   Triton scores -> int64 sort keys [B, L]
      topk           torch.topk on those keys + decode to positions
      radix_topk     the Triton radix select on the same keys (`topk.radix_topk_columns`)
      segmented_topk two torch.topk stages over 64 segments of each row
                     (`select.segmented_topk_columns`)
      indexer        both (the public `lightning_indexer_topk`; radix top-k from
                     RADIX_MIN_COLS columns on, torch.topk below)
      sparse_latent  the Triton sparse latent attention alone (q_lat given)
      sparse_mla     query absorption bmm + sparse latent attention + value bmm
      total          indexer + sparse_mla (one decode step of the layer's attention)
      gather         index_select of the whole context's latents into [B, L, 576] (dense
                     baselines need it; not included in their times)
      dense_einsum   absorbed MLA core on the gathered latents, plain PyTorch einsum + softmax
                     (like PERFORMANCE.md's figure; excludes absorption/value projection)
      dense_sdpa     F.scaled_dot_product_attention on the gathered latents (enable_gqa), or
                     "oom"
      total_graph    `total` captured in one CUDA graph and replayed (device lengths, as the
                     engine's captured decode steps run it): no launch or host time
      dense_einsum_graph  `dense_einsum` replayed from a CUDA graph likewise
      topk_graph, radix_topk_graph, segmented_topk_graph   the three top-k forms replayed
      topk_unsorted, topk_float32 (+ _graph)   probes for a faster long-row top-k: torch.topk
                     of the keys without sorting the k best, and of float32 scores (not exact:
                     ties), same k
      total_graph_radix   `total_graph` with the radix top-k (RADIX_MIN_COLS = 1)
    speedup = dense_einsum / total (and dense_sdpa / total); speedup_graph = the graph pair
    bytes  = indexer keys of the whole context + min(L, k) selected latents + queries
             (q_index, weights, q_nope, q_rope); kv_b weights (33.5 MB) are not counted
    bw_fraction = bytes / total / measured D2D copy bandwidth (2 * bytes copied / copy time)

    PYTHONPATH=. python3 bench/gpu_dsa_decode.py            # H200, < 3 min
    PYTHONPATH=. python3 bench/gpu_dsa_decode.py --sweep    # tunables at 128K/1M, B 1 and 16
    PYTHONPATH=. python3 bench/gpu_dsa_decode.py --kv-cache-dtype fp8   # + fp8 cache rows
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/gpu_dsa_decode.py --smoke   # CPU bug check

`--kv-cache-dtype fp8` adds, per point, the same sparse path over an fp8 cache (e4m3 latents
and indexer keys with one float32 scale per token, `hyla.cache.spec`; random values) with
`fp8_vs_bf16_total` (and `_graph`) = fp8 time / bf16 time of the same point, same run.

Tunables can be overridden from the environment: HYLA_IDX_BLOCK_N, HYLA_IDX_WARPS,
HYLA_IDX_STAGES, HYLA_MLA_BLOCK_H, HYLA_MLA_BLOCK_N, HYLA_MLA_WARPS, HYLA_MLA_STAGES,
HYLA_MLA_MIN_SPLIT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402

from hyla.ops.dsa_indexer import kernels as idx_k  # noqa: E402
from hyla.ops.dsa_indexer import select as idx_select  # noqa: E402
from hyla.ops.dsa_indexer import topk as idx_topk  # noqa: E402
from hyla.ops.mla.reference import split_kv_b  # noqa: E402
from hyla.ops.sparse_attention import kernels as mla_k  # noqa: E402

H, DN, DR, DV, R = 128, 128, 64, 128, 512
HI, DI, TOPK, PAGE = 64, 128, 2048, 64
CONTEXTS = [8192, 32768, 131072, 524288, 1048576]
BATCHES = [1, 16]
KNOBS = {
    "HYLA_IDX_BLOCK_N": (idx_k, "BLOCK_N"),
    "HYLA_IDX_WARPS": (idx_k, "NUM_WARPS"),
    "HYLA_IDX_STAGES": (idx_k, "NUM_STAGES"),
    "HYLA_MLA_BLOCK_H": (mla_k, "BLOCK_H"),
    "HYLA_MLA_BLOCK_N": (mla_k, "BLOCK_N"),
    "HYLA_MLA_WARPS": (mla_k, "NUM_WARPS"),
    "HYLA_MLA_STAGES": (mla_k, "NUM_STAGES"),
    "HYLA_MLA_MIN_SPLIT": (mla_k, "MIN_IDX_PER_SPLIT"),
}


def apply_knobs() -> dict[str, int]:
    for env, (mod, name) in KNOBS.items():
        if env in os.environ:
            setattr(mod, name, int(os.environ[env]))
    return {env: getattr(mod, name) for env, (mod, name) in KNOBS.items()}


def timed(fn) -> float:
    """Median milliseconds (CUDA: do_bench after warm-up; CPU smoke: one call)."""
    if not torch.cuda.is_available():
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a D2D copy, read + write counted."""
    src = torch.empty(1 << 30 if device == "cuda" else 1 << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / (timed(lambda: dst.copy_(src)) * 1e-3)


class Setup:
    """Caches for max_batch x max_context tokens, allocated once; per-point views."""

    def __init__(
        self, max_batch: int, max_context: int, device: str, topk: int, fp8: bool = False
    ) -> None:
        self.device, self.topk, self.fp8 = device, topk, fp8
        num_pages = max_batch * max_context // PAGE
        self.latent = torch.randn(num_pages, PAGE, R + DR, dtype=torch.bfloat16, device=device)
        self.keys = torch.randn(num_pages, PAGE, DI, dtype=torch.bfloat16, device=device)
        self.latent_scale = self.keys_scale = None
        if fp8:  # e4m3 entries (random: timing only) and one float32 scale per token
            self.latent = self.latent.to(torch.float8_e4m3fn)
            self.keys = self.keys.to(torch.float8_e4m3fn)
            self.latent_scale = torch.rand(num_pages, PAGE, device=device) + 0.5
            self.keys_scale = torch.rand(num_pages, PAGE, device=device) + 0.5
        perm = torch.randperm(num_pages, device=device).to(torch.int32)
        self.tables = perm.view(max_batch, -1)
        gen = torch.Generator(device=device).manual_seed(0)
        self.kv_b = torch.randn(H * (DN + DV), R, generator=gen, device=device) / R**0.5
        self.kv_b = self.kv_b.to(torch.bfloat16)

    def point(self, batch: int, context: int) -> dict:
        dev, bf16 = self.device, torch.bfloat16
        return {
            "tables": self.tables[:batch, : context // PAGE],
            "cu": torch.arange(batch + 1, dtype=torch.int32, device=dev),
            "seq_lens": [context] * batch,
            "q_idx": torch.randn(batch, HI, DI, dtype=bf16, device=dev),
            "w": torch.randn(batch, HI, device=dev),
            "q_nope": torch.randn(batch, H, DN, dtype=bf16, device=dev),
            "q_rope": torch.randn(batch, H, DR, dtype=bf16, device=dev),
        }


def sparse_fns(s: Setup, p: dict) -> dict:
    scale = (DN + DR) ** -0.5
    args = (s.keys, p["tables"], p["cu"], p["seq_lens"], s.topk, DI**-0.5)
    batch, context = len(p["seq_lens"]), p["seq_lens"][0]
    key_buf = torch.empty(batch, context, dtype=torch.int64, device=s.device)
    row_seq, row_pos = idx_k.row_positions(p["cu"], p["seq_lens"], batch)

    def index_scores():
        idx_k._launch(
            p["q_idx"], p["w"], s.keys, s.keys_scale, p["tables"], row_seq, row_pos, key_buf, 0,
            DI**-0.5, 1, write_keys=True,
        )  # fmt: skip

    def indexer():
        return idx_k.lightning_indexer_topk(p["q_idx"], p["w"], *args, s.keys_scale)

    selected = indexer()
    w_uk, _ = split_kv_b(s.kv_b, H, DN)
    q_lat = torch.bmm(p["q_nope"].transpose(0, 1), w_uk).transpose(0, 1)
    mla_args = (s.latent, p["tables"], p["cu"])

    def sparse_mla(sel=selected):
        return mla_k.sparse_mla(
            p["q_nope"], p["q_rope"], *mla_args, sel, s.kv_b, scale, latent_scale=s.latent_scale
        )

    index_scores()
    k = min(s.topk, context)
    scores32 = (key_buf >> 31).float()  # the scores the keys order, as float32 (probe only)
    return {
        "index_scores": index_scores,
        "topk": lambda: idx_select.topk_columns_reference(key_buf, row_pos, s.topk),
        "topk_unsorted": lambda: torch.topk(key_buf, k, dim=1, sorted=False),
        "topk_float32": lambda: torch.topk(scores32, k, dim=1),
        "radix_topk": lambda: idx_topk.radix_topk_columns(key_buf, row_pos, s.topk),
        "segmented_topk": lambda: idx_select.segmented_topk_columns(key_buf, row_pos, s.topk),
        "indexer": indexer,
        "sparse_latent": lambda: mla_k.sparse_latent_attention(
            q_lat,
            p["q_rope"],
            s.latent,
            p["tables"],
            row_seq,
            selected,
            scale,
            latent_scale=s.latent_scale,
        ),  # fmt: skip
        "sparse_mla": sparse_mla,
        "total": lambda: sparse_mla(indexer()),
    }


def graph_timed(fn, radix_min_cols: int | None = None) -> float | str:
    """Median ms of replaying `fn` captured in a CUDA graph (warmed up on a side stream
    first); "capture failed: ..." when it cannot be captured; `timed(fn)` off CUDA.
    `radix_min_cols` replaces `kernels.RADIX_MIN_COLS` while `fn` is warmed up and captured."""
    default = idx_k.RADIX_MIN_COLS
    idx_k.RADIX_MIN_COLS = radix_min_cols if radix_min_cols is not None else default
    try:
        return _graph_timed(fn)
    finally:
        idx_k.RADIX_MIN_COLS = default


def _graph_timed(fn) -> float | str:
    if not torch.cuda.is_available():
        return timed(fn)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as exc:
        return f"capture failed: {str(exc)[:80]}"
    return timed(graph.replay)


def captured_total(s: Setup, p: dict):
    """`total` as a captured decode step calls it: lengths as a device tensor with a host bound
    (`max_seq_len`), so nothing is copied from the host inside the graph."""
    scale = (DN + DR) ** -0.5
    lens = torch.tensor(p["seq_lens"], dtype=torch.int32, device=s.device)
    bound = max(p["seq_lens"])

    def step():
        selected = idx_k.lightning_indexer_topk(
            p["q_idx"], p["w"], s.keys, p["tables"], p["cu"], lens, s.topk, DI**-0.5,
            s.keys_scale, max_seq_len=bound,
        )  # fmt: skip
        return mla_k.sparse_mla(
            p["q_nope"], p["q_rope"], s.latent, p["tables"], p["cu"], selected, s.kv_b, scale,
            latent_scale=s.latent_scale,
        )  # fmt: skip

    return step


def dense_times(s: Setup, p: dict) -> dict:
    """Gather + dense baselines (einsum, SDPA) on the same latents; "oom" where they do not fit."""
    out: dict = {}
    scale = (DN + DR) ** -0.5
    batch, context = len(p["seq_lens"]), p["seq_lens"][0]
    pos = torch.arange(context, device=s.device)
    slots = (p["tables"].long()[:, pos // PAGE] * PAGE + pos % PAGE).reshape(-1)
    flat = s.latent.view(-1, R + DR)
    out["gather"] = timed(lambda: flat.index_select(0, slots))
    lat = flat.index_select(0, slots).view(batch, context, R + DR)
    w_uk, _ = split_kv_b(s.kv_b, H, DN)
    q_lat = torch.bmm(p["q_nope"].transpose(0, 1), w_uk).transpose(0, 1)
    q = torch.cat([q_lat, p["q_rope"]], dim=-1)  # [B, H, 576]

    def einsum():
        scores = torch.einsum("bhd,bld->bhl", q, lat) * scale
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.einsum("bhl,blr->bhr", probs, lat[..., :R])

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(
            q[:, :, None], lat[:, None], lat[:, None, :, :R], scale=scale, enable_gqa=True
        )

    for name, fn in (("dense_einsum", einsum), ("dense_sdpa", sdpa)):
        try:
            out[name] = timed(fn)
            if name == "dense_einsum":
                out["dense_einsum_graph"] = graph_timed(fn)
        except torch.OutOfMemoryError:
            out[name] = "oom"
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def bytes_read(batch: int, context: int, topk: int, fp8: bool = False) -> int:
    per, scale = (1, 4) if fp8 else (2, 0)  # bytes per element; a float32 scale per token
    keys = context * (DI * per + scale)
    latents = min(context, topk) * ((R + DR) * per + scale)
    queries = HI * DI * 2 + HI * 4 + H * (DN + DR) * 2
    return batch * (keys + latents + queries)


def run_point(s: Setup, batch: int, context: int, bw: float, dense: bool) -> dict:
    p = s.point(batch, context)
    res: dict = {"batch": batch, "context": context}
    fns = sparse_fns(s, p)
    for name, fn in fns.items():
        res[name] = timed(fn)
    for name in ("topk", "radix_topk", "segmented_topk", "topk_unsorted", "topk_float32"):
        res[f"{name}_graph"] = graph_timed(fns[name])
    res["total_graph"] = graph_timed(captured_total(s, p))
    res["total_graph_radix"] = graph_timed(captured_total(s, p), radix_min_cols=1)
    if dense:
        res.update(dense_times(s, p))
    total_s = res["total"] * 1e-3
    res["bytes"] = bytes_read(batch, context, s.topk, s.fp8)
    res["bw_fraction"] = res["bytes"] / total_s / bw
    key_bytes = batch * context * (DI + 4 if s.fp8 else 2 * DI)
    res["index_scores_bw_fraction"] = key_bytes / (res["index_scores"] * 1e-3) / bw
    for base in ("dense_einsum", "dense_sdpa"):
        if isinstance(res.get(base), float):
            res[f"speedup_vs_{base[6:]}"] = res[base] / res["total"]
    if isinstance(res["total_graph"], float):
        res["bw_fraction_graph"] = res["bytes"] / (res["total_graph"] * 1e-3) / bw
        if isinstance(res.get("dense_einsum_graph"), float):
            res["speedup_graph"] = res["dense_einsum_graph"] / res["total_graph"]
    return res


def fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="sweep tunables at 128K and 1M")
    parser.add_argument("--smoke", action="store_true", help="CPU/interpreter bug check")
    parser.add_argument("--out", default=None)
    parser.add_argument("--contexts", default=None, help="comma-separated, e.g. 131072,1048576")
    parser.add_argument("--batches", default=None, help="comma-separated, e.g. 1")
    parser.add_argument(
        "--kv-cache-dtype", default="bfloat16", choices=["bfloat16", "fp8"],
        help="fp8: also time every point over an fp8 cache (ratio to bf16)",
    )  # fmt: skip
    args = parser.parse_args()
    knobs = apply_knobs()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    contexts, batches, topk = CONTEXTS, BATCHES, TOPK
    if args.smoke:
        contexts, batches, topk = [256, 1024], [1, 2], 128
    contexts = [int(c) for c in args.contexts.split(",")] if args.contexts else contexts
    batches = [int(b) for b in args.batches.split(",")] if args.batches else batches
    bw = copy_bandwidth(device)
    s = Setup(max(batches), max(contexts), device, topk)
    s8 = (
        Setup(max(batches), max(contexts), device, topk, fp8=True)
        if args.kv_cache_dtype == "fp8"
        else None
    )
    print(f"D2D copy {bw / 1e12:.2f} TB/s; knobs {knobs}")
    results = sweep(s, bw, topk) if args.sweep else []
    for context in [] if args.sweep else contexts:
        for batch in batches:
            res = run_point(s, batch, context, bw, dense=True)
            results.append(res)
            print(" ".join(f"{k}={fmt(v)}" for k, v in res.items()), flush=True)
            if s8 is not None:
                res8 = {"kv_cache_dtype": "fp8", **run_point(s8, batch, context, bw, dense=False)}
                for key in ("total", "total_graph"):
                    if isinstance(res8.get(key), float) and isinstance(res.get(key), float):
                        res8[f"fp8_vs_bf16_{key}"] = res8[key] / res[key]
                results.append(res8)
                print(" ".join(f"{k}={fmt(v)}" for k, v in res8.items()), flush=True)
    name = "gpu_dsa_decode_sweep_h200" if args.sweep else "gpu_dsa_decode_h200"
    name += "_fp8" if s8 is not None else ""
    out = Path(args.out or ROOT / "bench" / "results" / f"{name}.json")
    record = {
        "command": " ".join(["python3", *sys.argv]),
        "commit": _commit(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bandwidth_TBps": bw / 1e12,
        "knobs": knobs,
        "results": results,
    }
    if not args.smoke or args.out:
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")


def sweep(s: Setup, bw: float, topk: int) -> list[dict]:
    """Indexer (BLOCK_N x warps) and sparse MLA (BLOCK_H x BLOCK_N x warps) tunables."""
    results = []
    points = [(1, 131072), (16, 131072), (1, 1048576), (16, 1048576)]
    defaults = {env: getattr(mod, name) for env, (mod, name) in KNOBS.items()}
    grid = [{"HYLA_IDX_BLOCK_N": n, "HYLA_IDX_WARPS": w} for n in (64, 128, 256) for w in (4, 8)]
    grid += [
        {"HYLA_MLA_BLOCK_H": h, "HYLA_MLA_BLOCK_N": n, "HYLA_MLA_WARPS": w}
        for h in (16, 32, 64)
        for n in (16, 32, 64)
        for w in (4, 8)
    ]
    for setting in grid:
        for env, (mod, name) in KNOBS.items():
            setattr(mod, name, setting.get(env, defaults[env]))
        for batch, context in points:
            p = s.point(batch, context)
            fns = sparse_fns(s, p)
            part = "index_scores" if "HYLA_IDX_BLOCK_N" in setting else "sparse_latent"
            try:
                ms = timed(fns[part])
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record it
                ms = f"error: {type(exc).__name__}"
            res = {**setting, "batch": batch, "context": context, part: ms}
            results.append(res)
            print(" ".join(f"{k}={fmt(v)}" for k, v in res.items()), flush=True)
    return results


def _commit() -> str:
    try:
        from throughput import git_commit  # bench/throughput.py: reads .git without git

        return git_commit() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    main()
