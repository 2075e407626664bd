"""Check (e): the image path, teacher-forced against `transformers`' image-text model.

Each sample (`vision_samples`: synthetic images in short prompts) is continued greedily by the
reference (fp32, eager, the checkpoint's own image processor, placeholders expanded from its
grid); the whole sequence is then scored by both sides at every position, images included,
with precision's measures and bounds (`precision.check_sample`). hyla's side goes through the
public `LLM.generate` with vLLM's {"prompt_token_ids", "multi_modal_data"} prompts. Also:

  placeholders   hyla's expanded prompt == the reference's (one row per encoder output row)
  image matters  hyla's logprobs with image B, scored against the reference's with image A on
                 the same tokens, must break the bound: a check that passes with the image
                 ignored is worthless (an engine ignoring images gives B's logprobs == A's)
  repeat         the same image request twice: the second is served from the prefix cache
                 through the end of its image (no image encoded again), same greedy tokens
"""

from __future__ import annotations

import importlib.util
from typing import Any

from hyla.validate.precision import (
    TOP_K,
    Errors,
    bound_text,
    bounds,
    check_sample,
    pooled,
    position_errors,
    ref_self_errors,
)
from hyla.validate.result import CheckResult, skipped

TITLE = "Image path"


def _prompt(ids: list[int], images: list) -> dict[str, Any]:
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}


def _image_effect(result: CheckResult, names, seqs, scored, ref_lps, bound: float) -> list:
    """hyla with B's image against the reference with A's, over their shared tokens."""
    n = next((i for i, (x, y) in enumerate(zip(*seqs, strict=False)) if x != y),
             min(map(len, seqs)))  # fmt: skip
    err = position_errors(ref_lps[0][: n - 1], scored[1].prompt_logprobs[1:n], seqs[0][:n], 0.0)
    effect = max(err.logprob)
    if effect <= bound:
        result.fail(f"image matters: hyla's logprobs with {names[1]}'s image are within the "
                    f"bound of the reference's with {names[0]}'s ({effect:.3g} <= {bound:.3g}): "
                    "the check cannot tell the two images apart")  # fmt: skip
    return err.logprob


def _repeat(ctx: Any, result: CheckResult, ids: list[int], images: list, num_greedy: int) -> list:
    """The same request twice; the second must hit the prefix cache through its images."""
    from hyla.request import SamplingParams

    engine = ctx.llm.engine
    block = engine.config.cache.block_size
    ids = ids + ids[-4:] * (block // 4 + 1)  # > one block past the image: the hit covers it
    params = SamplingParams(max_tokens=num_greedy, temperature=0.0, ignore_eos=True)
    first = ctx.llm.generate(_prompt(ids, images), params)[0]
    encoded = engine.get_stats().num_encoded_images
    second = ctx.llm.generate(_prompt(ids, images), params)[0]
    again = engine.get_stats().num_encoded_images - encoded
    image_end = max(i for i, t in enumerate(first.prompt_token_ids)
                    if t == engine.multimodal.spec.image_token_id) + 1  # fmt: skip
    same = first.outputs[0].token_ids == second.outputs[0].token_ids
    if not engine.config.cache.enable_prefix_caching:
        result.reason += "; repeat: prefix caching is off (hit not checked)"
    elif second.num_cached_tokens < image_end or again:
        result.fail(f"repeat: the second identical request reused {second.num_cached_tokens} "
                    f"cached tokens (the image ends at {image_end}) and encoded {again} images "
                    "again")  # fmt: skip
    if not same:
        result.fail("repeat: the second identical request's greedy tokens differ from the first's")
    return [len(first.prompt_token_ids), image_end, second.num_cached_tokens, again, same]


def run_vision(ctx: Any, progress: Any) -> CheckResult:
    """Check (e); `ctx` is the validate run (`hyla.validate.runner.Context`)."""
    from hyla.multimodal.inputs import read_config

    config = read_config(ctx.model)
    if config.get("vision_config") is None:
        progress.update(1)
        return skipped("vision", TITLE, "skipped: no vision (text-only model)")
    if ctx.llm.engine.multimodal is None:
        progress.update(1)
        result = CheckResult("vision", TITLE)
        result.fail(
            "the checkpoint has a vision_config but the engine loaded no vision "
            "tower (the log says why: no preprocessor_config.json or tower tensors)"
        )
        return result
    result = _compare(ctx, config)
    progress.update(1)
    return result


def _compare(ctx: Any, config: dict[str, Any]) -> CheckResult:
    from hyla.request import SamplingParams
    from hyla.validate.references import HFImageReference
    from hyla.validate.vision_samples import image_samples

    result = CheckResult("vision", TITLE)
    ref = HFImageReference(ctx.reference, "float32", ctx.device)
    low = None if ctx.dtype == "float32" else HFImageReference(ctx.reference, ctx.dtype, ctx.device)
    num_greedy = 8 if ctx.quick else 32
    samples = image_samples(config, ctx.llm.tokenizer, ctx.vocab_size, ctx.quick)
    prepared = [ref.prepare(s.ids, s.images) for s in samples]
    seqs = [full + ref.greedy(full, inputs, num_greedy) for full, inputs in prepared]
    tails = [seq[len(full) :] for seq, (full, _) in zip(seqs, prepared, strict=True)]
    scored = ctx.llm.generate([_prompt(s.ids + t, s.images) for s, t in zip(samples, tails,
                                                                          strict=True)],
                              SamplingParams(max_tokens=1, temperature=0.0,
                                             prompt_logprobs=TOP_K))  # fmt: skip
    greedy = ctx.llm.generate([_prompt(s.ids, s.images) for s in samples], SamplingParams(
        max_tokens=num_greedy, temperature=0.0, ignore_eos=True))  # fmt: skip
    ref_lps = [ref.logprobs(seq, inputs) for seq, (_, inputs) in zip(seqs, prepared, strict=True)]
    parts: list[Errors] = []
    if low is not None:
        parts = [ref_self_errors(low.logprobs(q, inp), r, q)
                 for q, (_, inp), r in zip(seqs, prepared, ref_lps, strict=True)]  # fmt: skip
    own = pooled(parts) if parts else None
    lp_bound = bounds(ctx.dtype, own)[0]
    rows, series = [], {}
    for i, (s, seq, out, g) in enumerate(zip(samples, seqs, scored, greedy, strict=True)):
        full = prepared[i][0]
        if list(out.prompt_token_ids) != seq:
            result.fail(f"{s.name}: hyla's expanded prompt ({len(out.prompt_token_ids)} tokens) "
                        f"is not the reference's ({len(seq)}: placeholders from the processor's "
                        "grid)")  # fmt: skip
            continue
        row = check_sample(result, s.name, full, seq, out.prompt_logprobs,
                           list(g.outputs[0].token_ids), ref_lps[i], own, ctx.dtype)  # fmt: skip
        num_image = sum(t == ref.spec.image_token_id for t in full)
        rows.append([*row[:2], num_image, *row[2:], max(parts[i].logprob) if parts else "-"])
        series[s.name] = position_errors(ref_lps[i], out.prompt_logprobs[1:], seq, 0.0).logprob
    swapped = _image_effect(result, [s.name[:1] for s in samples[:2]], seqs[:2], scored[:2],
                           ref_lps[:2], lp_bound)  # fmt: skip
    repeat = _repeat(ctx, result, samples[0].ids, samples[0].images, num_greedy)
    series["B's image vs A's reference"] = swapped
    _report(ctx, result, ref.name, rows, series, lp_bound, max(swapped), repeat, low is not None)
    return result


def _report(ctx, result, ref_name, rows, series, lp_bound, effect, repeat, has_low) -> None:
    result.bound = (bound_text(ctx.dtype, has_low) + "; placeholders as the processor's grid; "
                    "image B's logprobs break the bound against image A's reference; a repeated "
                    "request hits the prefix cache through its image, same tokens")  # fmt: skip
    result.reason = f"reference: {ref_name}"
    result.tables.append(("per sample", ["sample", "tokens", "image tokens", "max |logprob diff|",
                                         "max KL", "top-1 agreement", "greedy divergence",
                                         "reference's own max diff"], rows))  # fmt: skip
    result.tables.append(("repeated request", ["prompt tokens", "image end", "cached tokens",
                                               "images encoded again", "same tokens"],
                          [repeat]))  # fmt: skip
    if rows:
        result.metrics = {"max_logprob_diff": max(r[3] for r in rows),
                          "max_kl": max(r[4] for r in rows),
                          "min_top1_agreement": min(r[5] for r in rows)}  # fmt: skip
    result.metrics.update(image_effect=effect, repeat_cached_tokens=repeat[2])
    if importlib.util.find_spec("matplotlib") is None:
        result.reason += " (no plot: matplotlib is not installed)"
        return
    from hyla.validate.plots import line_plot

    line_plot(ctx.out_dir / "vision.png", series, xlabel="position", ylabel="max |logprob diff|",
              log_y=True, hline=(lp_bound, "bound"),
              title="image prompts: per-position |logprob diff| vs reference")  # fmt: skip
    result.plots.append("vision.png")
