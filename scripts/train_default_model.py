"""Train hyla's embedded default model (KDA + DSA + MoE on the Python standard library).

Steps (run from the repository root; `pip install -e .` or PYTHONPATH=.):

    python3 scripts/train_tokenizer.py                      # tokenizer.json (train split only)
    python3 scripts/train_default_model.py prepare          # tokenized splits -> data/default_model
    python3 scripts/train_default_model.py train --steps N  # on a GPU; checkpoint -> --out
    python3 scripts/train_default_model.py install --run runs/default_model

`standin` writes a random-weight model of the same architecture into the package (for wiring
tests before a trained checkpoint exists). Every random choice is seeded by `--seed`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer

from hyla.training.corpus import save_split, tokenize_split
from hyla.training.recipe import (
    build_model,
    count_parameters,
    default_model_config,
    save_checkpoint,
)
from hyla.training.trainer import TrainConfig, train

ASSETS = Path("hyla/assets/default_model")


def prepare(args: argparse.Namespace) -> None:
    tok = Tokenizer.from_file(str(args.tokenizer))
    out = Path(args.out)
    meta = {}
    for split in ("train", "heldout"):
        tokens, docs = tokenize_split(tok, split)
        save_split(out, split, tokens, docs)
        meta[split] = {
            "modules": len(docs),
            "tokens": int(len(tokens)),
            "bytes": int(sum(d[3] for d in docs)),
        }
        print(split, meta[split])
    (out / "meta.json").write_text(json.dumps(meta, indent=2))


def standin(args: argparse.Namespace) -> None:
    tok = Tokenizer.from_file(str(args.tokenizer))
    config = default_model_config(tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"))
    model = build_model(config, args.seed)
    size = save_checkpoint(model, Path(args.out))
    print(count_parameters(model), size, "bytes")


def install(args: argparse.Namespace) -> None:
    """Copy a run's config.json and model.safetensors into the package assets."""
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(Path(args.run) / name, ASSETS / name)
        (ASSETS / name).chmod(0o644)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--tokenizer", default=str(ASSETS / "tokenizer.json"))
    p.add_argument("--out", default="data/default_model")
    p = sub.add_parser("standin")
    p.add_argument("--tokenizer", default=str(ASSETS / "tokenizer.json"))
    p.add_argument("--out", default=str(ASSETS))
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("install")
    p.add_argument("--run", required=True)
    p = sub.add_parser("train")
    for f in dataclasses.fields(TrainConfig):
        kind = type(f.default)
        parse = (lambda v: v.lower() in ("1", "true", "yes")) if kind is bool else kind
        p.add_argument("--" + f.name.replace("_", "-"), type=parse, default=f.default)
    args = parser.parse_args()
    if args.cmd == "train":
        train(
            TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
        )
    else:
        {"prepare": prepare, "standin": standin, "install": install}[args.cmd](args)


if __name__ == "__main__":
    main()
