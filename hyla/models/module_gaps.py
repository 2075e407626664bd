"""`hyla inspect PATH --gaps`: which modules of a (possibly unsupported) architecture map onto
hyla's ops and layers, and which are missing, from config.json alone.

The `transformers` model of the config's `model_type` is built on the meta device (no memory,
no weights) and its modules are grouped by class; each class is matched by its name (and, for
attention, by the config's layer kinds) against what hyla implements. Config fields that change
the maths without a module of their own (clamped SwiGLU, hyper-connections, sliding windows, an
unknown router scoring or rope type, a vision tower) are checked separately.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.models.loader import config_path

OK, MISSING, CHECK, SKIPPED = "ok", "missing", "check", "skipped"

# (class-name pattern, status, hyla target); first match wins; names are lowercased with the
# model prefix kept, so patterns match the class's tail
_MODULE_RULES: tuple[tuple[str, str, str], ...] = (
    (r"hyperconnection|hyperhead", MISSING, "hyper-connections (hc_mult residual streams)"),
    (r"compressor", MISSING, "compressed-KV attention (CSA/HCA compressors)"),
    (r"hashrouter", MISSING, "hash routing of tokens to experts"),
    (r"sqrtsoftplus", MISSING, "sqrt-softplus router scoring"),
    (r"groupedlinear", MISSING, "grouped low-rank output projection (o_groups)"),
    (r"unweightedrmsnorm", MISSING, "weight-free RMSNorm"),
    (r"rmsnormgated", OK, "ops/norm gated RMSNorm (layers/linear_attention)"),
    (r"rmsnorm", OK, "ops/norm rms_norm (layers/norm.RMSNorm)"),
    (r"deltaattention", OK, "layers/linear_attention.KimiDeltaAttention (ops/kda)"),
    (r"gateddeltanet", OK, "layers/linear_attention.GatedDeltaNet (ops/gdn)"),
    (r"forgetgate", OK, "ops/gates KDA forget gate"),
    (r"indexerscorer|indexer$", OK, "ops/dsa_indexer lightning indexer"),
    (r"topkrouter|router$", OK, "layers/moe.Router (ops/moe routing)"),
    (r"experts$", OK, "ops/moe experts"),
    (r"moe$|sparsemoeblock$", OK, "layers/moe.MoE"),
    (r"mlp$", OK, "layers/mlp.MLP"),
    (r"siluactivation$", OK, "ops/activation silu"),
    (r"rotaryembedding$", OK, "layers/rotary (ops/rotary)"),
    (r"^embedding$", OK, "embed_tokens / lm_head"),
    (r"^linear$", OK, "ops/linear"),
    (r"^conv1d$", OK, "ops/short_conv"),
    (r"^layernorm$", CHECK, "LayerNorm: hyla has it only as the DSA indexer's k_norm"),
)
_CONTAINERS = re.compile(r"(model|decoderlayer|modulelist|forcausallm|moduledict|sequential)$")
_VISION = re.compile(r"vision|visual|patch|merger", re.IGNORECASE)
_INDEXED = ("indexed_attention", "deepseek_sparse_attention")


@dataclass(frozen=True)
class Gap:
    """One module class (or config field): how many, an example path, status, hyla target."""

    name: str
    count: int
    example: str
    status: str
    target: str


@dataclass(frozen=True)
class GapReport:
    model_type: str
    built_with: str
    modules: tuple[Gap, ...]
    fields: tuple[Gap, ...]

    @property
    def num_missing(self) -> int:
        return sum(g.status == MISSING for g in self.modules + self.fields)


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config") or config


def _layer_kind(path: str, text: dict[str, Any]) -> str:
    layer = re.search(r"layers\.(\d+)\.", path)
    kinds = text.get("layer_types") or []
    if layer and int(layer.group(1)) < len(kinds):
        return kinds[int(layer.group(1))]
    return ""


def _attention_target(path: str, text: dict[str, Any]) -> tuple[str, str]:
    kind = _layer_kind(path, text)
    if kind == "linear_attention":
        if text.get("linear_num_heads") or text.get("linear_attn_config"):
            return OK, "layers/linear_attention.KimiDeltaAttention (ops/kda)"
        if text.get("linear_num_value_heads"):
            return OK, "layers/linear_attention.GatedDeltaNet (ops/gdn)"
        return MISSING, "linear attention of an unknown kind"
    if kind in _INDEXED or (text.get("index_topk") and not kind):
        return OK, "layers/sparse_attention.DSAttention (MLA + indexer top-k)"
    if kind not in ("", "full_attention", "attention"):
        return MISSING, f"attention kind {kind!r}"
    if text.get("kv_lora_rank"):
        return OK, "layers/attention.MLAttention"
    return OK, "layers/attention.GQAttention"


def classify_module(cls: str, path: str, text: dict[str, Any]) -> tuple[str, str] | None:
    """(status, hyla target) of one module, or None for a container."""
    name = cls.lower()
    if _VISION.search(cls) or _VISION.search(path):
        return MISSING, "vision tower / image path (hyla serves text only)"
    if _CONTAINERS.search(name) and "attention" not in name:
        return None
    for pattern, status, target in _MODULE_RULES:
        if re.search(pattern, name):
            return status, target
    if name.endswith("attention"):
        return _attention_target(path, text)
    return MISSING, "no hyla module of this kind"


def _build_meta(config: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    hf = AutoConfig.for_model(config["model_type"], **kwargs)
    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(hf)
        except ValueError:  # a multimodal top-level config: the base model
            return AutoModel.from_config(hf)


def module_gaps(config: dict[str, Any]) -> tuple[Gap, ...]:
    """Module classes of the transformers model of `config`, each mapped to hyla."""
    model = _build_meta(config)
    text = _text_config(model.config.to_dict())
    counts: Counter[str] = Counter()
    first: dict[str, tuple[str, str, str]] = {}
    for path, module in model.named_modules():
        cls = type(module).__name__
        verdict = classify_module(cls, path, text)
        if verdict is None:
            continue
        if _VISION.search(path) or _VISION.search(cls):
            cls = "vision tower"
        counts[cls] += 1
        first.setdefault(cls, (path, *verdict))
    return tuple(Gap(c, counts[c], *first[c]) for c in counts)


def _field_checks(config: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    """(field, value, status, note) for config fields that change the maths."""
    text, out = _text_config(config), []
    act = text.get("hidden_act", "silu")
    if act != "silu":
        out.append(("hidden_act", act, MISSING, "only silu (SwiGLU) MLPs"))
    for name, note in (
        ("swiglu_limit", "clamped SwiGLU"),
        ("hc_mult", "hyper-connections: hc_mult residual streams"),
        ("index_kpool", "pooled indexer keys"),
        ("linear_lower_bound", "a lower bound on the KDA forget gate"),
        ("compress_rates", "compressed-KV attention"),
        ("o_lora_rank", "low-rank grouped output projection"),
    ):
        if text.get(name) is not None:
            out.append((name, text[name], MISSING, note))
    window = text.get("sliding_window")
    if window and text.get("use_sliding_window", True):
        out.append(("sliding_window", window, MISSING, "sliding-window attention"))
    scoring = text.get("scoring_func") or text.get("moe_router_activation_func")
    if scoring and scoring not in ("softmax", "sigmoid"):
        out.append(("scoring_func", scoring, MISSING, "router scoring: softmax, sigmoid"))
    if "indexer_types" in text and set(text["indexer_types"]) - {"full"}:
        out.append(("indexer_types", sorted(set(text["indexer_types"])), MISSING,
                    "layers sharing another layer's top-k"))  # fmt: skip
    if text.get("kv_lora_rank") and text.get("qk_rope_head_dim") == 0:
        out.append(("qk_rope_head_dim", 0, CHECK, "MLA without a rope part (NoPE MLA exists; a "
                    "zero-width rope slice is untested)"))  # fmt: skip
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if rope_type not in (None, "default", "linear", "yarn"):
        out.append(("rope_type", rope_type, MISSING, "rope types: default, linear, yarn"))
    if isinstance(rope, dict) and "mrope_section" in rope:
        out.append(("mrope_section", rope["mrope_section"], MISSING, "multimodal rope"))
    if text.get("num_nextn_predict_layers"):
        out.append(
            (
                "num_nextn_predict_layers",
                text["num_nextn_predict_layers"],
                SKIPPED,
                "multi-token-prediction layers are not served (speculative decoding)",
            )
        )
    if config.get("vision_config") is not None:
        out.append(("vision_config", "present", MISSING, "image inputs (hyla serves text)"))
    return out


def gap_report(path: str | Path) -> GapReport:
    """Gap list of the model at `path` (checkpoint dir or config.json).

    Raises: FileNotFoundError; ValueError when config.json has no `model_type`.
    """
    file = config_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no config.json at {file}")
    config = json.loads(file.read_text())
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError("model_type: config.json names no model_type")
    try:
        modules, built = module_gaps(config), "transformers (meta device)"
    except (ValueError, KeyError, TypeError, AssertionError, ImportError) as e:  # cannot build
        modules, built = (), f"config fields only ({type(e).__name__}: {str(e)[:120]})"
    fields = tuple(Gap(n, 1, repr(v), st, note) for n, v, st, note in _field_checks(config))
    return GapReport(model_type=model_type, built_with=built, modules=modules, fields=fields)


def format_gaps(report: GapReport) -> str:
    """One line per module class and per field, missing ones first."""
    order = {MISSING: 0, CHECK: 1, SKIPPED: 2, OK: 3}
    lines = [f"gaps for model_type {report.model_type!r} (modules from {report.built_with}): "
             f"{report.num_missing} missing"]  # fmt: skip
    rows = sorted(report.modules, key=lambda g: (order[g.status], g.name))
    width = max([len(f"{g.name} x{g.count}") for g in rows] + [10])
    for g in rows:
        lines.append(f"  {g.status:<8} {f'{g.name} x{g.count}':<{width}}  {g.target}  "
                     f"(e.g. {g.example or '(root)'})")  # fmt: skip
    if report.fields:
        lines.append("config fields:")
    for g in sorted(report.fields, key=lambda g: order[g.status]):
        lines.append(f"  {g.status:<8} {g.name}={g.example}  {g.target}")
    return "\n".join(lines)
