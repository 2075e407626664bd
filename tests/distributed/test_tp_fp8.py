"""fp8 weights under tensor and expert parallelism on the CPU (gloo): a block-scaled fp8
checkpoint is sharded as stored, each block scale with its block.

Oracle: the same fp8 checkpoint (tiny DeepSeek-V3.2 of `tests.hf_tiny`, its 2-D projections
block-quantized by `tests.models.test_fp8_checkpoint`'s own quantizer, 8x8 blocks so a rank's
slice is whole blocks) served by the plain engine (TP=1) in the same test, same scripted
scenario (`tp_util.run_scenario`). Greedy tokens identical and every step's sampled logits within
1e-5: the ranks hold exactly the stored fp8 values and scales (a re-quantized slice would move
logits by ~1e-3). A block size that a rank's slice would cut is refused before any weight loads.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from hyla.config import ConfigError
from hyla.engine.llm_engine import LLMEngine
from hyla.layers.fp8_experts import Fp8Experts
from hyla.layers.linear import Fp8Linear
from hyla.layers.parallel import Fp8ExpertParallelExperts
from tests.distributed.tp_util import OPTIONS, engine, run_scenario
from tests.hf_tiny import save_tiny_hf_model
from tests.models.test_fp8_checkpoint import _quantized, block_quantize

LOGIT_ATOL = 1e-5


def _save_fp8(path, block) -> None:
    float_dir = path.parent / f"{path.name}_float"
    save_tiny_hf_model("deepseek_v32", float_dir, seed=5)
    tensors = {}
    for name, t in load_file(float_dir / "model.safetensors").items():
        if _quantized(name, t):
            tensors[name], tensors[name + "_scale_inv"] = block_quantize(t, *block)
        else:
            tensors[name] = t
    path.mkdir()
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "fmt": "e4m3", "weight_block_size": list(block)}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, path / "model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8_tp") / "fp8"
    _save_fp8(path, (8, 8))
    plain = engine(path)
    assert any(isinstance(m, Fp8Linear) for m in plain.model.modules())
    return path, run_scenario(plain)


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_fp8_checkpoint_tp2_matches_tp1(reference, ep):
    path, ref = reference
    eng = engine(path, tensor_parallel_size=2, enable_expert_parallel=ep)
    try:
        kinds = {type(m) for m in eng.model.modules()}
        assert Fp8Linear in kinds
        assert (Fp8ExpertParallelExperts if ep else Fp8Experts) in kinds
        got = run_scenario(eng)
    finally:
        eng.shutdown()
    assert got.tokens == ref.tokens and all(len(ref.tokens[r]) == 32 for r in "abce")
    diff = max((a - b).abs().max().item() for a, b in zip(ref.logits, got.logits, strict=True))
    assert diff <= LOGIT_ATOL


def test_blocks_a_rank_would_cut_are_refused_before_loading(tmp_path):
    """32-row blocks: TP2 gives each rank 48 of the 96 q rows (4 heads x 24), 1.5 blocks."""
    path = tmp_path / "fp8"
    _save_fp8(path, (32, 32))
    with pytest.raises(ConfigError, match="weight_block_size"):
        LLMEngine.from_path(str(path), **{**OPTIONS, "tensor_parallel_size": 2})
