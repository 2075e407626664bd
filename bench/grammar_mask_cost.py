"""Per-step token-mask cost of the two grammar engines from the field, on the CPU: xgrammar vs
llguidance, same tokenizer (the embedded model's, or `--tokenizer DIR`), same JSON schema, same
token sequence (a valid answer, tokenized), mask filled before each token is accepted.

    PYTHONPATH=$PWD python3 bench/grammar_mask_cost.py
(writes bench/results/grammar_mask_cost_cpu.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from throughput import git_commit, hardware  # noqa: E402

from hyla.assets import default_model_path  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "tags", "address"],
}
ANSWER = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines", "poetry"],
          "address": {"city": "London", "zip": "W1"}}


def xgrammar_steps(tokenizer, vocab: int, ids: list[int]) -> list[float]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA),
                                                             any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        times.append(time.perf_counter() - start)
        assert matcher.accept_token(t), t
    return times


def llguidance_steps(tokenizer, vocab: int, ids: list[int]) -> list[float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(SCHEMA), defaults={"whitespace_flexible": False, "item_separator": ", ",
                                     "key_separator": ": "})
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    bitmask = lt.allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        start = time.perf_counter()
        lt.fill_next_token_bitmask(matcher, bitmask, 0)
        times.append(time.perf_counter() - start)
        assert matcher.consume_token(t), (t, matcher.get_error())
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", default=str(default_model_path()))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=str(ROOT / "bench/results/grammar_mask_cost_cpu.json"))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = len(tokenizer)
    ids = tokenizer(json.dumps(ANSWER, separators=(", ", ": ")))["input_ids"]
    results = {}
    for name, fn in (("xgrammar", xgrammar_steps), ("llguidance", llguidance_steps)):
        per_step = [statistics.median(fn(tokenizer, vocab, ids)) for _ in range(args.repeats)]
        results[name] = {"median_us_per_step": 1e6 * statistics.median(per_step)}
        print(f"{name}: {results[name]['median_us_per_step']:.1f} us per mask")
    out = {"command": "python3 bench/grammar_mask_cost.py " + " ".join(sys.argv[1:]),
           "commit": git_commit(), "hardware": hardware(), "vocab_size": vocab,
           "num_tokens": len(ids), "results": results,
           "ratio_llguidance_over_xgrammar": results["llguidance"]["median_us_per_step"]
           / results["xgrammar"]["median_us_per_step"]}
    if not args.no_save:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
