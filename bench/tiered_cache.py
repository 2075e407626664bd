"""KV offload tiers (issue 37): TTFT of a long document reused after its device blocks were
evicted, served from the host / disk / Redis tier, against a cold run, one process.

The embedded default model (hyla/assets/default_model: KDA + DSA, 32K context) serves, in one
engine with all three tiers (the host tier first, then disk, then Redis):

    warm      a 1K-token prompt (the process's one-time costs; not timed)
    cold      doc + question: nothing cached anywhere (the baseline)
    device    doc + another question while the document is on the device (a plain hit)
    host      every device block evicted (written down to all tiers, the write-down finished
              before the clock starts), then doc + question: loaded from the host tier
    disk      evicted again, the host tier emptied: from the disk tier
    remote    evicted again, host and disk emptied: from Redis

TTFT = wall seconds from `add_request` to the step returning the first token (max_tokens=1).
Each hit reports whether its first token equals the cold run's and its logprob difference (a hit
resumes at a block boundary: the rest is computed in other chunks than the cold run's, so
fp32 sums may round differently; tests/engine/test_tiered_cache.py checks 1e-6 on tiny
models). The remote tier needs `redis-server` (started here on a free port).

    HYLA_COMMIT=$(git rev-parse HEAD) python3 bench/tiered_cache.py       # CPU, 16K, saved
    python3 bench/tiered_cache.py --doc-len 2048 --no-save                # smoke test
    python3 bench/tiered_cache.py --gpu-roundtrip                         # H200: GB/s

`--gpu-roundtrip` measures the device -> host -> device round trip of the host tier's copies
(`hyla.engine.kv_offload.TierIO`: one gather per cache tensor, pinned host buffers, its own
stream) on synthetic caches shaped like bench/gpu_e2e.py's model (12 layers of 576-wide bf16
MLA latents): GB/s each way and round trip, and whether the blocks came back bit-exact.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import git_commit, hardware  # noqa: E402

from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

FIRST = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=1)
GOALS = {"host": 5.0, "disk": 3.0, "remote": 3.0}


def ttft(engine: LLMEngine, rid: str, ids: list[int]) -> tuple[float, int, float, int]:
    """(seconds, first token, its logprob, cached tokens)."""
    t0 = time.perf_counter()
    engine.add_request(rid, ids, FIRST)
    while True:
        for out in engine.step():
            if out.finished:
                seconds = time.perf_counter() - t0
                c = out.outputs[0]
                return seconds, c.token_ids[0], c.logprobs[0][c.token_ids[0]], out.num_cached_tokens


def evict_device(engine: LLMEngine) -> None:
    """Take every free device block once (evicting, so writing down, each cached one), give
    them back, and finish the write-down before anything is timed."""
    pool = engine.cache.block_pool
    pool.free(pool.allocate(pool.num_free_blocks))
    engine.cache.tiers.transfer()
    engine.cache.tiers.io._send_bytes()


def engine_for(args: argparse.Namespace, **tiers) -> LLMEngine:
    return LLMEngine.from_path(
        None, device=args.device, max_model_len=args.doc_len + 256, max_num_seqs=2,
        max_num_batched_tokens=args.chunk, kv_cache_memory=args.kv_cache_memory, **tiers,
    )  # fmt: skip


def run_tiers(args: argparse.Namespace, workdir: Path, url: str | None) -> dict:
    g = torch.Generator().manual_seed(args.seed)
    doc = torch.randint(3, 8000, (args.doc_len,), generator=g).tolist()
    question, other = (torch.randint(3, 8000, (32,), generator=g).tolist() for _ in range(2))
    warm = torch.randint(3, 8000, (1024,), generator=g).tolist()
    tiers = dict(kv_offload_host_gib=args.tier_gib, kv_offload_disk_gib=args.tier_gib,
                 kv_offload_disk_dir=str(workdir), kv_offload_remote_url=url)  # fmt: skip
    engine = engine_for(args, **tiers)
    ttft(engine, "warm", warm)  # the process's one-time costs
    cold = ttft(engine, "cold", doc + question)
    rows = {"cold": dict(ttft_s=cold[0], token=cold[1], logprob=cold[2], cached_tokens=cold[3])}
    rows["device"] = row(ttft(engine, "device", doc + other), cold, same_prompt=False)
    host, disk, *remote = engine.cache.tiers.tiers
    faster = {"host": [], "disk": [host], "remote": [host, disk]}
    for kind in ["host", "disk"] + (["remote"] if remote else []):
        hits, loads = [], 0
        for rep in range(args.reps):  # the fastest of `reps` (a shared machine's noise)
            evict_device(engine)
            for tier in faster[kind]:
                tier.clear()
            before = engine.cache.tiers.stats.num_loads
            hits.append(ttft(engine, f"{kind}{rep}", doc + question))
            loads += engine.cache.tiers.stats.num_loads - before
        best = min(hits)
        rows[kind] = row(best, cold, loads=loads, ttft_all_s=[h[0] for h in hits])
    if not remote:
        rows["remote"] = {"skipped": "redis-server not installed"}
    return rows


def tier_rows(args: argparse.Namespace) -> dict:
    from tests.redis_server import redis_server

    workdir = Path(tempfile.mkdtemp(prefix="hyla-tier-bench-"))
    try:
        if shutil.which("redis-server") is None:
            return run_tiers(args, workdir, None)
        with redis_server() as url:
            return run_tiers(args, workdir, url)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def row(hit: tuple, cold: tuple, same_prompt: bool = True, **extra) -> dict:
    out = dict(ttft_s=hit[0], cached_tokens=hit[3], speedup_vs_cold=cold[0] / hit[0], **extra)
    if same_prompt:
        out.update(same_first_token=hit[1] == cold[1], logprob_diff=abs(hit[2] - cold[2]))
    return out


def gpu_roundtrip(args: argparse.Namespace) -> dict:
    from hyla.cache.tiers import HostTier, Transfers
    from hyla.engine.kv_offload import TierIO

    device = torch.device("cuda")
    layers, width, block, n = 12, 576, 16, args.roundtrip_blocks
    tensors = [torch.randn(2 * n + 1, block, width, device=device, dtype=torch.bfloat16)
               for _ in range(layers)]  # fmt: skip
    host = HostTier(1 << 40)
    io = TierIO(tensors, [], 0, [host])
    src, dst = list(range(1, n + 1)), list(range(n + 1, 2 * n + 1))
    nbytes = n * layers * block * width * 2
    keys = [k.to_bytes(8, "little") for k in range(n)]
    results = []
    for rep in range(args.reps + 1):  # the first is a warm-up
        host._entries.clear()
        host._bytes = 0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        io(Transfers(spill_blocks=list(zip(src, keys, strict=True))))
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        loads = [(d, host.get(k), False) for d, k in zip(dst, keys, strict=True)]
        io(Transfers(load_blocks=loads))
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if rep:
            results.append((t1 - t0, t2 - t1))
    exact = all(torch.equal(t[1 : n + 1], t[n + 1 :]) for t in tensors)
    down = min(r[0] for r in results)
    up = min(r[1] for r in results)
    return dict(
        blocks=n, bytes=nbytes, device_to_host_gbps=nbytes / down / 1e9,
        host_to_device_gbps=nbytes / up / 1e9, round_trip_gbps=2 * nbytes / (down + up) / 1e9,
        bit_exact=exact, goal_gbps=10.0, device=torch.cuda.get_device_name(),
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--doc-len", type=int, default=16384)
    p.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    p.add_argument("--kv-cache-memory", default="1GiB")
    p.add_argument("--tier-gib", type=float, default=2.0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-roundtrip", action="store_true")
    p.add_argument("--roundtrip-blocks", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3, help="timed hits per tier (the fastest)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared host)")
    p.add_argument("--out", default=None)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.gpu_roundtrip:
        result = {"roundtrip": gpu_roundtrip(args)}
        default_out = "bench/results/tiered_cache_roundtrip_h200.json"
    else:
        result = {"doc_len": args.doc_len, "rows": tier_rows(args), "goals_speedup": GOALS}
        default_out = "bench/results/tiered_cache_cpu.json"
    result.update(command=" ".join(sys.argv), commit=git_commit(), hardware=hardware())
    print(json.dumps(result, indent=2))
    if not args.no_save:
        out = ROOT / (args.out or default_out)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
