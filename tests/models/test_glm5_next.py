"""GLM-5.3-Flash (`glm5_next`) text model: hyla vs transformers, and hyla's own invariants.

Oracle: transformers' `Glm5NextForConditionalGeneration` (fp32, eager) with the same random
weights (`tests.glm_tiny`: every text path runs in a short prompt: pools of 4 with top-8 and the
tail, a shared indexer layer, 3 hyper-connection streams, a clamp that bites); hyla loads the
saved checkpoint (the released tensor layout) through its loader and runs its paged cache with
shuffled blocks and NaN-poisoned caches (`SequenceRunner`). Tolerance: prefill logits max abs
error <= 1e-4 (fp32); 32 greedy steps identical to `generate`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from tests.glm_tiny import save_tiny_glm
from tests.models.parity import (
    assert_chunked_equals_whole,
    assert_greedy_matches_generate,
    assert_prefill_matches,
)

PROMPT_LENS = (1, 3, 4, 5, 9, 40, 67)
LOGIT_ATOL = 1e-4
NUM_GREEDY = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm5_next")
    torch.set_num_threads(1)
    hf = save_tiny_glm(path, seed=0)
    hf.name_or_path = str(path)
    return hf, load_model(path, dtype="float32")


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_config_maps_every_glm_feature(pair):
    _, model = pair
    cfg = model.config
    assert cfg.layer_pattern == ("kda", "dsa", "dsa", "kda", "dsa")
    assert cfg.dsa.index_kpool == 4 and cfg.dsa.indexer_types[2] == "shared"
    assert cfg.hc_mult == 3 and cfg.swiglu_limit == 0.5
    assert cfg.linear.gate_lower_bound == -5.0
    assert model.layers[2].mixer.indexer is None  # shared: no indexer weights, no index cache


def test_prefill_logits_match_transformers(pair):
    hf, model = pair
    prompts = _prompts(model.config.vocab_size)
    assert_prefill_matches(hf, model, prompts, LOGIT_ATOL, "glm5_next", max_len=128, block_size=8)


def test_greedy_decode_matches_transformers_generate(pair):
    hf, model = pair
    prompts = [p for p in _prompts(model.config.vocab_size) if len(p) in (1, 5, 40)]
    assert_greedy_matches_generate(
        hf, model, prompts, NUM_GREEDY, "glm5_next", stop_at_eos=False, max_len=128, block_size=8
    )


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 16])
def test_chunked_prefill_equals_one_prefill(pair, chunk):
    """I1 split: pools completed across chunk boundaries are compressed from cached keys."""
    _, model = pair
    assert_chunked_equals_whole(model, _prompts(model.config.vocab_size)[-1], chunk)  # 67 tokens


@torch.no_grad()
def test_flat_text_only_checkpoint_loads_the_same_model(pair, tmp_path):
    """A text-only release: text fields at the top level of config.json, tensors under
    `model.` (no `language_model.`, no vision tower), a spare MTP layer to skip."""
    import json

    from safetensors.torch import load_file, save_file

    hf, model = pair
    src = Path(hf.name_or_path)
    path = tmp_path / "flat"
    path.mkdir()
    full = json.loads((src / "config.json").read_text())
    flat = dict(full["text_config"], model_type="glm5_next", architectures=full["architectures"])
    (path / "config.json").write_text(json.dumps(flat))
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        if not name.startswith("model.visual."):
            tensors[name.replace("model.language_model.", "model.")] = t
    tensors["model.layers.5.input_layernorm.weight"] = torch.ones(64)  # MTP: skipped
    save_file(tensors, path / "model.safetensors")
    flat_model = load_model(path, dtype="float32")
    ids = _prompts(model.config.vocab_size)[-2]
    want = SequenceRunner(model, 1, 128).step({0: ids}, all_logits=True)[0]
    got = SequenceRunner(flat_model, 1, 128).step({0: ids}, all_logits=True)[0]
    assert torch.equal(got, want)


def test_config_errors_name_the_field():
    from hyla.config import ConfigError
    from hyla.models.registry import config_from_hf
    from tests.glm_tiny import tiny_glm_text_config

    base = dict(tiny_glm_text_config(), model_type="glm5_next")
    for field, value, match in [
        ("qk_rope_head_dim", 8, "qk_rope_head_dim"),
        ("linear_lower_bound", None, "linear_lower_bound"),
        ("index_topk", 10, "index_topk"),
        ("indexer_types", ["full", "shared", "full", "full", "full"], "indexer_types"),
        ("layer_types", ["linear_attention"] * 4, "layer_types"),
    ]:
        with pytest.raises(ConfigError, match=match):
            config_from_hf(dict(base, **{field: value}))
