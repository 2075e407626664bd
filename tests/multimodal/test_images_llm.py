"""`LLM.generate` with vLLM's dict prompts and `LLM.chat` with image content parts (tiny
Qwen3.5). Oracles: transformers' greedy tokens for the dict prompt; for chat, the same
conversation given as a PIL part, a PNG data URL and a dict prompt of its rendered text (the
rendering itself is checked against transformers by tests/server/test_server_images.py)."""

from __future__ import annotations

import base64
import io

import pytest
import torch

from hyla.engine.llm import LLM
from hyla.request import InvalidRequestError, SamplingParams
from tests.engine.engine_util import one_torch_thread
from tests.mm_tiny import IMAGE_IDS, hf_inputs, random_images, save_mm_checkpoint

FAMILY = "qwen3_5"
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5_llm")
    hf = save_mm_checkpoint(FAMILY, path)
    with one_torch_thread():
        yield hf, LLM(str(path), device="cpu", max_model_len=256, block_size=8)


def test_generate_dict_prompt_matches_transformers(llm):
    hf, model = llm
    image_id, start, end = IMAGE_IDS[FAMILY]
    image = random_images([(12, 20)], seed=4)[0]
    ids = [5, 6, start, image_id, end, 7]
    with one_torch_thread():
        out = model.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": image}},
                             PARAMS)[0]  # fmt: skip
    inputs = hf_inputs(FAMILY, [image])
    rows = int(inputs["image_grid_thw"].prod()) // 4
    full = [t for i in ids for t in ([image_id] * rows if i == image_id else [i])]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([full]), max_new_tokens=6, do_sample=False, pad_token_id=0,
            eos_token_id=None, pixel_values=inputs["pixel_values"],
            image_grid_thw=inputs["image_grid_thw"],
            mm_token_type_ids=torch.tensor([[int(t == image_id) for t in full]]),
        )[0, len(full) :].tolist()  # fmt: skip
    assert out.outputs[0].token_ids == ref


def test_chat_with_image_parts(llm):
    _, model = llm
    image = random_images([(16, 16)], seed=5)[0]
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    text = {"type": "text", "text": "hello world"}
    parts = [
        [{"type": "image_pil", "image_pil": image}, text],
        [{"type": "image_url", "image_url": {"url": url}}, text],
    ]
    with one_torch_thread():
        outs = [model.chat([{"role": "user", "content": p}], PARAMS)[0] for p in parts]
        both = model.chat([[{"role": "user", "content": p}] for p in parts], PARAMS)
        marker = "<|vision_start|><|image_pad|><|vision_end|>"
        plain = model.generate({"prompt": f"User: {marker}hello world\nAssistant:",
                                "multi_modal_data": {"image": image}}, PARAMS)[0]  # fmt: skip
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    assert [o.outputs[0].token_ids for o in both] == [o.outputs[0].token_ids for o in outs]
    assert outs[0].outputs[0].token_ids == plain.outputs[0].token_ids
    assert outs[0].prompt_token_ids == plain.prompt_token_ids
    with pytest.raises(InvalidRequestError, match=r"messages\[0\].content\[0\].image_url"):
        remote = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
        model.chat([{"role": "user", "content": [remote]}])
    assert model.engine.get_stats().encoder_cache_entries == 0
