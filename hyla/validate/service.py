"""Check (d): the service contract against `--url` or a `hyla serve` started here. A greedy run
cut by its short `--request-timeout` is retried (reference) or must be a prefix (compared)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hyla.validate.result import FAIL, PASS, SKIP, CheckResult
from hyla.validate.service_client import Client, start_server, stop_server

TIMEOUT_S = 4.0
PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
LONG_PROMPT = "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu. " * 20
GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
REFERENCE_ATTEMPTS = 3


def _greedy(c: Client, prompt: str) -> tuple[str, str | None]:
    choice = c.complete({"prompt": prompt, **GREEDY})["choices"][0]
    return choice["text"], choice["finish_reason"]


def _reference(c: Client, prompt: str, attempts: int = REFERENCE_ATTEMPTS) -> tuple[str, str]:
    """A greedy run to compare others with, retried while the request timeout cuts it."""
    for _ in range(attempts):
        text, reason = _greedy(c, prompt)
        if reason != "timeout":
            break
    return text, reason


def _agree(ref: tuple[str, str | None], got: tuple[str, str | None]) -> bool:
    """Equal texts, or where the timeout cut one, a prefix of the other."""
    if ref[1] != "timeout" and got[1] != "timeout":
        return got[0] == ref[0]
    short, long = sorted((ref[0], got[0]), key=len)
    return long.startswith(short)


def _cut(*runs: tuple[str, str | None]) -> str:
    num_cut = sum(reason == "timeout" for _, reason in runs)
    return f" ({num_cut} cut by the request timeout: compared as prefixes)" if num_cut else ""


def _stream(c: Client) -> tuple[str, str]:
    solo = _reference(c, PROMPT)
    streamed = c.stream_text({"prompt": PROMPT, **GREEDY})
    if not _agree(solo, streamed):
        return FAIL, f"{streamed[0]!r} != {solo[0]!r}"
    return PASS, "equal" + _cut(solo, streamed)


def _concurrent(c: Client, n: int = 4) -> tuple[str, str]:
    solo = _reference(c, PROMPT)
    with ThreadPoolExecutor(n) as pool:
        runs = list(pool.map(lambda _: _greedy(c, PROMPT), range(n)))
    bad = [i for i, run in enumerate(runs) if not _agree(solo, run)]
    if bad:
        return FAIL, f"requests {bad} differ from solo: {[runs[i][0] for i in bad]} != {solo[0]!r}"
    return PASS, f"{n} equal" + _cut(solo, *runs)


def _idle(m: dict[str, float]) -> tuple[float, float, float]:
    return (m.get("hyla_num_requests_running", -1), m.get("hyla_cache_blocks_free", -1),
            m.get("hyla_state_slots_free", -1))  # fmt: skip


def _cancel(c: Client) -> tuple[str, str]:
    before = c.metrics()
    if before is None:
        return SKIP, "needs hyla's /metrics (hyla_num_requests_running, blocks, slots)"
    body = {"model": c.model, "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True,
            "temperature": 0.0, "stream": True}  # fmt: skip
    with c.http.stream("POST", f"{c.root}/v1/completions", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 4:
                break  # leave mid-stream: the connection closes here
    deadline, now = time.monotonic() + 15, None
    while time.monotonic() < deadline:
        now = _idle(c.metrics() or {})
        if now == (0.0, *_idle(before)[1:]):
            return PASS, f"running 0, blocks free {now[1]:.0f}, slots free {now[2]:.0f}"
        time.sleep(0.2)
    return FAIL, f"after cancel (running, blocks free, slots free) = {now}, idle {_idle(before)}"


def _timeout(c: Client, max_tokens: int | None) -> tuple[str, str]:
    if max_tokens is None:
        return SKIP, "needs the server's --request-timeout (only on a server started here)"
    r = c.complete({"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
                    "temperature": 0.0})  # fmt: skip
    reason = r["choices"][0]["finish_reason"]
    return (PASS, "timeout") if reason == "timeout" else (FAIL, f"finish_reason {reason!r}")


def _burst_one(c: Client) -> tuple[int, str | None]:
    r = c.post({"prompt": PROMPT, "max_tokens": 64, "ignore_eos": True, "temperature": 0.0})
    return r.status_code, r.headers.get("retry-after")


def _retry_503(c: Client, burst: int = 24) -> tuple[str, str]:
    with ThreadPoolExecutor(burst) as pool:
        answers = list(pool.map(lambda _: _burst_one(c), range(burst)))
    refused = [a for a in answers if a[0] == 503]
    if not refused:
        return SKIP, f"no 503 in a burst of {burst} (the queue never filled)"
    if any(h is None for _, h in refused):
        return FAIL, "503 without Retry-After"
    for _ in range(20):
        time.sleep(min(float(refused[0][1]), 2.0))
        status, _ = _burst_one(c)
        if status == 200:
            return PASS, f"{len(refused)} of {burst} got 503 + Retry-After; retry succeeded"
    return FAIL, "retries after Retry-After kept failing"


def _prefix(c: Client) -> tuple[str, str]:
    before = c.metrics()
    cold = _greedy(c, LONG_PROMPT)  # not retried: a second run would be a prefix hit
    warm = _greedy(c, LONG_PROMPT)
    if not _agree(cold, warm):
        return FAIL, f"cached {warm[0]!r} != cold {cold[0]!r}"
    if before is None:
        return PASS, "equal (hit not confirmed: no hyla /metrics)" + _cut(cold, warm)
    key = "hyla_prefix_cache_hit_tokens_total"
    hits = (c.metrics() or {}).get(key, 0) - before.get(key, 0)
    if hits <= 0:
        return FAIL, "no prefix hit"
    return PASS, f"equal, {hits:.0f} tokens hit" + _cut(cold, warm)


BAD_INPUTS = {
    "temperature -1": {"prompt": "hi", "temperature": -1},
    "max_tokens 0": {"prompt": "hi", "max_tokens": 0},
    "no prompt": {"max_tokens": 4},
    "prompt over max_model_len": {"prompt": "hi " * 200000, "max_tokens": 4},
    "n 0": {"prompt": "hi", "n": 0},
    "top_p 2": {"prompt": "hi", "top_p": 2.0},
}


def _bad_inputs(c: Client) -> tuple[str, str]:
    codes = {name: c.post(body).status_code for name, body in BAD_INPUTS.items()}
    bad = {k: v for k, v in codes.items() if not 400 <= v < 500}
    return (PASS, "all 4xx") if not bad else (FAIL, f"not 4xx: {bad}")


def _subchecks(c: Client, long_tokens: int | None) -> dict[str, Any]:
    return {"stream": lambda: _stream(c), "concurrent": lambda: _concurrent(c),
            "cancel": lambda: _cancel(c), "prefix": lambda: _prefix(c),
            "bad_inputs": lambda: _bad_inputs(c), "timeout": lambda: _timeout(c, long_tokens),
            "retry_503": lambda: _retry_503(c)}  # fmt: skip


def serve_args(options: dict[str, Any]) -> list[str]:
    """`hyla serve` flags of engine options by field name (`--no-<flag>` for a false bool)."""
    args: list[str] = []
    for key, value in options.items():
        flag = key.replace("_", "-")
        if isinstance(value, bool):
            args.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            args += [f"--{flag}", str(value)]
    return args


def run_service(ctx: Any, progress: Any) -> CheckResult:
    result = CheckResult("service", "Service contract")
    proc, long_tokens = None, None
    if ctx.url is None:
        from hyla.models.loader import load_config

        limit = ctx.engine_options.get("max_model_len") or load_config(ctx.model).max_context_len
        long_tokens = min(4000, limit - 200)
        options = {"request_timeout": TIMEOUT_S, "max_queue_len": 4, "max_num_seqs": 4,
                   **ctx.engine_options, "device": ctx.device, "dtype": ctx.dtype}  # fmt: skip
        args = serve_args(options)
        try:
            proc, url = start_server(ctx.model, args, ctx.out_dir / "server.log")
        except RuntimeError as e:
            progress.update(1)
            result.fail(f"could not start hyla serve: {str(e).splitlines()[-1][:300]}")
            return result
    try:
        client = Client(ctx.url or url)
        rows = []
        for name, run in _subchecks(client, long_tokens).items():
            try:
                status, detail = run()
            except Exception as e:  # noqa: BLE001 - a broken server must not stop the report
                status, detail = FAIL, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            rows.append([name, status, detail])
            if status == FAIL:
                result.fail(f"{name}: {detail}")
    finally:
        if proc is not None:
            stop_server(proc)
    progress.update(1)
    result.tables.append(("sub-checks", ["check", "status", "detail"], rows))
    result.metrics = {r[0]: r[1] for r in rows}
    result.bound = "every sub-check passes (skipped ones say why)"
    result.reason = f"server: {ctx.url or 'hyla serve started by validate'}"
    return result
