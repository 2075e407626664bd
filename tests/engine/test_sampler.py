"""Sampler: each option against a plain-Python oracle (math on lists, no torch ops), the draw
against its distribution, the batched device sampler against the per-row reference
(`sampling_reference.sample_row`, same generators: same tokens), seeds against batch
neighbours, logprobs against log-softmax, and non-finite rows flagged."""

from __future__ import annotations

import math

import pytest
import torch

from hyla.engine.sampler import Sampler, SamplingRow, make_generator
from hyla.engine.sampling_reference import apply_penalties, draw, sample_row, sampling_probs
from hyla.request import SamplingParams

V = 12


def logits_list(seed: int = 0, vocab: int = V) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, generator=g) * 2).tolist()


def softmax(xs: list[float]) -> list[float]:
    m = max(x for x in xs if x != -math.inf)
    es = [0.0 if x == -math.inf else math.exp(x - m) for x in xs]
    s = sum(es)
    return [e / s for e in es]


def oracle_probs(xs, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    xs = [x / temperature for x in xs]
    if 0 < top_k < len(xs):
        kth = sorted(xs, reverse=True)[top_k - 1]
        xs = [x if x >= kth else -math.inf for x in xs]
    if top_p < 1.0:
        ps = softmax(xs)
        order = sorted(range(len(xs)), key=lambda i: -ps[i])
        keep, mass = set(), 0.0
        for i in order:
            keep.add(i)
            mass += ps[i]
            if mass >= top_p:
                break
        xs = [x if i in keep else -math.inf for i, x in enumerate(xs)]
    ps = softmax(xs)
    if min_p > 0:
        thr = min_p * max(ps)
        ps = [p if p >= thr else 0.0 for p in ps]
        s = sum(ps)
        ps = [p / s for p in ps]
    return ps


def row(params, prompt=(), output=(), eos=(), gen=None) -> SamplingRow:
    return SamplingRow(params, list(prompt), list(output), tuple(eos), gen)


def test_greedy_is_argmax_after_penalties():
    xs = logits_list(1)
    order = sorted(range(V), key=lambda i: -xs[i])
    xs[order[0]] = abs(xs[order[0]]) + 1.0
    s = Sampler(make_generator(0))
    assert s(torch.tensor([xs]), [row(SamplingParams(temperature=0))]).token_ids == [order[0]]
    # a huge repetition penalty on the (positive) argmax moves greedy to the runner-up
    p = SamplingParams(temperature=0, repetition_penalty=1e6)
    assert s(torch.tensor([xs]), [row(p, prompt=[order[0]])]).token_ids == [order[1]]


def test_greedy_ties_pick_lowest_index():
    xs = [0.0, 3.0, 1.0, 3.0]
    out = Sampler()(torch.tensor([xs]), [row(SamplingParams(temperature=0))])
    assert out.token_ids == [1]


@pytest.mark.parametrize("rp", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_ctrl_definition(rp):
    xs = logits_list(2)
    prompt, output = [1, 3, 3], [5, 1, 11]
    seen = set(prompt) | set(output)
    expect = [(x / rp if x > 0 else x * rp) if i in seen else x for i, x in enumerate(xs)]
    params = SamplingParams(repetition_penalty=rp)
    got = apply_penalties(torch.tensor(xs), params, prompt, output)
    assert got.tolist() == pytest.approx(expect, abs=1e-6)
    batched = Sampler()._penalized(torch.tensor([xs]), [row(params, prompt, output)], None)
    assert batched[0].tolist() == pytest.approx(expect, abs=1e-6)


@pytest.mark.parametrize("presence,frequency", [(0.5, 0.0), (0.0, 0.7), (-1.0, 1.5)])
def test_presence_and_frequency_penalties_count_output_only(presence, frequency):
    xs = logits_list(3)
    prompt, output = [2, 2, 4], [4, 7, 7, 7]
    expect = list(xs)
    for i in range(V):
        c = output.count(i)
        expect[i] -= frequency * c + presence * (1 if c else 0)
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    got = apply_penalties(torch.tensor(xs), params, prompt, output)
    assert got.tolist() == pytest.approx(expect, abs=1e-6)
    batched = Sampler()._penalized(torch.tensor([xs]), [row(params, prompt, output)], None)
    assert batched[0].tolist() == pytest.approx(expect, abs=1e-6)


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.7),
        dict(top_k=3),
        dict(top_k=1),
        dict(top_p=0.5),
        dict(top_p=0.9, temperature=1.5),
        dict(min_p=0.2),
        dict(top_k=6, top_p=0.8, min_p=0.05, temperature=0.8),
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_sampling_probs_match_oracle(kw):
    xs = logits_list(4)
    got = sampling_probs(torch.tensor(xs), SamplingParams(**kw)).tolist()
    assert got == pytest.approx(oracle_probs(xs, **kw), abs=1e-6)
    if SamplingParams(**kw).is_greedy:
        return
    from hyla.engine.sampler import sampling_probs as batched_probs

    other = SamplingParams(temperature=0.5, top_p=0.3)  # a neighbour with other options
    both = batched_probs(torch.tensor([logits_list(9), xs]), [other, SamplingParams(**kw)])
    assert both[1].tolist() == pytest.approx(oracle_probs(xs, **kw), abs=1e-6)


def test_draw_follows_the_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05])
    gen = make_generator(7)
    n = 20000
    counts = [0] * 5
    for _ in range(n):
        counts[draw(probs, gen)] += 1
    assert counts[1] == 0
    for c, p in zip(counts, probs.tolist(), strict=True):
        assert abs(c / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9


def test_sampler_draws_only_allowed_tokens():
    xs = logits_list(5)
    params = SamplingParams(top_k=3, seed=1)
    allowed = set(sorted(range(V), key=lambda i: -xs[i])[:3])
    s = Sampler(make_generator(0))
    gen = make_generator(1)
    seen = {s(torch.tensor([xs]), [row(params, gen=gen)]).token_ids[0] for _ in range(300)}
    assert seen == allowed


def test_same_seed_same_output_regardless_of_batch_neighbours():
    params = SamplingParams(temperature=1.0, seed=42)
    other = SamplingParams(temperature=1.0)

    def run(neighbours: int, seed_shared: int) -> list[int]:
        s = Sampler(make_generator(seed_shared))
        gen = make_generator(42)
        toks = []
        for step in range(20):
            xs = [logits_list(100 + step)] + [logits_list(k) for k in range(neighbours)]
            rows = [row(params, gen=gen)] + [row(other) for _ in range(neighbours)]
            order = list(range(len(rows)))[::-1] if neighbours % 2 else list(range(len(rows)))
            out = s(torch.tensor([xs[i] for i in order]), [rows[i] for i in order])
            toks.append(out.token_ids[order.index(0)])
        return toks

    alone = run(0, 0)
    assert alone == run(3, 5) == run(6, 9)
    assert len(set(alone)) > 1


def test_logprobs_top_n_plus_sampled_token():
    xs = logits_list(6)
    lse = math.log(sum(math.exp(x) for x in xs))
    raw = [x - lse for x in xs]
    s = Sampler(make_generator(0))
    params = SamplingParams(temperature=0, logprobs=3, presence_penalty=2.0)
    top = max(range(V), key=lambda i: xs[i])
    out = s(torch.tensor([xs]), [row(params, output=[top] * 5)])
    tok = out.token_ids[0]
    best3 = sorted(range(V), key=lambda i: -raw[i])[:3]
    assert set(out.top_logprobs[0]) == set(best3) | {tok}
    for t, lp in out.top_logprobs[0].items():
        assert lp == pytest.approx(raw[t], abs=1e-5)  # raw model logprobs, before penalties
    assert out.logprobs[0] == pytest.approx(raw[tok], abs=1e-5)
    out0 = s(torch.tensor([xs]), [row(SamplingParams(temperature=0, logprobs=0))])
    assert list(out0.top_logprobs[0]) == out0.token_ids
    assert s(torch.tensor([xs]), [row(SamplingParams())]).top_logprobs == [None]


def test_min_tokens_bans_eos_and_stop_tokens():
    xs = [0.0] * V
    xs[2], xs[5], xs[9] = 10.0, 9.0, 8.0
    s = Sampler(make_generator(0))
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5])
    assert s(torch.tensor([xs]), [row(params, output=[1], eos=[2])]).token_ids == [9]
    assert s(torch.tensor([xs]), [row(params, output=[1, 1], eos=[2])]).token_ids == [2]
    ign = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True)
    assert s(torch.tensor([xs]), [row(ign, output=[], eos=[2])]).token_ids == [2]


def test_row_count_must_match():
    with pytest.raises(ValueError, match="rows"):
        Sampler()(torch.zeros(2, V), [row(SamplingParams())])


MIXED = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0, repetition_penalty=1.3),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[4]),
    SamplingParams(temperature=1.2, top_k=5, top_p=0.9, seed=2, presence_penalty=0.5),
    SamplingParams(temperature=0.7, min_p=0.1, frequency_penalty=1.0, seed=3),
    SamplingParams(temperature=0.9),
    SamplingParams(top_k=1, logprobs=3),
]


def test_batched_sampler_equals_the_per_row_reference():
    """Every option mixed in one batch, over 12 steps: each row's tokens equal
    `sample_row` on that row alone with a generator of the same seed (exact); greedy rows are
    the argmax of the penalized logits."""
    vocab = 40
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, vocab, (6,), generator=gen).tolist() for _ in MIXED]
    ours = Sampler(make_generator(0))
    ref_shared = make_generator(0)
    gens = [make_generator(p.seed) if p.seed is not None else None for p in MIXED]
    ref_gens = [make_generator(p.seed) if p.seed is not None else None for p in MIXED]
    outputs: list[list[int]] = [[] for _ in MIXED]
    for _ in range(12):
        logits = torch.randn(len(MIXED), vocab, generator=gen) * 3
        rows = [row(p, prompts[i], outputs[i], eos=[2], gen=gens[i]) for i, p in enumerate(MIXED)]
        got = ours(logits, rows).token_ids
        for i, p in enumerate(MIXED):
            g = ref_gens[i] if ref_gens[i] is not None else ref_shared
            want = sample_row(logits[i].clone(), p, prompts[i], outputs[i], (2,), g)
            assert got[i] == want, (i, p)
            outputs[i].append(got[i])
    assert len(set(outputs[2])) > 1


def test_pending_tokens_count_in_penalties_and_min_tokens():
    """A row whose last output token is still on the device (`num_pending`, value in
    `pending_tokens`) samples what the same row with that token on the host samples."""
    xs = torch.tensor([logits_list(8, 16)])
    top = int(xs.argmax())
    params = SamplingParams(temperature=0, repetition_penalty=1e6, min_tokens=2)
    on_host = row(params, prompt=[1], output=[3, top], eos=[5])
    pending = row(params, prompt=[1], output=[3], eos=[5])
    pending.num_pending = 1
    want = Sampler()(xs, [on_host]).token_ids
    got = Sampler().launch(xs, [pending], torch.tensor([top])).result().token_ids
    assert got == want and got[0] != top


def test_non_finite_rows_are_flagged_and_others_untouched():
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
    clean = logits.clone()
    logits[0, 3] = float("nan")  # one NaN: greedy would pick it (torch.argmax counts NaN as max)
    logits[1] = float("nan")
    logits[2, 7] = float("inf")
    rows = [row(SamplingParams(temperature=0)) for _ in range(3)]
    rows.append(row(SamplingParams(temperature=0.5, seed=1), gen=make_generator(1)))
    out = Sampler(make_generator(0))(logits, rows)
    assert out.is_finite == [False, False, False, True]
    ref = sample_row(clean[3].clone(), rows[3].params, [], [], (), make_generator(1))
    assert out.token_ids[3] == ref
    sampled = Sampler(make_generator(0))(logits, [row(SamplingParams(temperature=0.8))] * 4)
    assert sampled.is_finite == [False, False, False, True]


def test_plain_greedy_batch_reads_back_once(monkeypatch) -> None:
    """A step of plain greedy rows is one `greedy_logprobs` and one read-back, no per-row
    read; ties pick the first maximum."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1.0
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(1) or original(self))
    monkeypatch.setattr(torch.Tensor, "__int__", lambda self: pytest.fail("per-row read"))
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: pytest.fail("per-row read"))
    plain = Sampler()(logits, [row(SamplingParams(temperature=0)) for _ in range(6)])
    monkeypatch.undo()
    assert reads == [1] and plain.token_ids == logits.argmax(-1).tolist()
    assert plain.token_ids[2] == 7
    raw = torch.log_softmax(logits, dim=-1)
    for i, t in enumerate(plain.token_ids):
        assert plain.logprobs[i] == pytest.approx(float(raw[i, t]), abs=1e-6)
