"""Request checks that need the model's limits; each raises `InvalidRequestError` naming the
field, before anything is allocated."""

from __future__ import annotations

from typing import Any

import numpy as np

from hyla.request import InvalidRequestError, SamplingParams


class TokenIds(list):
    """Token ids checked against `vocab_size`, with the chained `block_hashes` of their full
    blocks when set: both done off the engine thread, which does not redo them."""

    vocab_size: int = 0
    block_size: int = 0
    block_hashes: list[int] | None = None


def prompt_token_ids(prompt: Any, tokenizer: Any, vocab_size: int) -> TokenIds:
    """Checked token ids of `prompt` (text or ids); raises InvalidRequestError("prompt")."""
    if isinstance(prompt, TokenIds) and prompt.vocab_size == vocab_size:
        return prompt
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt", "must not be empty")
        if tokenizer is None:
            raise InvalidRequestError("prompt", "text needs a tokenizer; pass token ids")
        try:
            ids = list(tokenizer.encode(prompt))
        except (TypeError, ValueError, UnicodeError) as e:  # e.g. lone surrogates
            raise InvalidRequestError("prompt", f"text cannot be tokenized: {e}") from e
    elif isinstance(prompt, (list, tuple)):
        ids = prompt
    else:
        raise InvalidRequestError("prompt", f"expected str or list[int], got {type(prompt)}")
    if not ids:
        raise InvalidRequestError("prompt", "must not be empty")
    _check_ids(ids, vocab_size)
    out = TokenIds(ids)
    out.vocab_size = vocab_size
    return out


def _check_ids(ids: list[Any], vocab_size: int) -> None:
    if set(map(type, ids)) != {int}:
        bad = next(t for t in ids if type(t) is not int)
        if not isinstance(bad, int) or isinstance(bad, bool):
            raise InvalidRequestError("prompt", f"token ids must be integers, got {bad!r}")
    try:
        arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
    except OverflowError:
        raise InvalidRequestError("prompt", f"token ids must be in [0, {vocab_size})") from None
    outside = (arr < 0) | (arr >= vocab_size)
    if outside.any():
        bad = int(arr[outside.argmax()])
        raise InvalidRequestError("prompt", f"token id {bad} not in [0, {vocab_size})")


def validate_lengths(num_prompt_tokens: int, params: SamplingParams, max_model_len: int) -> None:
    if num_prompt_tokens >= max_model_len:
        raise InvalidRequestError(
            "prompt",
            f"prompt has {num_prompt_tokens} tokens but the context window is {max_model_len} "
            "tokens (at least one must remain for the output)",
        )
    mt = params.max_tokens
    if mt is not None and num_prompt_tokens + mt > max_model_len:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({mt}) = "
            f"{num_prompt_tokens + mt} exceeds the context window of {max_model_len} tokens",
        )
    check_prompt_logprobs_cost(num_prompt_tokens, params)


# Counted as they reach the client (each of n sequences echoes them): a huge body stalls the engine.
MAX_PROMPT_LOGPROBS = 1 << 18


def check_prompt_logprobs_cost(num_prompt_tokens: int, params: SamplingParams) -> None:
    k = params.prompt_logprobs
    if k is None:
        return
    n = params.n
    cost = n * num_prompt_tokens * (k + 1)
    if cost > MAX_PROMPT_LOGPROBS:
        raise InvalidRequestError(
            "n" if n > 1 else "prompt_logprobs",
            f"n ({n}) x prompt ({num_prompt_tokens} tokens) x (prompt logprobs {k} + the "
            f"prompt's own token) = {cost} log-probabilities, over the limit of "
            f"{MAX_PROMPT_LOGPROBS} per request: lower n or logprobs, or leave echo off",
        )
