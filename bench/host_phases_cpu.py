"""Where the host time of one large request goes, phase by phase (issue 18, host work off the
hot path): a 100k-message chat and a 500k-token-id completion, through the functions the server
calls, timed one after the other in one process (median of --reps).

    in_process    what the server process does (`from_json`: the parse `limits.raw_json`
                  does, pydantic-core's; `json_loads`: the standard library's, for comparison)
    engine        engine work on the new request: `add_request`, the block hashes of its
                  prompt (prefix caching) and the first step that schedules it (admission:
                  hashes, prefix match, in-flight announcement; plus a 256-token prefill chunk
                  of the tiny model, and a plain step for comparison)

Whether a phase holds the GIL is noted in the JSON (`gil`): pydantic-core, json, Jinja and the
id checks do; the Rust tokenizer mostly releases it (a thread ticking every 1 ms saw gaps of
at most 17 ms during a 0.8 s tokenization).

    python3 bench/host_phases_cpu.py    # writes bench/results/host_phases_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pydantic_core  # noqa: E402

from hyla.cache.prefix import extend_block_hashes  # noqa: E402
from hyla.engine.validate import prompt_token_ids  # noqa: E402
from hyla.request import RequestOutputKind, SamplingParams  # noqa: E402
from hyla.server import convert, limits  # noqa: E402
from hyla.server.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402
from tests.server.conftest import MODEL, load_tokenizer, tiny_engine  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from host_limits_cpu import run_header  # noqa: E402

MAX_MODEL_LEN = 1 << 20
GIL = {"json_loads": "yes", "from_json": "yes", "pydantic": "yes", "render": "yes (Jinja, Python)",
       "tokenize": "mostly released (Rust)", "id_check": "yes", "normalize": "yes",
       "message_dicts": "yes"}  # fmt: skip


def timed(phases: dict[str, list[float]], name: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    out = fn()
    phases.setdefault(name, []).append((time.perf_counter() - start) * 1e3)
    return out


def chat_phases(tok: Any, vocab: int, body: bytes, t: dict) -> None:
    timed(t, "in_process.json_loads", lambda: json.loads(body))
    data = timed(t, "in_process.from_json", lambda: pydantic_core.from_json(body))
    timed(t, "in_process.size_gate", lambda: limits.check_chat_sizes(data, MAX_MODEL_LEN))
    req = timed(t, "in_process.pydantic", lambda: ChatCompletionRequest.model_validate(data))
    messages = list(enumerate(req.messages))
    conv = timed(t, "in_process.message_dicts",
                 lambda: [convert._message_dict(i, m) for i, m in messages])  # fmt: skip
    text = timed(t, "in_process.render", lambda: convert._render(tok, conv, req))
    ids = timed(t, "in_process.tokenize",
                lambda: tok(text, add_special_tokens=False)["input_ids"])  # fmt: skip
    timed(t, "in_process.id_check", lambda: prompt_token_ids(ids, None, vocab))


def ids_phases(vocab: int, body: bytes, t: dict) -> None:
    timed(t, "in_process.json_loads", lambda: json.loads(body))
    data = timed(t, "in_process.from_json", lambda: pydantic_core.from_json(body))
    timed(t, "in_process.size_gate", lambda: limits.check_completion_sizes(data, MAX_MODEL_LEN))
    req = timed(t, "in_process.pydantic", lambda: CompletionRequest.model_validate(data))
    prompts = timed(t, "in_process.normalize", lambda: convert.normalize_prompts(req.prompt))
    timed(t, "in_process.id_check", lambda: prompt_token_ids(prompts[0], None, vocab))


def engine_phases(engine: Any, ids: list[int], t: dict, rep: int) -> None:
    """`first_step_with_it`: the step that admits the request, hashing its blocks."""
    params = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.DELTA)
    block = engine.cache.block_size
    checked = prompt_token_ids(ids, None, engine.model_config.vocab_size)
    timed(t, "engine.block_hashes", lambda c=checked: extend_block_hashes([], c, block))
    timed(t, "engine.plain_step", engine.step)
    rid = f"big-{rep}"
    timed(t, "engine.add_request", lambda r=rid, c=checked: engine.add_request(r, c, params))
    timed(t, "engine.first_step_with_it", engine.step)
    engine.abort_request(rid)
    engine.step()


def measure(reps: int) -> dict:
    tok = load_tokenizer()
    vocab = len(tok)
    engine = tiny_engine(tok, max_model_len=MAX_MODEL_LEN, kv_cache_memory=420 << 20,
                         max_num_batched_tokens=256)  # fmt: skip
    running = SamplingParams(max_tokens=1 << 19, ignore_eos=True,
                             output_kind=RequestOutputKind.DELTA)  # fmt: skip
    engine.add_request("running", [5] * 16, running)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}] * 100_000}
    chat_body = json.dumps(chat).encode()
    ids_body = json.dumps({"model": MODEL, "prompt": [5] * 500_000}).encode()
    out: dict = {"chat_100k_messages": {}, "token_ids_500k": {}}
    for rep in range(reps):
        chat_phases(tok, vocab, chat_body, out["chat_100k_messages"])
        ids_phases(vocab, ids_body, out["token_ids_500k"])
        engine_phases(engine, [5] * 400_000, out["chat_100k_messages"], rep)
        engine_phases(engine, [5] * 500_000, out["token_ids_500k"], rep)
    return {
        name: {phase: float(np.median(ms)) for phase, ms in phases.items()}
        for name, phases in out.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    report = {
        **run_header(),
        "unit": "ms, median over reps",
        "gil": GIL,
        **measure(args.reps),
    }
    print(json.dumps(report, indent=1))
    if not args.no_save:
        out = ROOT / "bench" / "results" / "host_phases_cpu.json"
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
