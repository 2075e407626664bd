"""Images through the engine (`LLMEngine.add_request(multi_modal_data=...)`), both families.

Oracles: transformers' model on the same image and prompt (fp32, eager, `generate` greedy, EOS
off; the placeholders expanded by the test from the processor's grid, not by hyla); a solo run
of the same request in an idle engine; the one-chunk run; a cold engine without prefix caching.
The engine takes the prompt with one image token per image and expands it itself.
"""

from __future__ import annotations

import pytest
import torch

from hyla.engine.llm_engine import LLMEngine
from hyla.request import InvalidRequestError, SamplingParams
from tests.engine.engine_util import assert_i4, assert_same_completion, one_torch_thread, run_all
from tests.mm_tiny import FAMILIES, IMAGE_IDS, hf_inputs, random_images, save_mm_checkpoint

NUM_NEW = 12
PARAMS = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, logprobs=2)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"{request.param}_images")
    return request.param, save_mm_checkpoint(request.param, path), path


def engine_of(path, **overrides) -> LLMEngine:
    opts = dict(device="cpu", max_model_len=512, block_size=8, max_num_batched_tokens=256,
                max_num_encoder_input_tokens=256)  # fmt: skip
    opts.update(overrides)
    return LLMEngine.from_path(str(path), **opts)


def prompt(family: str, num_images: int, text=(5, 6), tail=(7, 9, 10)) -> list[int]:
    image, start, end = IMAGE_IDS[family]
    return list(text) + [start, image, end, 11] * num_images + list(tail)


def run_one(engine, rid, ids, images, params=PARAMS):
    engine.add_request(rid, ids, params, multi_modal_data={"image": images})
    return run_all(engine)[rid]


def hf_generate(family, hf, ids, images):
    """transformers' greedy tokens and their logprobs; placeholders expanded from the grid."""
    image, _, _ = IMAGE_IDS[family]
    inputs = hf_inputs(family, images)
    counts = iter((inputs["image_grid_thw"].prod(-1) // 4).tolist())
    full = [t for i in ids for t in ([image] * next(counts) if i == image else [i])]
    kw = dict(pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"])
    if family.startswith("qwen3_5"):
        kw["mm_token_type_ids"] = torch.tensor([[int(t == image) for t in full]])
    with torch.no_grad():
        out = hf.generate(torch.tensor([full]), max_new_tokens=NUM_NEW, do_sample=False,
                          pad_token_id=0, eos_token_id=None, output_scores=True,
                          return_dict_in_generate=True, **kw)  # fmt: skip
    tokens = out.sequences[0, len(full) :].tolist()
    logprobs = [
        torch.log_softmax(s[0].float(), -1)[t].item()
        for s, t in zip(out.scores, tokens, strict=True)
    ]
    return tokens, logprobs, len(full)


@pytest.mark.parametrize("sizes", [[(20, 28)], [(1, 1), (13, 40)]], ids=["one", "two"])
def test_image_request_matches_transformers(checkpoint, sizes):
    family, hf, path = checkpoint
    images = random_images(sizes, seed=len(sizes))
    ids = prompt(family, len(sizes))
    out = run_one(engine_of(path), "a", ids, images)
    tokens, logprobs, num_prompt = hf_generate(family, hf, ids, images)
    completion = out.outputs[0]
    assert len(out.prompt_token_ids) == num_prompt  # hyla's expansion == the processor's grid
    assert completion.token_ids == tokens
    for top, token, want in zip(completion.logprobs, tokens, logprobs, strict=True):
        assert abs(top[token] - want) <= 1e-4


def test_chunked_prefill_through_the_image_equals_one_chunk(checkpoint):
    """Chunks of 5 tokens cut the image's placeholders; the image is encoded once."""
    family, _, path = checkpoint
    images = random_images([(24, 24)], seed=3)
    ids = prompt(family, 1)
    whole = run_one(engine_of(path), "w", ids, images)
    engine = engine_of(path, max_num_batched_tokens=5)
    chunked = run_one(engine, "c", ids, images)
    assert len(whole.prompt_token_ids) > 12  # the image spans several chunks
    assert_same_completion(chunked, whole)
    stats = engine.get_stats()
    assert stats.num_encoded_images == 1 and stats.encoder_cache_entries == 0
    assert_i4(engine)


def test_batch_of_image_and_text_requests_equals_solo_runs(checkpoint):
    family, _, path = checkpoint
    engine = engine_of(path, max_num_batched_tokens=24)
    jobs = {
        "img1": (prompt(family, 1), random_images([(16, 20)], seed=5)),
        "text": ([5, 6, 7, 8, 9, 10, 11, 12, 13], []),
        "img2": (prompt(family, 2, text=(30, 31, 32)), random_images([(8, 8), (12, 30)], seed=6)),
    }
    for rid, (ids, images) in jobs.items():
        engine.add_request(rid, ids, PARAMS, multi_modal_data={"image": images})
    batched = run_all(engine)
    for rid, (ids, images) in jobs.items():
        assert_same_completion(batched[rid], run_one(engine, "solo", ids, images))
    assert engine.get_stats().encoder_cache_entries == 0
    assert_i4(engine)


def test_prefix_cache_same_image_hits_different_image_misses(checkpoint):
    """Blocks of 8, checkpoints every 8: the same prompt and image reuses all but the last
    block; the same token ids with another image reuse only the text block before it."""
    family, _, path = checkpoint
    ids = prompt(family, 1, text=tuple(range(20, 30)), tail=tuple(range(40, 52)))
    first, same, other = (random_images([(16, 16)], seed=s)[0] for s in (7, 7, 8))
    engine = engine_of(path, state_checkpoint_stride=8)
    a = run_one(engine, "a", ids, [first])
    b = run_one(engine, "b", ids, [same])
    c = run_one(engine, "c", ids, [other])
    num_prompt = len(a.prompt_token_ids)
    assert b.num_cached_tokens == (num_prompt - 1) // 8 * 8
    assert_same_completion(b, a)
    assert c.num_cached_tokens == 8  # the image starts at token 10: block 0 is text only
    cold = engine_of(path, enable_prefix_caching=False)
    assert_same_completion(c, run_one(cold, "c", ids, [other]))
    diffs = [abs(x[t] - y[t]) for x, y in zip(a.outputs[0].logprobs, c.outputs[0].logprobs,
             strict=True) for t in x.keys() & y.keys()]  # fmt: skip
    assert max(diffs) > 1e-4  # the image matters
    assert_i4(engine)


def test_prefix_hit_ending_inside_an_image_encodes_the_rest(checkpoint):
    """Two prompts share the text and the image, then differ: the hit ends at a checkpoint
    inside the image's placeholders, so the second request encodes the image again for its
    remaining rows; its output equals a cold run's."""
    family, _, path = checkpoint
    image = random_images([(32, 32)], seed=12)
    probe = run_one(engine_of(path), "p", prompt(family, 1, text=(5,)), image)
    rows = len(probe.prompt_token_ids) - len(prompt(family, 1, text=(5,))) + 1
    num_text = 10 + (5 - (13 + rows)) % 8  # the shared prefix ends 5 tokens past a boundary
    text = tuple(range(20, 20 + num_text))
    first = prompt(family, 1, text=text, tail=(40, 41, 42))
    second = prompt(family, 1, text=text, tail=(60, 61, 62))
    engine = engine_of(path, state_checkpoint_stride=8)
    run_one(engine, "a", first, image)
    b = run_one(engine, "b", second, image)
    hit, span_end = (num_text + 3 + rows) // 8 * 8, num_text + 1 + rows
    assert num_text + 1 < hit < span_end  # inside the placeholders
    assert b.num_cached_tokens == hit
    assert engine.get_stats().num_encoded_images == 2
    assert_same_completion(b, run_one(engine_of(path, enable_prefix_caching=False), "c",
                                      second, image))  # fmt: skip
    assert_i4(engine)


def test_encoder_budget_cuts_chunks_before_an_image(checkpoint):
    """A budget of one image per step: the second image request's first chunk stops before its
    image while the text request runs beside them; the outputs equal solo runs."""
    family, _, path = checkpoint
    images = random_images([(16, 16)], seed=9) + random_images([(16, 16)], seed=10)
    ids = prompt(family, 1)
    rows = len(run_one(engine_of(path), "p", ids, images[:1]).prompt_token_ids) - len(ids) + 1
    jobs = {"i0": (ids, images[:1]), "i1": (ids, images[1:]), "t": ([5, 6, 7, 8], [])}
    probe = engine_of(path, max_num_encoder_input_tokens=rows)
    for rid, (p, imgs) in jobs.items():
        probe.add_request(rid, p, PARAMS, multi_modal_data={"image": imgs})
    first = probe.scheduler.schedule().num_scheduled_tokens
    assert first == {"i0#0": len(ids) + rows - 1, "i1#0": 3, "t#0": 4}  # i1: up to its image
    engine = engine_of(path, max_num_encoder_input_tokens=rows)
    for rid, (p, imgs) in jobs.items():
        engine.add_request(rid, p, PARAMS, multi_modal_data={"image": imgs})
    batched = run_all(engine)
    for rid, (p, imgs) in jobs.items():
        assert_same_completion(batched[rid], run_one(engine, "solo", p, imgs))
    assert_i4(engine)
    assert engine.get_stats().encoder_cache_entries == 0


def test_abort_inside_an_image_frees_the_encoder_cache(checkpoint):
    family, _, path = checkpoint
    engine = engine_of(path, max_num_batched_tokens=6)
    engine.add_request("a", prompt(family, 1), PARAMS,
                       multi_modal_data={"image": random_images([(40, 40)], seed=11)})  # fmt: skip
    engine.step()
    engine.step()  # the second chunk is inside the image: encoded, held
    assert engine.get_stats().encoder_cache_entries == 1
    engine.abort_request("a")
    run_all(engine)
    assert engine.get_stats().encoder_cache_entries == 0
    assert_i4(engine)


def test_bad_image_requests_are_refused_naming_the_field(checkpoint):
    """Each raises InvalidRequestError naming the field and limit; nothing stays allocated."""
    from PIL import Image

    family, _, path = checkpoint
    engine = engine_of(path, limit_mm_per_prompt=2, max_image_pixels=10_000,
                       max_num_encoder_input_tokens=40)  # fmt: skip
    ids, one = prompt(family, 1), random_images([(8, 8)])
    cases = [
        (prompt(family, 3), random_images([(8, 8)] * 3), "multi_modal_data.image", "at most 2"),
        (ids, [Image.new("RGB", (0, 4))], r"multi_modal_data.image\[0\]", "zero-sized"),
        (ids, [Image.new("RGB", (200, 51))], r"multi_modal_data.image\[0\]", "10000"),
        (ids, ["not an image"], r"multi_modal_data.image\[0\]", "PIL image"),
        (ids + ids, one, "prompt", "2 image placeholders"),
        (ids, [], "prompt", "no image was given"),
        (ids, random_images([(64, 64)]), r"multi_modal_data.image\[0\]", "encoder budget"),
    ]
    if family.startswith("qwen3_5"):  # Qwen2-VL's processor refuses aspect ratios over 200
        cases.append((ids, random_images([(1, 300)]), r"multi_modal_data.image\[0\]", "refused"))
    for p, images, field, limit in cases:
        with pytest.raises(InvalidRequestError, match=field) as e:
            engine.add_request("x", p, PARAMS, multi_modal_data={"image": images})
        assert limit in str(e.value), str(e.value)
    with pytest.raises(InvalidRequestError, match="multi_modal_data.video"):
        engine.add_request("x", ids, PARAMS, multi_modal_data={"video": one})
    assert not engine.has_unfinished_requests()
    assert_i4(engine)


def test_without_an_image_processor_the_checkpoint_serves_text_only(checkpoint, tmp_path):
    import shutil

    family, _, path = checkpoint
    shutil.copytree(path, tmp_path / "m")
    (tmp_path / "m" / "preprocessor_config.json").unlink()
    engine = engine_of(tmp_path / "m")
    assert engine.multimodal is None
    with pytest.raises(InvalidRequestError, match="no vision tower loaded"):
        engine.add_request("x", prompt(family, 1), PARAMS,
                           multi_modal_data={"image": random_images([(8, 8)])})  # fmt: skip
    assert_i4(engine)


def test_preempted_image_requests_equal_solo_runs(checkpoint):
    """A cache too small for the batch: requests are preempted (inside or after their image)
    and recomputed, re-encoding what they released; outputs equal solo runs, nothing leaks."""
    family, _, path = checkpoint
    engine = engine_of(path, max_model_len=64, num_blocks=9, max_num_batched_tokens=16,
                       enable_prefix_caching=False)  # fmt: skip
    jobs = {f"r{i}": (prompt(family, 1, text=(5 + i, 6)), random_images([(24, 24)], seed=20 + i))
            for i in range(3)}  # fmt: skip
    for rid, (ids, images) in jobs.items():
        engine.add_request(rid, ids, PARAMS, multi_modal_data={"image": images})
    batched = run_all(engine)
    assert engine.get_stats().num_preemptions > 0
    for rid, (ids, images) in jobs.items():
        assert_same_completion(batched[rid], run_one(engine, "solo", ids, images))
    assert engine.get_stats().encoder_cache_entries == 0
    assert_i4(engine)
