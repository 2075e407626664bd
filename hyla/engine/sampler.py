"""Token sampling: penalties, greedy/temperature, top-k, top-p, min-p, seeds and logprobs.

Per row, in this order (the order of Hugging Face's logits processors and warpers):

    logits --penalties--> --ban (min_tokens)--> greedy: argmax
                                                else: /T -> top-k -> top-p -> min-p -> softmax
                                                      -> draw with the row's generator

A draw is `argmax(p / q)` with `q ~ Exp(1)` i.i.d. per token, which picks token i with
probability p_i (the exponential race). Each seeded request owns a `torch.Generator` that only
it advances, so its tokens do not depend on its batch neighbours. Reported logprobs are the
model's raw log-softmax (before penalties and temperature), as OpenAI reports them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from hyla.forward_batch import index_tensor
from hyla.ops.greedy import greedy_logprobs
from hyla.request import SamplingParams


@dataclass
class SamplingRow:
    """What the sampler needs to know about one row of logits.

    `generator` None uses the sampler's shared generator (requests without a seed).
    """

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: tuple[int, ...] = ()
    generator: torch.Generator | None = None


@dataclass
class SamplerOutput:
    """Per row: the token, its raw logprob, and the top-N dict (None when not asked)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float] | None] = field(default_factory=list)


def apply_penalties(logits: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """Repetition (CTRL, Keskar et al. 2019 eq. 2, over prompt + output), presence and frequency
    (OpenAI API definition, over output only) penalties. `logits: [V]` float32, returns a new
    tensor."""
    p = row.params
    out = logits.clone()
    vocab = out.shape[0]
    if p.repetition_penalty != 1.0:
        seen = sorted({t for t in row.prompt_token_ids + row.output_token_ids if t < vocab})
        if seen:
            idx = torch.tensor(seen, dtype=torch.long, device=out.device)
            vals = out[idx]
            rp = p.repetition_penalty
            out[idx] = torch.where(vals > 0, vals / rp, vals * rp)
    if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and row.output_token_ids:
        ids = torch.tensor(row.output_token_ids, dtype=torch.long, device=out.device)
        counts = torch.bincount(ids[ids < vocab], minlength=vocab).to(out.dtype)
        out -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(out.dtype)
    return out


def banned_token_ids(row: SamplingRow) -> list[int]:
    """EOS (unless ignore_eos) and stop token ids while fewer than `min_tokens` were generated."""
    p = row.params
    if len(row.output_token_ids) >= p.min_tokens:
        return []
    eos = () if p.ignore_eos else row.eos_token_ids
    return sorted(set(eos) | set(p.stop_token_ids))


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy row draws from: `logits: [V]` float32 (already
    penalized) -> probs `[V]` float32 after temperature, top-k, top-p and min-p."""
    x = logits / params.temperature
    vocab = x.shape[0]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from `probs: [V]` by the exponential race, consuming V draws of `generator`."""
    q = torch.empty_like(probs).exponential_(generator=generator)
    return int(torch.argmax(probs / q))


def top_logprobs(logprobs: torch.Tensor, num: int, token_id: int) -> dict[int, float]:
    """The `num` most likely tokens of `logprobs: [V]` plus `token_id`, as {id: logprob}."""
    out: dict[int, float] = {}
    if num > 0:
        vals, ids = torch.topk(logprobs, min(num, logprobs.shape[0]))
        out = dict(zip(ids.tolist(), vals.tolist(), strict=True))
    out[token_id] = float(logprobs[token_id])
    return out


class Sampler:
    """Samples one token per row of logits.

    Args:
        generator: the shared generator of rows without their own (seeded from the engine seed).
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        """`logits: [n, V]` float32, one `SamplingRow` per row. Returns a SamplerOutput."""
        return self.launch(logits, rows).result()

    @torch.inference_mode()
    def launch(self, logits: torch.Tensor, rows: list[SamplingRow]) -> PendingSample:
        """Start sampling `logits: [n, V]` (one `SamplingRow` per row) without waiting for the
        device: the plain greedy rows' tokens and logprobs are computed and copied to the host
        asynchronously; `PendingSample.result()` waits for them and samples the other rows.
        Raises ValueError when `rows` and `logits` disagree in length."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"rows: {len(rows)} rows for {logits.shape[0]} logits")
        logits = logits.float()
        plain = [i for i, row in enumerate(rows) if _is_plain_greedy(row)]
        greedy, tokens = _greedy_values(logits, plain, len(rows))
        on_device = tokens if len(plain) == len(rows) else None
        return PendingSample(self, logits, rows, plain, greedy, on_device)

    def _sample_row(self, logits: torch.Tensor, row: SamplingRow) -> int:
        p = row.params
        x = apply_penalties(logits, row)
        banned = banned_token_ids(row)
        if banned:
            idx = torch.tensor([b for b in banned if b < x.shape[0]], dtype=torch.long)
            x[idx.to(x.device)] = float("-inf")
        if p.is_greedy:
            return int(torch.argmax(x))
        gen = row.generator if row.generator is not None else self.generator
        return draw(sampling_probs(x, p), gen)


def _greedy_values(
    logits: torch.Tensor, plain: list[int], num_rows: int
) -> tuple[tuple[torch.Tensor, torch.cuda.Event | None] | None, torch.Tensor | None]:
    """The plain greedy rows' tokens and raw logprobs as one [2, len(plain)] float64 host
    tensor (ids < 2^53: exact), copied without waiting on a GPU (then with the event that marks
    the copy done); one `greedy_logprobs` over those rows (on CUDA one kernel) and one copy,
    not one read-back per row. Also returns the tokens on the logits' device ([len(plain)]
    int64), or None without plain rows."""
    if not plain:
        return None, None
    if len(plain) < num_rows:
        logits = logits.index_select(0, index_tensor(plain, logits.device))
    tokens, lps = greedy_logprobs(logits)  # the first maximum, as the per-row argmax
    values = torch.stack([tokens.double(), lps.double()])
    if values.device.type != "cuda":
        return (values, None), tokens
    host = values.to("cpu", non_blocking=True)  # pinned: the copy is queued, not waited for
    event = torch.cuda.Event()
    event.record()
    return (host, event), tokens


@dataclass
class PendingSample:
    """A launched `Sampler` step (`Sampler.launch`); `result()` finishes it."""

    sampler: Sampler
    logits: torch.Tensor  # [n, V] float32
    rows: list[SamplingRow]
    plain: list[int]  # the plain greedy rows, sampled on the device
    greedy: tuple[torch.Tensor, torch.cuda.Event | None] | None
    # [n] int64 on the logits' device when every row is plain greedy (the next step's input
    # ids can be taken from it before the host has them: async scheduling), else None
    device_tokens: torch.Tensor | None = None
    _raw_logprobs: torch.Tensor | None = field(default=None, repr=False)

    @property
    def raw_logprobs(self) -> torch.Tensor:
        """[n, V] float32 log_softmax of the logits, computed on first use (only rows sampled on
        the host or asking for top logprobs read it; plain greedy rows got theirs at launch)."""
        if self._raw_logprobs is None:
            self._raw_logprobs = torch.log_softmax(self.logits, dim=-1)
        return self._raw_logprobs

    @torch.inference_mode()
    def result(self, skip: Collection[int] = ()) -> SamplerOutput:
        """Wait for the greedy rows' copy, sample the other rows; the SamplerOutput.

        Rows in `skip` (requests that ended since the launch) are not sampled: they draw
        nothing from the shared generator, and get token -1, logprob NaN and no top logprobs.
        """
        tokens: dict[int, int] = {}
        lps: dict[int, float] = {}
        if self.greedy is not None:
            host, event = self.greedy
            if event is not None:
                event.synchronize()
            values = host.tolist()
            tokens = {i: int(t) for i, t in zip(self.plain, values[0], strict=True)}
            lps = dict(zip(self.plain, values[1], strict=True))
        out = SamplerOutput()
        for i, row in enumerate(self.rows):
            if i in skip:
                out.token_ids.append(-1)
                out.logprobs.append(float("nan"))
                out.top_logprobs.append(None)
                continue
            token = tokens[i] if i in tokens else self.sampler._sample_row(self.logits[i], row)
            out.token_ids.append(token)
            n = row.params.logprobs
            # a row asking for top logprobs reports its token's from the same log_softmax as
            # them (the launch's one-pass value may differ by an ulp on a GPU)
            from_launch = i in lps and n is None
            out.logprobs.append(lps[i] if from_launch else float(self.raw_logprobs[i, token]))
            out.top_logprobs.append(
                None if n is None else top_logprobs(self.raw_logprobs[i], n, token)
            )
        return out


def _is_plain_greedy(row: SamplingRow) -> bool:
    """Greedy with nothing that changes the logits first (no penalty, no banned token)."""
    p = row.params
    return (
        p.is_greedy
        and p.repetition_penalty == 1.0
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and not banned_token_ids(row)
    )


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded with `seed` on `device`."""
    return torch.Generator(device=device).manual_seed(seed)
