"""Structured output: grammar overhead on TPOT (constrained vs unconstrained decode, batch 16,
same engine, same run) and the validity of schema-constrained answers.

    overhead   16 requests decode together; the `--steps` decode steps after every request has
               its first token are timed, all 16 rows running (none may finish in the window:
               the schema asks for a long array, EOS is ignored unconstrained). Modes alternate
               `--repeats` times; the figure is median constrained TPOT / median unconstrained
               TPOT - 1 (goal: <= 10%).
    validity   `--validity` schema-constrained requests (sampled, temperature 1, seeds and
               prompts varied): how many answers are not valid JSON of the schema (goal: 0)
               and how many hit max_tokens.

    PYTHONPATH=$PWD python3 bench/structured_output.py              # CPU, embedded model
    PYTHONPATH=$PWD python3 bench/structured_output.py --device cuda --model-1p5b \\
        --out bench/results/structured_output_h200.json             # H200, ~1.5B model
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from throughput import git_commit, hardware  # noqa: E402

from hyla.assets import default_model_path  # noqa: E402
from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.request import RequestOutputKind, SamplingParams  # noqa: E402
from hyla.structured import StructuredOutputsParams  # noqa: E402

LONG = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 200, "maxItems": 200}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                            "maxItems": 4}},
    "required": ["name", "age", "email", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["def fibonacci(n):", "import os\n", "# settings for the server", "class Point:",
           "# a user record as JSON", "for i in range(10):", "x = {", "def parse(text):"]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_decode(engine: LLMEngine, constrained: bool, args: argparse.Namespace, rep: int
                 ) -> dict:
    so = StructuredOutputsParams(json=LONG) if constrained else None
    params = SamplingParams(temperature=0, max_tokens=args.steps + 8, ignore_eos=not constrained,
                            structured_outputs=so, output_kind=RequestOutputKind.DELTA)
    ids = [f"{'c' if constrained else 'u'}{rep}-{i}" for i in range(args.batch)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, PROMPTS[i % len(PROMPTS)], params)
    started: set[str] = set()
    while len(started) < len(ids):  # prefills, up to every request's first token
        for out in engine.step():
            if out.outputs and out.outputs[0].token_ids:
                started.add(out.request_id)
    sync(args.device)
    sampling = _SamplingClock(engine, constrained)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        for out in engine.step():
            assert not out.finished, "a request finished inside the timed window"
    sync(args.device)
    elapsed = time.perf_counter() - t0
    sampling.stop()
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return {"tpot_ms": 1e3 * elapsed / args.steps,
            "sampling_ms": 1e3 * sampling.seconds / args.steps}


class _SamplingClock:
    """Host seconds of the sampling part of each step: the sampler launch (unconstrained), or
    the bitmask fill + masked sampler launch (`_sample_constrained`): their difference is the
    grammar's cost alone, less noisy than two TPOTs on a shared machine. On a GPU the launch is
    asynchronous: there the TPOT ratio is the figure."""

    def __init__(self, engine: LLMEngine, constrained: bool) -> None:
        self.seconds = 0.0
        self.owner = engine if constrained else engine.sampler
        self.name = "_sample_constrained" if constrained else "launch"
        self.inner = getattr(self.owner, self.name)

        def timed(*a, **kw):
            start = time.perf_counter()
            try:
                return self.inner(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(self.owner, self.name, timed)

    def stop(self) -> None:
        delattr(self.owner, self.name)


def overhead(engine: LLMEngine, args: argparse.Namespace) -> dict:
    timed_decode(engine, True, args, -1)  # warm-up: the grammar backend and compile cache
    timed_decode(engine, False, args, -1)
    runs: dict[str, list[float]] = {"constrained": [], "unconstrained": []}
    sampling: dict[str, list[float]] = {"constrained": [], "unconstrained": []}
    for rep in range(args.repeats):
        for mode in ("unconstrained", "constrained") if rep % 2 else ("constrained",
                                                                      "unconstrained"):
            got = timed_decode(engine, mode == "constrained", args, rep)
            runs[mode].append(got["tpot_ms"])
            sampling[mode].append(got["sampling_ms"])
    c, u = statistics.median(runs["constrained"]), statistics.median(runs["unconstrained"])
    sc, su = (statistics.median(sampling[m]) for m in ("constrained", "unconstrained"))
    print(f"TPOT batch {args.batch}: constrained {c:.2f} ms, unconstrained {u:.2f} ms, "
          f"overhead {100 * (c / u - 1):.1f}%; sampling {sc:.2f} vs {su:.2f} ms per step: "
          f"grammar {100 * (sc - su) / u:.1f}% of TPOT")
    return {"batch": args.batch, "steps": args.steps, "tpot_ms": runs,
            "median_constrained_ms": c, "median_unconstrained_ms": u,
            "overhead": c / u - 1, "sampling_ms": sampling,
            "grammar_ms_per_step": sc - su, "grammar_share_of_tpot": (sc - su) / u,
            "goal": 0.10}


def validity(engine: LLMEngine, args: argparse.Namespace) -> dict:
    import jsonschema

    so = StructuredOutputsParams(json=PERSON)
    for i in range(args.validity):
        engine.add_request(f"v{i}", PROMPTS[i % len(PROMPTS)], SamplingParams(
            temperature=1.0, seed=i, max_tokens=args.validity_max_tokens, structured_outputs=so))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0]
    invalid, length = [], 0
    for rid, c in finals.items():
        length += c.finish_reason == "length"
        try:
            jsonschema.validate(json.loads(c.text), PERSON)
        except (ValueError, jsonschema.ValidationError):
            invalid.append({"id": rid, "text": c.text[:200], "finish_reason": c.finish_reason})
    print(f"validity: {len(invalid)} invalid of {len(finals)} ({length} hit max_tokens)")
    return {"num_requests": len(finals), "num_invalid": len(invalid), "num_length": length,
            "max_tokens": args.validity_max_tokens, "invalid": invalid[:5]}


def model_dir(args: argparse.Namespace, tmp: str) -> str:
    """The embedded model, or (`--model-1p5b`) bench/gpu_e2e.py's ~1.5B Kimi-Linear-shaped
    random model saved with the embedded model's tokenizer."""
    if args.model is not None:
        return args.model
    if not args.model_1p5b:
        return str(default_model_path())
    import gpu_e2e

    hf_args = gpu_e2e.parse_args(["--device", args.device])
    hf = gpu_e2e.build_hf_model(hf_args, torch.bfloat16)
    hf.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path() / name, Path(tmp) / name)
    del hf
    return tmp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default=None, help="a checkpoint directory (default: embedded)")
    p.add_argument("--model-1p5b", action="store_true")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--validity", type=int, default=200)
    p.add_argument("--validity-max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(ROOT / "bench/results/structured_output_cpu.json"))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(args, tmp)
        dtype = "float32" if args.device == "cpu" else "bfloat16"
        engine = LLMEngine.from_path(path, device=args.device, dtype=dtype,
                                     max_num_seqs=max(args.batch, 64), max_model_len=2048,
                                     enable_prefix_caching=False)
        results = {"overhead": overhead(engine, args)}
        if args.validity:
            results["validity"] = validity(engine, args)
    out = {"command": "python3 bench/structured_output.py " + " ".join(sys.argv[1:]),
           "commit": git_commit(), "hardware": hardware(), "device": args.device,
           "model": "1.5B kimi_linear-shaped (random)" if args.model_1p5b else path,
           "results": results}
    if not args.no_save:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
