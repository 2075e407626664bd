"""xgrammar behind a small interface: compile a request's constraint, one matcher per sequence."""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from hyla.structured.params import StructuredOutputsError, StructuredOutputsParams

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the rest is the reason.
_LOCATION = re.compile(r"^\s*\[[^\]]*\]\s*\S+:\d+:\s*")


def _reason(error: Exception) -> str:
    return _LOCATION.sub("", str(error)).strip().splitlines()[0][:300]


def build_grammar(params: StructuredOutputsParams) -> Any:
    """The xgrammar `Grammar` of `params` (no tokenizer: the server checks requests with it).
    Raises StructuredOutputsError naming `params.field`."""
    import xgrammar as xgr

    try:
        if params.json is not None:  # compact separators: no run of whitespace to loop in
            return _no_raw_controls(xgr.Grammar.from_json_schema(
                params.schema_text, any_whitespace=False, strict_mode=params.strict))
        if params.json_object:
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False,
                                                strict_mode=False)
        if params.regex is not None:
            return xgr.Grammar.from_regex(params.regex)
        alternatives = " | ".join(json.dumps(c) for c in params.choice or ())
        return xgr.Grammar.from_ebnf(f"root ::= {alternatives}")
    except (RuntimeError, ValueError, TypeError) as e:
        raise StructuredOutputsError(params.field, f"invalid: {_reason(e)}") from e


# xgrammar (0.2.9) lets a length-bounded string hold raw control characters, which RFC 8259
# forbids (json.loads rejects them; seen on the H200): it excludes only quote, \, CR and LF.
_BOUNDED_CHAR = r'[^\"\\\r\n]'
_JSON_CHAR = r'[^\0-\x1f\"\\]'


def _no_raw_controls(grammar: Any) -> Any:
    import xgrammar as xgr

    text = str(grammar)
    if _BOUNDED_CHAR not in text:
        return grammar
    return xgr.Grammar.from_ebnf(text.replace(_BOUNDED_CHAR, _JSON_CHAR))


class GrammarBackend:
    """Compiles constraints for one tokenizer; `vocab_size`: logit columns (may exceed the
    tokenizer's); a finished grammar allows only `stop_token_ids`."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None
        )
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(info)

    def matcher(self, params: StructuredOutputsParams) -> GrammarState:
        """A fresh matcher of `params`' grammar. Raises StructuredOutputsError."""
        import xgrammar as xgr

        grammar = build_grammar(params)
        try:
            compiled = self.compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError) as e:
            raise StructuredOutputsError(params.field, f"invalid: {_reason(e)}") from e
        return GrammarState(xgr.GrammarMatcher(compiled))

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """[num_rows, ceil(V / 32)] int32 on the host, every token allowed."""
        return torch.full((num_rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)


class GrammarState:
    """One sequence's position in its grammar, advanced by each accepted token."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        """Advance by `token_id`; False when the grammar does not allow it (state unchanged)."""
        return bool(self._matcher.accept_token(token_id))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (all of them once terminated: the
        row's token is dropped then, as the sequence has ended)."""
        if self._matcher.is_terminated():
            bitmask[row].fill_(-1)
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)
