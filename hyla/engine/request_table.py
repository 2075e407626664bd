"""The engine's requests between admission and their last output: groups by request id,
sequences by scheduler id, what each new token does to its sequence (placeholder, grammar,
logprobs, the stop it reaches) and the outputs of the groups touched since the last step."""

from __future__ import annotations

import time

from hyla.engine.group import RequestGroup, Sequence
from hyla.engine.sampler import SamplingRow
from hyla.request import Request, RequestOutput, RequestStatus, check_token_stop
from hyla.scheduler import SchedulerOutput


class RequestTable:
    """See the module docstring; `seqs` and `owner` are keyed by scheduler (sequence) id."""

    def __init__(self) -> None:
        self.groups: dict[str, RequestGroup] = {}
        self.owner: dict[str, RequestGroup] = {}
        self.seqs: dict[str, Sequence] = {}
        self._dirty: dict[str, None] = {}  # request ids with something new to report

    def add(self, group: RequestGroup) -> None:
        self.groups[group.request_id] = group
        for seq in group.sequences:
            self.owner[seq.request.request_id] = group
            self.seqs[seq.request.request_id] = seq

    def touch(self, seq_id: str) -> None:
        """The sequence's group has something new to report."""
        self._dirty[self.owner[seq_id].request_id] = None

    def touch_group(self, request_id: str) -> None:
        self._dirty[request_id] = None

    def take_token(self, seq_id: str, token: int, logprob: float,
                   top: dict[int, float] | None, now: float) -> None:  # fmt: skip
        """`token` is the sequence's new token: its placeholder resolved, its grammar advanced
        (RuntimeError when the grammar refuses it), its logprobs and times recorded."""
        group, seq = self.owner[seq_id], self.seqs[seq_id]
        seq.request.resolve_placeholder(token)
        if (
            seq.grammar is not None
            and not seq.grammar.is_terminated
            and not seq.grammar.accept(token)
        ):
            raise RuntimeError(f"the grammar does not allow the sampled token {token}")
        seq.cumulative_logprob += logprob
        if seq.logprobs is not None and top is not None:
            seq.logprobs.append(top)
        if group.metrics.first_token_time is None:
            group.metrics.first_token_time = now
        group.metrics.last_token_time = now
        self._dirty[group.request_id] = None

    def stop_of(self, seq_id: str, token: int) -> tuple[RequestStatus | None, str | int | None]:
        """(status, reason) the sequence's new `token` ends it with (EOS, stop token ids,
        length, stop strings), or (None, None)."""
        seq = self.seqs[seq_id]
        req = seq.request
        status = check_token_stop(req)
        reason = req.stop_reason if status is RequestStatus.FINISHED_STOPPED else None
        if status is not RequestStatus.FINISHED_STOPPED or req.params.include_stop_str_in_output:
            stop = seq.detokenizer.update([token])
            if stop is not None:
                status, reason = RequestStatus.FINISHED_STOPPED, stop
        return status, reason

    def collect_outputs(self) -> list[RequestOutput]:
        """The outputs of the touched groups; a finished group leaves the table."""
        outputs: list[RequestOutput] = []
        now = time.monotonic()
        for rid in self._dirty:
            group = self.groups[rid]
            if not group.wants_stream_output():
                continue
            if group.is_finished:
                group.metrics.finished_time = now
                del self.groups[rid]
                for seq in group.sequences:
                    self.owner.pop(seq.request.request_id, None)
                    self.seqs.pop(seq.request.request_id, None)
            output = group.output()
            if output is not None:
                outputs.append(output)
        self._dirty.clear()
        return outputs

    def scheduled(self, out: SchedulerOutput) -> tuple[dict[str, Request], dict[str, int]]:
        """`out`'s requests by sequence id, and where the prompt logprobs of each start."""
        now = time.monotonic()
        requests: dict[str, Request] = {}
        plp: dict[str, int] = {}
        for rid in out.num_scheduled_tokens:
            group, seq = self.owner[rid], self.seqs[rid]
            requests[rid] = seq.request
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = now
            pos = group.next_prompt_logprob_position()
            if pos is not None and seq.index == 0:
                plp[rid] = pos
        return requests, plp

    def sampling_row(self, rid: str) -> SamplingRow:
        seq = self.seqs[rid]
        req = seq.request
        if seq.sampling_row is None:  # its lists are the request's own: valid for its lifetime
            seq.sampling_row = SamplingRow(
                req.params, req.prompt_token_ids, req.output_token_ids, req.eos_token_ids,
                seq.generator, grammar=seq.grammar,
            )  # fmt: skip
        seq.sampling_row.num_pending = req.num_placeholders
        return seq.sampling_row
