"""Token sampling for every row at once, on the device, with no host wait; each row follows
`sampling_reference.sample_row`. A seeded row draws q from its own generator, so its tokens do
not depend on its batch neighbours. Reported logprobs are the raw log-softmax (as OpenAI's).

    logits [n, V] -> bitmask -> penalties -> ban (min_tokens) -> greedy rows: argmax
        other rows: /T -> top-k -> top-p -> min-p -> softmax -> argmax(p / q), q ~ Exp(1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hyla.forward_batch import index_tensor
from hyla.ops.greedy import greedy_logprobs
from hyla.request import SamplingParams
from hyla.structured.bitmask import apply_token_bitmask


@dataclass
class SamplingRow:
    """One row of logits; `num_pending` more output tokens are still on the device."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: tuple[int, ...] = ()
    generator: torch.Generator | None = None
    num_pending: int = 0
    grammar: Any = None  # `hyla.structured.backend.GrammarState`

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids) + self.num_pending

    @property
    def has_penalties(self) -> bool:
        p = self.params
        return (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) != (1.0, 0.0, 0.0)

    def banned_token_ids(self) -> list[int]:
        p = self.params
        if self.num_output_tokens >= p.min_tokens:
            return []
        eos = () if p.ignore_eos else self.eos_token_ids
        return sorted(set(eos) | set(p.stop_token_ids))

    @property
    def is_plain_greedy(self) -> bool:
        return (self.params.is_greedy and not self.has_penalties and self.grammar is None
                and not self.banned_token_ids())


@dataclass
class SamplerOutput:
    """Per row: token, raw logprob, top-N dict, and whether the logits were finite."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    is_finite: list[bool] = field(default_factory=list)


def top_logprobs(logprobs: torch.Tensor, num: int, token_id: int) -> dict[int, float]:
    """The `num` most likely tokens of `logprobs: [V]` plus `token_id`, as {id: logprob}."""
    out: dict[int, float] = {}
    if num > 0:
        vals, ids = torch.topk(logprobs, min(num, logprobs.shape[0]))
        out = dict(zip(ids.tolist(), vals.tolist(), strict=True))
    out[token_id] = float(logprobs[token_id])
    return out


class Sampler:
    """Samples one token per row of logits; `generator` serves rows without their own."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        return self.launch(logits, rows).result()

    @torch.inference_mode()
    def launch(
        self,
        logits: torch.Tensor,
        rows: list[SamplingRow],
        pending_tokens: torch.Tensor | None = None,
        bitmask: torch.Tensor | None = None,
    ) -> PendingSample:
        """Queue the sampling of `logits: [n, V]` and the copy of its results to the host.

        pending_tokens: [n] int64 on the device, row i's pending token if `rows[i].num_pending`.
        bitmask: [m, ceil(V / 32)] int32 on the host, one row per row with a `grammar`.
        Raises: ValueError when `rows` and `logits` (or the bitmask) disagree in length.
        """
        if logits.shape[0] != len(rows):
            raise ValueError(f"rows: {len(rows)} rows for {logits.shape[0]} logits")
        logits = logits.float()
        if all(r.is_plain_greedy for r in rows):
            tokens, lps = greedy_logprobs(logits)
        else:
            x = _masked(logits, rows, bitmask)
            x = self._penalized(x, rows, pending_tokens)
            tokens = self._choose(x, rows)
            lps = logits.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        top = _top(logits, rows, tokens)
        if top is not None:  # same log_softmax as its top entries
            lps = lps.index_copy(0, index_tensor(top[0], lps.device), top[3])
        num_top = [r.params.logprobs or 0 for r in rows if r.params.logprobs is not None]
        return PendingSample.start(tokens, lps, top, num_top)

    def _penalized(
        self, logits: torch.Tensor, rows: list[SamplingRow], pending: torch.Tensor | None
    ) -> torch.Tensor:
        x = logits
        pen = [i for i, r in enumerate(rows) if r.has_penalties]
        if pen:
            idx = index_tensor(pen, x.device)
            sub = None if pending is None else pending.index_select(0, idx)
            x = x.index_copy(0, idx, _penalize(x.index_select(0, idx), [rows[i] for i in pen], sub))
        ban_rows: list[int] = []
        ban_ids: list[int] = []
        for i, r in enumerate(rows):
            for t in r.banned_token_ids():
                if t < x.shape[1]:
                    ban_rows.append(i)
                    ban_ids.append(t)
        if ban_rows:
            x = x.clone() if x is logits else x
            x[index_tensor(ban_rows, x.device), index_tensor(ban_ids, x.device)] = float("-inf")
        return x

    def _choose(self, x: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        tokens = torch.argmax(x, dim=-1)
        drawn = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if not drawn:
            return tokens
        idx = index_tensor(drawn, x.device)
        params = [rows[i].params for i in drawn]
        probs = sampling_probs(x.index_select(0, idx), params)
        q = torch.empty_like(probs)
        for j, i in enumerate(drawn):  # V draws of the row's own generator, as the reference
            gen = rows[i].generator if rows[i].generator is not None else self.generator
            q[j].exponential_(generator=gen)
        return tokens.index_copy(0, idx, torch.argmax(probs / q, dim=-1))


def _masked(logits: torch.Tensor, rows: list[SamplingRow], bitmask: torch.Tensor | None
            ) -> torch.Tensor:
    constrained = [i for i, r in enumerate(rows) if r.grammar is not None]
    if not constrained:
        return logits
    if bitmask is None or bitmask.shape[0] != len(constrained):
        got = None if bitmask is None else bitmask.shape[0]
        raise ValueError(f"bitmask: {got} rows for {len(constrained)} constrained rows")
    idx = None if len(constrained) == len(rows) else index_tensor(constrained, logits.device)
    return apply_token_bitmask(logits, _to_device(bitmask, logits.device), idx)


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _penalize(
    x: torch.Tensor, rows: list[SamplingRow], pending: torch.Tensor | None
) -> torch.Tensor:
    """`sampling_reference.apply_penalties` for `x: [m, V]`; `pending: [m]` count as outputs."""
    m, vocab = x.shape
    dev = x.device
    has_pending = [r.num_pending > 0 for r in rows]
    counts = _bincount_rows([r.output_token_ids for r in rows], m, vocab, dev)
    if pending is not None and any(has_pending):
        mask = index_tensor(has_pending, dev, torch.bool)
        col = torch.where(mask, pending.clamp(0, vocab), vocab)[:, None]
        counts.scatter_add_(1, col, mask.to(counts.dtype)[:, None])
    counts = counts[:, :vocab]
    f32 = dict(dtype=torch.float32, device=dev)
    rp = torch.tensor([r.params.repetition_penalty for r in rows], **f32)[:, None]
    pres = torch.tensor([r.params.presence_penalty for r in rows], **f32)[:, None]
    freq = torch.tensor([r.params.frequency_penalty for r in rows], **f32)[:, None]
    prompts = _bincount_rows([r.prompt_token_ids for r in rows], m, vocab, dev)[:, :vocab]
    seen = (counts > 0) | (prompts > 0)
    x = torch.where(seen & (rp != 1.0), torch.where(x > 0, x / rp, x * rp), x)
    return x - (freq * counts + pres * (counts > 0).to(x.dtype))


def _bincount_rows(
    token_lists: list[list[int]], m: int, vocab: int, device: torch.device
) -> torch.Tensor:
    """[m, V + 1] float32 counts of each row's token ids (ids >= V in the last column)."""
    counts = torch.zeros(m, vocab + 1, dtype=torch.float32, device=device)
    width = max((len(t) for t in token_lists), default=0)
    if width == 0:
        return counts
    padded = [list(t) + [vocab] * (width - len(t)) for t in token_lists]
    idx = index_tensor(padded, device).view(m, width).clamp_(0, vocab)
    counts.scatter_add_(1, idx, torch.ones(m, width, dtype=torch.float32, device=device))
    return counts


def sampling_probs(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """`sampling_reference.sampling_probs` for `x: [m, V]` float32 (no greedy row) -> [m, V]."""
    m, vocab = x.shape
    dev = x.device
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
    x = x / temp[:, None]
    rows_k = [i for i, p in enumerate(params) if 0 < p.top_k < vocab]
    if rows_k:
        idx = index_tensor(rows_k, dev)
        sub = x.index_select(0, idx)
        ks = index_tensor([params[i].top_k - 1 for i in rows_k], dev)[:, None]
        kth = torch.topk(sub, max(params[i].top_k for i in rows_k), dim=-1).values.gather(1, ks)
        x = x.index_copy(0, idx, sub.masked_fill(sub < kth, float("-inf")))
    rows_p = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if rows_p:
        idx = index_tensor(rows_p, dev)
        sub = x.index_select(0, idx)
        top_p = torch.tensor([params[i].top_p for i in rows_p], dtype=torch.float32, device=dev)
        sorted_probs, order = torch.sort(torch.softmax(sub, dim=-1), dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p[:, None]
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        x = x.index_copy(0, idx, sub.masked_fill(drop, float("-inf")))
    probs = torch.softmax(x, dim=-1)
    if any(p.min_p > 0.0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev)[:, None]
        cut = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        probs = torch.where(min_p > 0.0, cut / cut.sum(dim=-1, keepdim=True), probs)
    return probs


def _top(
    logits: torch.Tensor, rows: list[SamplingRow], tokens: torch.Tensor
) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(row numbers, top ids [m, k], top values [m, k], token logprobs [m]), or None."""
    asked = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
    if not asked:
        return None
    idx = index_tensor(asked, logits.device)
    lp = torch.log_softmax(logits.index_select(0, idx), dim=-1)
    k = min(max(rows[i].params.logprobs or 0 for i in asked), lp.shape[1])
    vals, ids = torch.topk(lp, k, dim=-1)
    chosen = lp.gather(1, tokens.index_select(0, idx)[:, None])[:, 0]
    return asked, ids, vals, chosen


@dataclass
class PendingSample:
    """A launched sampling step: `tokens` on the device, `host` [2, n] float64 (ids < 2**53
    are exact; logprobs) on its way to the host until `event`."""

    tokens: torch.Tensor
    host: torch.Tensor
    top: tuple[list[int], torch.Tensor, torch.Tensor] | None
    event: torch.cuda.Event | None
    num_top: list[int] = field(default_factory=list)

    @staticmethod
    def start(
        tokens: torch.Tensor,
        lps: torch.Tensor,
        top: tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor] | None,
        num_top: list[int] | None = None,
    ) -> PendingSample:
        values = torch.stack([tokens.double(), lps.double()])
        moved: list[torch.Tensor] = [values]
        if top is not None:
            moved += [top[1], top[2]]
        is_cuda = tokens.device.type == "cuda"
        host = [t.to("cpu", non_blocking=True) if is_cuda else t for t in moved]
        event = None
        if is_cuda:
            event = torch.cuda.Event()
            event.record()
        top_host = None
        if top is not None:
            top_host = (top[0], host[1], host[2])
        return PendingSample(tokens, host[0], top_host, event, num_top or [])

    def result(self) -> SamplerOutput:
        if self.event is not None:
            self.event.synchronize()
        ids, lps = self.host.tolist()
        n = len(ids)
        out = SamplerOutput(
            token_ids=[int(t) for t in ids],
            logprobs=lps,
            top_logprobs=[None] * n,
            is_finite=[lp == lp and abs(lp) != float("inf") for lp in lps],
        )
        if self.top is not None:
            asked, top_ids, top_vals = self.top
            rows = zip(asked, self.num_top, top_ids.tolist(), top_vals.tolist(), strict=True)
            for i, num, tids, tvals in rows:
                entry = dict(zip(tids[:num], tvals[:num], strict=True))
                entry[out.token_ids[i]] = lps[i]
                out.top_logprobs[i] = entry
        return out


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
