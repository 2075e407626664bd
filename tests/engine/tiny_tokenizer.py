"""Tiny tokenizers trained locally (no downloads) for detokenizer and engine tests."""

from __future__ import annotations

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello hyla: a tiny engine for hybrid models",
    "héllo wörld ça va? naïve café ünïcödé",
    "世界 你好 こんにちは 🙂 emoji and CJK text",
    "stop here. STOP there! ### end of text ###",
] * 4
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def build_tokenizer(byte_level: bool = False, vocab_size: int = 200):
    """A `PreTrainedTokenizerFast` with <pad>=0, <s>=1, </s>=2.

    byte_level: a byte-level BPE (multi-byte characters span several tokens; vocab > 256);
    else a Metaspace BPE with at most `vocab_size` ids (fits the tiny models' vocab of 256).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=SPECIALS, initial_alphabet=alphabet
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
