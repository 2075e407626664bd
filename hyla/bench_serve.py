"""`hyla bench serve`: N streaming requests against an OpenAI-compatible server, timed at the
client (TTFT, ITL, TPOT, E2E); arrivals as vLLM's `--request-rate` (inf: at once, else Poisson)."""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

_WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head"
).split()


@dataclass(frozen=True)
class BenchConfig:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None
    num_requests: int = 64
    concurrency: int = 16
    input_len: int = 128
    output_len: int = 64
    endpoint: str = "completions"
    api_key: str | None = None
    seed: int = 0
    timeout: float = 600.0
    request_rate: float = math.inf
    progress: bool = True

    def __post_init__(self) -> None:
        base = self.url.rstrip("/")  # the server's base URL as `hyla serve` prints it works too
        object.__setattr__(self, "url", base[: -len("/v1")] if base.endswith("/v1") else base)
        for name in ("num_requests", "concurrency", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not self.request_rate > 0:  # NaN too
            raise ValueError(
                f"request_rate: must be > 0 (inf = all at once), got {self.request_rate}"
            )
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint: must be completions|chat, got {self.endpoint!r}")


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass
class BenchResult:
    config: BenchConfig
    duration: float
    num_ok: int
    num_failed: int
    prompt_tokens: int
    output_tokens: int
    percentiles: dict[str, dict[str, float]]
    errors: list[str]

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration if self.duration else 0.0

    @property
    def request_throughput(self) -> float:
        return self.num_ok / self.duration if self.duration else 0.0

    @property
    def total_throughput(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.duration if self.duration else 0.0


PERCENTILES = (50, 90, 99)


def summarize(values: list[float]) -> dict[str, float]:
    """Mean and the `PERCENTILES` of `values` (numpy, linear interpolation); zeros when empty."""
    import numpy as np

    if not values:
        return {"mean": 0.0, **{f"p{q}": 0.0 for q in PERCENTILES}}
    xs = np.asarray(values, dtype=np.float64)
    qs = np.percentile(xs, PERCENTILES)
    return {
        "mean": float(xs.mean()),
        **{f"p{q}": float(v) for q, v in zip(PERCENTILES, qs, strict=True)},
    }


def arrival_times(config: BenchConfig) -> list[float]:
    """Send times in seconds: all 0 for an infinite rate, else a seeded Poisson process."""
    import numpy as np

    n = config.num_requests
    if math.isinf(config.request_rate):
        return [0.0] * n
    gaps = np.random.default_rng(config.seed).exponential(1.0 / config.request_rate, n)
    return np.cumsum(gaps).tolist()


def make_prompts(config: BenchConfig) -> list[str]:
    rng = random.Random(config.seed)
    return [
        " ".join(rng.choice(_WORDS) for _ in range(config.input_len))
        for _ in range(config.num_requests)
    ]


def _request_body(config: BenchConfig, model: str, prompt: str) -> tuple[str, dict]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": config.output_len,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = prompt
    return "/v1/completions", body


def _chunk_text(chunk: dict) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


async def _one(client: Any, config: BenchConfig, model: str, prompt: str) -> RequestResult:
    path, body = _request_body(config, model, prompt)
    result = RequestResult(ok=False)
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message"))
                    return result
                now = time.perf_counter()
                if _chunk_text(chunk):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens", 0)
                    result.output_tokens = usage.get("completion_tokens", 0)
    except Exception as e:  # a benchmark reports failures, it does not stop on them
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = True
    return result


async def _first_model(client: Any) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def run_bench_async(config: BenchConfig) -> BenchResult:
    """Run the benchmark; raises OSError when the server cannot be reached."""
    import httpx

    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=config.concurrency)
    async with httpx.AsyncClient(
        base_url=config.url, headers=headers, limits=limits, timeout=config.timeout
    ) as client:
        try:
            model = config.model or await _first_model(client)
        except httpx.HTTPStatusError as e:
            raise OSError(
                f"{config.url}/v1/models answered {e.response.status_code}: {e.response.text[:200]}"
            ) from e
        except httpx.HTTPError as e:
            raise OSError(f"cannot reach {config.url}: {e}") from e
        gate = asyncio.Semaphore(config.concurrency)
        bar = _progress_bar(config)
        start = time.perf_counter()

        async def gated(prompt: str, at: float) -> RequestResult:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                result = await _one(client, config, model, prompt)
            if bar is not None:
                bar.update(1)
            return result

        try:
            prompts, times = make_prompts(config), arrival_times(config)
            results = await asyncio.gather(
                *(gated(p, t) for p, t in zip(prompts, times, strict=True))
            )
        finally:
            if bar is not None:
                bar.close()
        duration = time.perf_counter() - start
    return _aggregate(config, results, duration)


def _progress_bar(config: BenchConfig) -> Any:
    if not config.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=config.num_requests, desc="requests", unit="req", file=sys.stderr)


def _aggregate(config: BenchConfig, results: list[RequestResult], duration: float) -> BenchResult:
    ok = [r for r in results if r.ok]
    ms = 1000.0
    percentiles = {
        "ttft_ms": summarize([r.ttft * ms for r in ok]),
        "tpot_ms": summarize([r.tpot * ms for r in ok if r.tpot is not None]),
        "itl_ms": summarize([x * ms for r in ok for x in r.itl]),
        "e2e_s": summarize([r.e2e for r in ok]),
    }
    return BenchResult(
        config=config,
        duration=duration,
        num_ok=len(ok),
        num_failed=len(results) - len(ok),
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        output_tokens=sum(r.output_tokens for r in ok),
        percentiles=percentiles,
        errors=sorted({r.error for r in results if r.error})[:5],
    )


def run_bench(config: BenchConfig) -> BenchResult:
    return asyncio.run(run_bench_async(config))


def format_table(result: BenchResult) -> str:
    c = result.config
    rate = "inf" if math.isinf(c.request_rate) else f"{c.request_rate:g}/s (Poisson)"
    lines = [
        f"hyla bench serve: {c.num_requests} requests, concurrency {c.concurrency}, "
        f"request rate {rate}, input ~{c.input_len} words, output {c.output_len} tokens, "
        f"{c.endpoint} @ {c.url}",
        f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for name, stats in result.percentiles.items():
        lines.append(
            f"{name:<10}" + "".join(f"{stats[k]:>10.2f}" for k in ("mean", "p50", "p90", "p99"))
        )
    lines += [
        f"successful requests   {result.num_ok} (failed {result.num_failed})",
        f"duration              {result.duration:.2f} s",
        f"prompt / output tok   {result.prompt_tokens} / {result.output_tokens}",
        f"request throughput    {result.request_throughput:.2f} req/s",
        f"output throughput     {result.output_throughput:.1f} tok/s",
        f"total throughput      {result.total_throughput:.1f} tok/s",
    ]
    lines += [f"error: {e}" for e in result.errors]
    return "\n".join(lines)


def to_dict(result: BenchResult) -> dict[str, Any]:
    out = asdict(result)
    out["config"] = {k: v for k, v in out["config"].items() if k != "api_key"}
    if math.isinf(result.config.request_rate):  # JSON has no inf
        out["config"]["request_rate"] = "inf"
    out["request_throughput"] = result.request_throughput
    out["output_throughput"] = result.output_throughput
    out["total_throughput"] = result.total_throughput
    return out


def write_json(result: BenchResult, path: str) -> None:
    with open(path, "w") as f:
        json.dump(to_dict(result), f, indent=2)
