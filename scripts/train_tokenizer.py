"""Train hyla's default byte-level BPE tokenizer on the train split of the Python stdlib.

Usage:
    python3 scripts/train_tokenizer.py [--vocab-size 8192] [--out hyla/assets/default_model]

Writes `tokenizer.json` and `tokenizer_config.json` (special tokens and a chat template), loadable
with `transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)`. Held-out modules
(`hyla.training.stdlib_data.split_of(name) == "heldout"`) are never read.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hyla.training.stdlib_data import iter_modules, read_source

EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [EOS, PAD]
# Chat turns become Python comments; the assistant's turn is plain code. The model was trained on
# code only, so a request reads to it like a commented file it continues.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] }}\n"
    "{% else %}# {{ message['content'] | replace('\\n', '\\n# ') }}\n{% endif %}"
    "{% endfor %}"
)


def train_texts() -> Iterator[str]:
    for _, path in iter_modules(split="train"):
        text = read_source(path)
        if text:
            yield text


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenization, no prefix space) on the train split.

    No post-processor: encodings carry no `<|endoftext|>`. Training windows are mostly slices
    from inside the document stream, so a prompt without it reads as code to continue; with it,
    the model expects a new document, and every synthetic retrieval document starts that way
    (docs/model_card.md, "Prompt format").
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_texts(), trainer=trainer)
    return tok


def tokenizer_config(model_max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--model-max-length", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=Path("hyla/assets/default_model"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(args.vocab_size)
    tok.save(str(args.out / "tokenizer.json"))
    config = tokenizer_config(args.model_max_length)
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"vocab {tok.get_vocab_size()} -> {args.out}")


if __name__ == "__main__":
    main()
