"""RFC 8259 section 7: a JSON string holds no raw control character (U+0000-U+001F). xgrammar's
length-bounded strings allowed them (17 of 200 sampled answers failed json.loads on the H200);
the oracle here is the RFC itself, checked on every token the grammar allows."""

from __future__ import annotations

import pytest

from hyla.assets import default_model_path
from hyla.engine.loading import load_tokenizer
from hyla.structured import StructuredOutputsParams
from hyla.structured.backend import GrammarBackend


@pytest.mark.parametrize("bound", [{"maxLength": 16}, {"minLength": 2}, {}])
def test_no_token_with_a_raw_control_character_inside_a_string(bound):
    tok = load_tokenizer(default_model_path())
    backend = GrammarBackend(tok, len(tok), (tok.eos_token_id,))
    schema = {"type": "object", "properties": {"name": {"type": "string", **bound}},
              "required": ["name"]}
    grammar = backend.matcher(StructuredOutputsParams(json=schema))
    for t in tok.encode('{"name": "ab', add_special_tokens=False):
        assert grammar.accept(t)
    mask = backend.allocate_bitmask(1)
    grammar.fill_bitmask(mask, 0)
    words = mask[0].tolist()
    allowed = [i for i in range(len(tok)) if words[i // 32] >> (i % 32) & 1]
    assert len(allowed) > 1000  # ordinary text still allowed
    controls = [i for i in allowed if any(ord(c) < 0x20 for c in tok.decode([i]))]
    assert controls == []
