"""Check (e): images teacher-forced against `transformers` with precision's bounds; also
placeholders, image effect (another image must break the bound), cache repeat, preprocessing."""

from __future__ import annotations

import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

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
BOUND = ("; placeholders as the processor's grid; image B's logprobs break the bound against "
         "image A's reference; a repeated request hits the prefix cache through its image, same "
         "tokens")  # fmt: skip


@dataclass
class _Run:
    """One sample: `seq` = expanded `prompt` + the reference's continuation, `ref_lp` [T, V]."""

    name: str
    ids: list[int]  # one image token per image, as hyla takes them
    images: list
    prompt: list[int]
    seq: list[int]
    ref_lp: torch.Tensor
    own: Errors | None = None
    scored: Any = None
    greedy: list[int] | None = None

    @property
    def matches(self) -> bool:
        return list(self.scored.prompt_token_ids) == self.seq


def _prompt(ids: list[int], images: list) -> dict[str, Any]:
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}


def _reference_runs(ref: Any, low: Any, samples: list, num_greedy: int) -> list[_Run]:
    runs = []
    for s in samples:
        prompt, inputs = ref.prepare(s.ids, s.images)
        seq = prompt + ref.greedy(prompt, inputs, num_greedy)
        ref_lp = ref.logprobs(seq, inputs)
        own = None if low is None else ref_self_errors(low.logprobs(seq, inputs), ref_lp, seq)
        runs.append(_Run(s.name, s.ids, s.images, prompt, seq, ref_lp, own))
    return runs


def _hyla_runs(llm: Any, runs: list[_Run], num_greedy: int) -> None:
    from hyla.request import SamplingParams

    scored = llm.generate([_prompt(r.ids + r.seq[len(r.prompt) :], r.images) for r in runs],
                          SamplingParams(max_tokens=1, temperature=0.0,
                                         prompt_logprobs=TOP_K))  # fmt: skip
    greedy = llm.generate([_prompt(r.ids, r.images) for r in runs], SamplingParams(
        max_tokens=num_greedy, temperature=0.0, ignore_eos=True))  # fmt: skip
    for r, out, g in zip(runs, scored, greedy, strict=True):
        r.scored, r.greedy = out, list(g.outputs[0].token_ids)


def _score(result: CheckResult, runs: list[_Run], own: Errors | None, dtype: str, image: int):
    """Each sample through precision's scoring: (table rows, per-position |logprob diff|)."""
    rows, series = [], {}
    for r in runs:
        if not r.matches:
            result.fail(f"{r.name}: hyla's expanded prompt ({len(r.scored.prompt_token_ids)} "
                        f"tokens) is not the reference's ({len(r.seq)}: placeholders from the "
                        "processor's grid)")  # fmt: skip
            continue
        row = check_sample(result, r.name, r.prompt, r.seq, r.scored.prompt_logprobs, r.greedy,
                           r.ref_lp, own, dtype)  # fmt: skip
        own_max = max(r.own.logprob) if r.own is not None else "-"
        rows.append([*row[:2], r.prompt.count(image), *row[2:-1], own_max])  # no tie column
        lp = r.scored.prompt_logprobs[1:]
        series[r.name] = position_errors(r.ref_lp, lp, r.seq, tie=0.0).logprob
    return rows, series


def _image_effect(result: CheckResult, a: _Run, b: _Run, bound: float) -> list[float]:
    if not (a.matches and b.matches):
        return [float("nan")]
    n = next((i for i, (x, y) in enumerate(zip(a.seq, b.seq, strict=False)) if x != y),
             min(len(a.seq), len(b.seq)))  # fmt: skip
    err = position_errors(a.ref_lp[: n - 1], b.scored.prompt_logprobs[1:n], a.seq[:n], 0.0)
    effect = max(err.logprob)
    if effect <= bound:
        result.fail(f"image matters: hyla's logprobs with {b.name[:1]}'s image are within the "
                    f"bound of the reference's with {a.name[:1]}'s ({effect:.3g} <= "
                    f"{bound:.3g}): the check cannot tell the two images apart")  # fmt: skip
    return err.logprob


def _repeat(ctx: Any, result: CheckResult, run: _Run, num_greedy: int, image: int) -> list:
    from hyla.request import SamplingParams

    engine = ctx.llm.engine
    block = engine.config.cache.block_size
    ids = run.ids + run.ids[-4:] * (block // 4 + 1)  # > a block past the image: the hit covers it
    params = SamplingParams(max_tokens=num_greedy, temperature=0.0, ignore_eos=True)
    first = ctx.llm.generate(_prompt(ids, run.images), params)[0]
    encoded = engine.get_stats().num_encoded_images
    second = ctx.llm.generate(_prompt(ids, run.images), params)[0]
    again = engine.get_stats().num_encoded_images - encoded
    image_end = len(first.prompt_token_ids) - first.prompt_token_ids[::-1].index(image)
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


def _preprocessing(engine: Any, runs: list[_Run], num_threads: int = 4) -> list[list]:
    """Rows (threads, images, wall ms, wall ms / images) of `prepare`, one thread and many."""
    jobs = [(r.ids, r.images) for r in runs]
    engine.multimodal.prepare(*jobs[0])  # warm-up: first-call costs are not preprocessing
    rows = []
    for threads, batch in ((1, jobs), (num_threads, jobs * num_threads)):
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda job: engine.multimodal.prepare(*job), batch))
        wall = 1e3 * (time.perf_counter() - start)
        num_images = sum(len(images) for _, images in batch)
        rows.append([threads, num_images, wall, wall / num_images])
    return rows


def run_vision(ctx: Any, progress: Any) -> CheckResult:
    from hyla.multimodal.inputs import read_config

    config = read_config(ctx.model)
    if config.get("vision_config") is None:
        progress.update(1)
        return skipped("vision", TITLE, "skipped: no vision (text-only model)")
    if ctx.llm.engine.multimodal is None:  # a text-only export of a multimodal family
        progress.update(1)
        return skipped("vision", TITLE, "skipped: no vision tower loaded (config.json has a "
                       "vision_config, but the tower's tensors or preprocessor_config.json are "
                       "missing: the engine serves it text-only)")  # fmt: skip
    result = CheckResult("vision", TITLE)
    _compare(ctx, config, result)
    progress.update(1)
    return result


def _compare(ctx: Any, config: dict[str, Any], result: CheckResult) -> None:
    from hyla.validate.references import HFImageReference
    from hyla.validate.vision_samples import image_samples

    ref = HFImageReference(ctx.reference, "float32", ctx.device)
    low = None if ctx.dtype == "float32" else HFImageReference(ctx.reference, ctx.dtype, ctx.device)
    result.reason = f"reference: {ref.name}" + ("" if low is None else f"; own error: {low.name}")
    num_greedy, image = (8 if ctx.quick else 32), ref.spec.image_token_id
    samples = image_samples(config, ctx.llm.tokenizer, ctx.vocab_size, ctx.quick)
    runs = _reference_runs(ref, low, samples, num_greedy)
    _hyla_runs(ctx.llm, runs, num_greedy)
    own = pooled([r.own for r in runs]) if low is not None else None  # type: ignore[misc]
    lp_bound = bounds(ctx.dtype, own)[0]
    rows, series = _score(result, runs, own, ctx.dtype, image)
    series["B's image vs A's reference"] = _image_effect(result, runs[0], runs[1], lp_bound)
    repeat = _repeat(ctx, result, runs[0], num_greedy, image)
    timing = _preprocessing(ctx.llm.engine, runs)
    result.bound = bound_text(ctx.dtype, low is not None) + BOUND
    _report(ctx, result, rows, series, lp_bound, repeat, timing)


def _report(ctx: Any, result: CheckResult, rows, series, lp_bound, repeat, timing) -> None:
    result.tables.append(("per sample", ["sample", "tokens", "image tokens", "max |logprob diff|",
                                         "max KL", "top-1 agreement", "greedy divergence",
                                         "reference's own max diff"], rows))  # fmt: skip
    result.tables.append(("repeated request", ["prompt tokens", "image end", "cached tokens",
                                               "images encoded again", "same tokens"],
                          [repeat]))  # fmt: skip
    result.tables.append(("image preprocessing (processor, hash, placeholders)",
                          ["threads", "images", "wall ms", "ms per image"], timing))  # fmt: skip
    if rows:
        result.metrics = {"max_logprob_diff": max(r[3] for r in rows),
                          "max_kl": max(r[4] for r in rows),
                          "min_top1_agreement": min(r[5] for r in rows)}  # fmt: skip
    effect = max(series["B's image vs A's reference"])
    result.metrics.update(image_effect=effect, repeat_cached_tokens=repeat[2],
                          preprocess_ms_per_image=timing[0][3],
                          preprocess_ms_per_image_concurrent=timing[1][3])  # fmt: skip
    if importlib.util.find_spec("matplotlib") is None:
        result.reason += " (no plot: matplotlib is not installed)"
        return
    from hyla.validate.plots import line_plot

    line_plot(ctx.out_dir / "vision.png", series, xlabel="position", ylabel="max |logprob diff|",
              log_y=True, hline=(lp_bound, "bound"),
              title="image prompts: per-position |logprob diff| vs reference")  # fmt: skip
    result.plots.append("vision.png")
