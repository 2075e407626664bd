"""Evaluate a default-model checkpoint: held-out bits per byte, retrieval at 1x/4x/16x the training
length, and greedy completions of held-out stdlib functions.

    python3 scripts/eval_default_model.py [--model DIR] [--backend runner|batch] [--device cpu]

The checkpoint is read with hyla's loader (`hyla.models.loader.load_model`) and run in float32.
`--backend runner` uses hyla's inference path (SequenceRunner); `batch` the training forward
(fast on a GPU). Writes a JSON report to `--out` and prints it.
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from hyla.assets import default_model_path
from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from hyla.training.corpus import load_split
from hyla.training.evaluation import (
    digit_start_mask,
    heldout_bpb,
    retrieval_accuracy,
    retrieval_cases,
)
from hyla.training.metrics import token_byte_lengths
from hyla.training.stdlib_data import split_of, stdlib_root

# Held-out modules (split_of(module) == "heldout"): never seen by the tokenizer or the model.
COMPLETIONS = (("secrets", "token_hex"), ("tty", "setraw"), ("plistlib", "_count_to_size"))


def function_prompt(module: str, name: str, context: str = "module") -> tuple[str, str]:
    """(source up to the first body statement of `name` after its docstring, the real body).

    `context` "module" keeps the module's source before the function; "function" starts the
    prompt at the `def` line."""
    if split_of(module) != "heldout":
        raise ValueError(f"{module} is not a held-out module")
    source = (stdlib_root() / (module.replace(".", "/") + ".py")).read_text()
    lines = source.splitlines(keepends=True)
    node = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name
    )
    body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
    first, last = body[0].lineno - 1, node.end_lineno
    begin = 0 if context == "module" else node.lineno - 1
    return "".join(lines[begin:first]), "".join(lines[first:last])


@torch.no_grad()
def greedy(model, prompt_ids: list[int], max_new: int) -> list[int]:
    runner = SequenceRunner(model, 1, len(prompt_ids) + max_new + 1, poison=False)
    logits = runner.step({0: prompt_ids})[0]
    out: list[int] = []
    for _ in range(max_new):
        out.append(int(logits.argmax()))
        logits = runner.step({0: out[-1:]})[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--data", default="data/default_model")
    parser.add_argument("--backend", choices=("runner", "batch"), default="runner")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--train-len", type=int, default=1024)
    parser.add_argument("--multiples", default="1,4,16")
    parser.add_argument("--prompts", default="50,50,50", help="cases per multiple")
    parser.add_argument("--heldout-windows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--completions", type=int, default=64, help="new tokens (0: skip)")
    parser.add_argument("--completion-context", choices=("module", "function"), default="module")
    parser.add_argument("--out", default="runs/eval.json")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    eos_id = tok.token_to_id("<|endoftext|>")
    t0 = time.time()
    model = load_model(args.model, dtype="float32", device=args.device, progress=False)
    report: dict = {"model": args.model, "backend": args.backend, "load_s": time.time() - t0}
    tokens, docs = load_split(Path(args.data), "heldout")
    t0 = time.time()
    byte_lengths = token_byte_lengths(Path(args.model) / "tokenizer.json")
    if args.heldout_windows:
        size = args.train_len + 1
        n = len(tokens) // size
        picks = np.linspace(0, n - 1, min(args.heldout_windows, n)).astype(int)
        windows = torch.from_numpy(np.stack([tokens[i * size : (i + 1) * size] for i in picks]))
        report["heldout_bpb"] = heldout_bpb(model, windows.long(), byte_lengths, args.backend)
        report["heldout_windows"] = len(picks)
        report["heldout_s"] = time.time() - t0
    digit_start = digit_start_mask(tok)
    multiples = [m for m in args.multiples.split(",") if m]
    for mult, count in zip(multiples, args.prompts.split(","), strict=False):
        length = int(mult) * args.train_len
        cases = retrieval_cases(tok, tokens, docs, eos_id, length, int(count), args.seed)
        t0 = time.time()
        acc = retrieval_accuracy(model, cases, digit_start, args.backend)
        report[f"retrieval_{mult}x"] = {
            "length": length,
            "prompts": int(count),
            "accuracy": acc,
            "seconds": round(time.time() - t0, 1),
        }
        print(json.dumps(report[f"retrieval_{mult}x"]), flush=True)
    if args.completions:
        report["completions"] = []
        for module, name in COMPLETIONS:
            prompt, body = function_prompt(module, name, args.completion_context)
            new = greedy(model, tok.encode(prompt).ids, args.completions)
            report["completions"].append(
                {
                    "function": f"{module}.{name}",
                    "prompt_tail": prompt[-300:],
                    "completion": tok.decode(new),
                    "reference": body,
                }
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
