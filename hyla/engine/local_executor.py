"""The executor of one process: the model runs here, as loaded (tensor parallel size 1)."""

from __future__ import annotations

from typing import Any

from hyla.engine.memory import CachePlan, memory_budget, plan_cache
from hyla.engine.model_runner import ModelRunner
from hyla.models.hybrid import HybridModel


class LocalExecutor:
    """`hyla.distributed.executor.Executor`'s interface over a model in this process."""

    is_distributed = False

    def __init__(self, model: HybridModel) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    def plan_cache(
        self, config: Any, max_model_len: int, max_num_seqs: int, reserved_bytes: int = 0
    ) -> CachePlan:
        """The pools that fit this device's cache budget, less `reserved_bytes`."""
        budget = memory_budget(config.cache, self.device) - reserved_bytes
        return plan_cache(self.model.config, config.cache, max_model_len, max_num_seqs, budget)

    def start_runner(
        self, plan: CachePlan, capture: tuple[tuple, ...], max_model_len: int, num_spec_rows: int
    ) -> ModelRunner:
        sizes, buckets, mixed = capture
        if self.device.type == "cuda":  # one matmul per projection group (one kernel, not n + 1)
            self.model.stack_projections()
        return ModelRunner(self.model, plan, sizes, max_model_len, buckets, mixed, num_spec_rows)

    def check_health(self) -> None: ...

    def shutdown(self) -> None: ...
