"""CUDA graphs for mixed steps, piecewise: the token-wise ops between two mixers are replayed
on static [Tb, D] buffers, the mixers run eagerly on the first T rows (rows past T are padding,
never read back). Only the row count differs from `HybridModel.forward` (cuBLAS may reduce in
another order)."""

from __future__ import annotations

import logging

import torch

from hyla.forward_batch import ForwardBatch
from hyla.models.hybrid import HybridModel

logger = logging.getLogger("hyla.engine")

MIN_BUCKET = 16


def token_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    sizes = {max_num_batched_tokens}
    size = MIN_BUCKET
    while size < max_num_batched_tokens:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


class _Bucket:
    def __init__(self, size: int, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        self.size = size
        self.ids = torch.zeros(size, dtype=torch.long, device=device)
        self.x = torch.zeros(size, hidden, dtype=dtype, device=device)
        self.residual = torch.zeros(size, hidden, dtype=dtype, device=device)
        self.mixed = torch.zeros(size, hidden, dtype=dtype, device=device)
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.hidden: torch.Tensor | None = None


class PiecewiseGraphs:
    """Piecewise-captured mixed steps of one model; `capture=False` runs them eagerly."""

    def __init__(self, model: HybridModel, buckets: tuple[int, ...], capture: bool = True) -> None:
        self.model = model
        self.buckets = buckets if model.config.hc_mult == 1 else ()
        self.capture = capture
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.steps: dict[int, _Bucket] = {}
        self.num_replayed_steps = 0

    def can_run(self, num_tokens: int) -> bool:
        return num_tokens > 0 and self._bucket_size(num_tokens) is not None

    def _bucket_size(self, num_tokens: int) -> int | None:
        return next((b for b in self.buckets if b >= num_tokens), None)

    def run(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor | None:
        """Final-normed hidden states [T, D], a view valid until the next step; None when the
        graphs turned off in this call (nothing ran: the caller runs the step eagerly)."""
        num_tokens = input_ids.shape[0]
        size = self._bucket_size(num_tokens)
        if size is None:
            raise ValueError(f"piecewise graphs: {num_tokens} tokens exceed every bucket")
        bucket = self.steps.get(size)
        if bucket is None:
            bucket = self._build(size)
            if bucket is None:
                return None
        bucket.ids[:num_tokens].copy_(input_ids)
        bucket.ids[num_tokens:].zero_()
        bucket.mixed[num_tokens:].zero_()
        batch.per_pass.clear()  # as HybridModel.forward
        self._piece(bucket, 0)
        for i, layer in enumerate(self.model.layers):
            out = layer.mixer(bucket.x[:num_tokens], batch.positions, batch)
            bucket.mixed[:num_tokens].copy_(out)
            hidden = self._piece(bucket, i + 1)
        self.num_replayed_steps += bool(bucket.graphs)
        return hidden[:num_tokens]

    def _piece(self, bucket: _Bucket, index: int) -> torch.Tensor | None:
        if bucket.graphs:
            bucket.graphs[index].replay()
            return bucket.hidden if index == len(bucket.graphs) - 1 else None
        return self._compute(bucket, index)

    def _compute(self, bucket: _Bucket, index: int) -> torch.Tensor | None:
        layers = self.model.layers
        if index == 0:
            residual = self.model.embed_tokens(bucket.ids)
            bucket.residual.copy_(residual)
            bucket.x.copy_(layers[0].input_layernorm(residual))
            return None
        layer = layers[index - 1]
        x, residual = layer.post_attention_layernorm.add_and_norm(bucket.mixed, bucket.residual)
        delta = layer.mlp(x)
        if index == len(layers):
            return self.model.norm.add_and_norm(delta, residual)[0]
        x, residual = layers[index].input_layernorm.add_and_norm(delta, residual)
        bucket.x.copy_(x)
        bucket.residual.copy_(residual)
        return None

    def _build(self, size: int) -> _Bucket | None:
        hidden = self.model.config.hidden_size
        bucket = _Bucket(size, hidden, self.dtype, self.device)
        if self.capture and not self._capture(bucket):
            return None
        self.steps[size] = bucket
        return bucket

    def _capture(self, bucket: _Bucket) -> bool:
        num_pieces = len(self.model.layers) + 1
        current = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(self.device)
        try:
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                for _ in range(2):
                    for index in range(num_pieces):
                        self._compute(bucket, index)
            current.wait_stream(stream)
            for index in range(num_pieces):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    out = self._compute(bucket, index)
                bucket.graphs.append(graph)
                bucket.hidden = out if out is not None else bucket.hidden
        except RuntimeError as err:
            torch.cuda.set_stream(current)
            self.buckets, self.steps = (), {}
            logger.warning("piecewise CUDA graph capture failed (%d tokens); mixed steps run "
                           "eagerly from now on: %s", bucket.size, err)  # fmt: skip
            return False
        logger.info("captured the piecewise graphs for %d tokens", bucket.size)
        return True
