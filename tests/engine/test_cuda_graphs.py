"""Decode steps in static shapes (the inputs of a captured CUDA graph), run eagerly on the CPU
(`DecodeGraphs(capture=False)`): padded batch buckets and a context bucket above the true
lengths give the same greedy tokens and logprobs as plain steps, and padding rows touch only
the reserved block 0 and state slot 0. The graph capture itself runs in tests/gpu."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hyla.engine.cuda_graphs import (
    DecodeGraphs,
    DecodeInputs,
    context_bucket,
    graph_batch_sizes,
)
from hyla.forward_batch import allocate_caches, build_forward_batch
from hyla.models.registry import config_from_hf
from hyla.request import SamplingParams
from tests.engine.engine_util import (
    assert_same_completion,
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    save_checkpoint,
)
from tests.hf_tiny import tiny_hf_config

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)


def test_buckets():
    assert [context_bucket(n) for n in (1, 256, 257, 1000, 1 << 20)] == [
        256, 256, 512, 1024, 1 << 20,
    ]  # fmt: skip
    assert context_bucket(300, 400) == 400 and context_bucket(100, 400) == 256
    assert context_bucket(5000, 4096 + 8) == 5000  # never below the step's own length
    kimi = config_from_hf(tiny_hf_config("kimi_linear").to_dict())
    sizes = graph_batch_sizes(kimi, 64)
    assert sizes[0] == 1 and sizes[-1] == 64 and list(sizes) == sorted(sizes)
    assert graph_batch_sizes(kimi, 20)[-1] == 20
    qwen = config_from_hf(tiny_hf_config("qwen3_next").to_dict())
    assert "gqa" in qwen.layer_pattern and graph_batch_sizes(qwen, 64)[-1] == 64

    from hyla.engine import cuda_graphs

    with pytest.MonkeyPatch.context() as mp:  # a mixer kind not known to be capturable
        mp.setattr(cuda_graphs, "GRAPH_MIXERS", frozenset({"kda"}))
        assert graph_batch_sizes(kimi, 64) == ()


def test_moe_limits_the_batch_sizes():
    kimi = config_from_hf(tiny_hf_config("kimi_linear").to_dict())
    moe = dataclasses.replace(kimi.moe, num_experts=256, num_experts_per_tok=8)
    big = dataclasses.replace(kimi, moe=moe)
    assert graph_batch_sizes(big, 256)[-1] == 32  # T * E <= 8192: 32 * 256


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32", "qwen3_next"])
def test_static_decode_steps_match_plain_steps(tmp_path, family):
    save_checkpoint(family, tmp_path)
    model = load(tmp_path)
    prompts = [prompt_ids(n, seed=n) for n in (5, 23, 40)]  # dsa top-k is 16: sparse rows too
    outputs = []
    for static in (False, True):
        engine = make_engine(model)
        if static:
            runner = engine.runner
            runner.graphs = DecodeGraphs(
                model, runner.caches, runner.block_size, (1, 2, 4), capture=False
            )
        with one_torch_thread():
            for i, p in enumerate(prompts):
                engine.add_request(str(i), p, PARAMS)
            outputs.append(run_all(engine))
        if static:
            assert {size for size, _ in runner.graphs.steps} >= {4}  # 3 rows padded to 4
            assert {bucket for _, bucket in runner.graphs.steps} == {256}
    plain, static = outputs
    for rid in plain:
        assert_same_completion(plain[rid], static[rid], atol=1e-4)


def test_padding_rows_touch_only_reserved_storage(tmp_path):
    save_checkpoint("kimi_linear", tmp_path)
    model = load(tmp_path)
    config, block = model.config, 4
    caches = allocate_caches(config, 12, block, 5)
    for layer in caches:
        for t in layer.values():
            t.normal_()
    tables, lens = [[3, 7], [5, 9, 2]], [6, 9]  # two sequences of 6 and 9 cached tokens
    before = [{k: t.clone() for k, t in layer.items()} for layer in caches]
    graphs = DecodeGraphs(model, caches, block, (4,), capture=False)
    step = DecodeInputs(
        input_ids=[11, 12],
        positions=lens,
        slot_mapping=[t[n // block] * block + n % block for t, n in zip(tables, lens, strict=True)],
        state_indices=[2, 4],
        seq_lens=[n + 1 for n in lens],
        block_tables=tables,
    )
    with torch.inference_mode():
        hidden = graphs.run(step)
    assert hidden.shape[0] == 2 and torch.isfinite(hidden).all()
    written = {t[n // block] * block + n % block for t, n in zip(tables, lens, strict=True)} | {0}
    for layer, old in zip(caches, before, strict=True):
        for name, t in layer.items():
            if t.shape[0] == 12:  # paged [blocks, block, ...]: changed flat slots
                changed = (t != old[name]).flatten(2).any(-1).flatten()
                assert set(changed.nonzero().flatten().tolist()) == written, name
            else:  # state slots [slots, ...]
                changed = (t != old[name]).flatten(1).any(-1)
                assert set(changed.nonzero().flatten().tolist()) == {0, 2, 4}, name
    # the same step without padding, from the same starting caches
    for layer, old in zip(caches, before, strict=True):
        for name, t in layer.items():
            t.copy_(old[name])
    batch = build_forward_batch([1, 1], lens, tables, [2, 4], block, caches)
    with torch.inference_mode():
        plain = model(torch.tensor([11, 12]), batch.positions, batch)
    torch.testing.assert_close(hidden, plain, rtol=1e-4, atol=1e-5)


def test_block_tables_load_incrementally_and_follow_row_changes(tmp_path):
    """Rows keep their table object across steps (append-only): only new entries are written;
    a row given another table, or turned into padding, is rewritten. The device table always
    equals the rows' tables, zero padded."""
    from hyla.engine.cuda_graphs import _StaticStep

    static = _StaticStep(4, 64, 4, [], torch.device("cpu"))  # width 16
    a, b, c = [3, 7], [5, 9, 2], [11]

    def step(tables):
        n = len(tables)
        return DecodeInputs([1] * n, [1] * n, [0] * n, [0] * n, [2] * n, tables)

    def expected(tables):
        want = torch.zeros(4, 16, dtype=torch.int32)
        for i, t in enumerate(tables):
            want[i, : len(t)] = torch.tensor(t[:16], dtype=torch.int32)
        return want

    for tables in ([a, b], [a, b, c], [b, a, c], [c]):
        static.load(step(tables))
        assert torch.equal(static.tables, expected(tables)), tables
        a.append(len(a) + 20)  # the tables grow between steps, in place
        b.extend(range(40, 52))  # past the width: truncated
    static.load(step([a, b]))
    assert torch.equal(static.tables, expected([a, b]))
    assert static.row_written == [len(a), 16, 0, 0]


def test_a_failed_capture_turns_the_graphs_off_and_the_step_runs_eagerly(tmp_path):
    """`CaptureFailed` from the graphs (a decode op that cannot be captured): the runner runs
    that step and every later one eagerly, with the plain engine's tokens."""
    from hyla.engine.cuda_graphs import CaptureFailed

    save_checkpoint("kimi_linear", tmp_path)
    model = load(tmp_path)
    prompts = [prompt_ids(n, seed=n) for n in (5, 9)]

    class Failing(DecodeGraphs):
        def _build(self, size, bucket):
            self.batch_sizes, self.steps = (), {}
            raise CaptureFailed("simulated")

    outputs = []
    for failing in (False, True):
        engine = make_engine(model)
        if failing:
            r = engine.runner
            r.graphs = Failing(model, r.caches, r.block_size, (1, 2), capture=False)
        with one_torch_thread():
            for i, p in enumerate(prompts):
                engine.add_request(str(i), p, PARAMS)
            outputs.append(run_all(engine))
    assert r.graphs.batch_sizes == ()
    for rid in outputs[0]:
        assert_same_completion(outputs[0][rid], outputs[1][rid], atol=1e-5)


def test_gqa_steps_past_the_gather_bound_run_eagerly(tmp_path, monkeypatch):
    """Qwen3-Next (GQA): a step whose padded batch times context bucket exceeds `GATHER_ROWS`
    runs eagerly; the tokens are the plain engine's either way."""
    from hyla.engine import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "GATHER_ROWS", 2 * 256)
    save_checkpoint("qwen3_next", tmp_path)
    model = load(tmp_path)
    prompts = [prompt_ids(n, seed=n) for n in (5, 9, 14)]
    outputs = []
    for static in (False, True):
        engine = make_engine(model)
        if static:
            r = engine.runner
            r.graphs = DecodeGraphs(model, r.caches, r.block_size, (1, 2, 4), capture=False)
        with one_torch_thread():
            for i, p in enumerate(prompts):
                params = dataclasses.replace(PARAMS, max_tokens=3 + 3 * i)
                engine.add_request(str(i), p, params)
            outputs.append(run_all(engine))
    assert {size for size, _ in r.graphs.steps} == {1, 2}  # 3 rows (bucket 4) ran eagerly
    for rid in outputs[0]:
        assert_same_completion(outputs[0][rid], outputs[1][rid], atol=1e-4)
