"""`hyla inspect PATH --gaps`: which modules of a transformers architecture (built on meta from
config.json) and maths-changing fields map onto hyla; docs/model_gaps.md has the same rows."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.models.loader import config_path

OK, MISSING, CHECK, SKIPPED = "ok", "missing", "check", "skipped"
# Every OK target starts with the hyla module that runs it (tests/models/test_module_gaps.py)
_HC = "layers/hyper_connection.HyperConnection (ops/hyper_connection; Triton on CUDA)"
_CLAMPED_MLP = "ops/activation.silu_and_mul_clamped (layers/mlp.GatedMLP; Triton on CUDA)"
_VISION_TOWERS = {  # family -> hyla tower (hyla.models.vision_loader.TOWERS)
    "glm5_next": "layers/glm5_next_vision.Glm5NextVisionTower (ops/vision)",
    "qwen3_5": "layers/qwen3_5_vision.Qwen35VisionTower (ops/vision)",
    "qwen3_5_moe": "layers/qwen3_5_vision.Qwen35VisionTower (ops/vision)",
}
# Said of every family with a vision tower (tests/multimodal holds it against transformers)
IMAGES_IN_ENGINE = "multimodal/runtime.MultimodalRuntime (images through LLM.generate / "
IMAGES_IN_ENGINE += "LLM.chat / the server: encoder cache, image hash in prefix keys, "
IMAGES_IN_ENGINE += "per-request M-RoPE positions)"

# (class-name pattern, status, hyla target), first match wins, on lowercased prefixed names
_MODULE_RULES: tuple[tuple[str, str, str], ...] = (
    (r"hyperconnection|hyperhead", OK, _HC),
    (r"compressor", MISSING, "compressed-KV attention (CSA/HCA compressors)"),
    (r"hashrouter", MISSING, "hash routing of tokens to experts"),
    (r"sqrtsoftplus", MISSING, "sqrt-softplus router scoring"),
    (r"groupedlinear", MISSING, "grouped low-rank output projection (o_groups)"),
    (r"rmsnormgated", OK, "ops/norm.gated_rms_norm (layers/linear_attention.GatedRMSNorm)"),
    (r"rmsnorm", OK, "layers/norm.RMSNorm (ops/norm)"),
    (r"deltaattention", OK, "layers/linear_attention.KimiDeltaAttention (ops/kda)"),
    (r"gateddeltanet", OK, "layers/linear_attention.GatedDeltaNet (ops/gdn)"),
    (r"indexerscorer|indexer$", OK, "layers/sparse_attention.LightningIndexer (ops/dsa_indexer)"),
    (r"topkrouter|router$", OK, "layers/moe.Router (ops/moe)"),
    (r"moe$|sparsemoeblock$", OK, "layers/moe.MoE"),
    (r"mlp$", OK, "layers/mlp.GatedMLP (ops/activation)"),
    (r"siluactivation$", OK, "ops/activation.silu_and_mul"),
    (r"rotaryembedding$", OK, "layers/rotary.RotaryEmbedding (ops/rotary)"),
    (r"^embedding$", OK, "models/hybrid.HybridModel (embed_tokens, lm_head)"),
    (r"^linear$", OK, "layers/linear.Linear (ops/linear)"),
    (r"^conv1d$", OK, "ops/short_conv.causal_conv1d"),
)
_V4_ATTN = "layers/compressed_attention.DeepseekV4Attention"
# family -> (pattern, target), before the generic rules: names other families use otherwise
_FAMILY_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "deepseek_v4": (
        (r"compressor$", "layers/compressed_attention.Compressor (ops/kv_compress; PyTorch only)"),
        (r"indexer$|indexerscorer$", "layers/compressed_attention.Indexer "
                                     "(ops/kv_compress.compressed_indexer_topk; PyTorch only)"),
        (r"hashrouter$", "ops/moe.route_hash (layers/moe.Router; PyTorch only)"),
        (r"sqrtsoftplus", "ops/moe.route_sqrt_softplus (layers/moe.Router; PyTorch only)"),
        (r"groupedlinear$", f"ops/linear/grouped.grouped_linear ({_V4_ATTN}; PyTorch only)"),
        (r"hyperhead$", "layers/hyper_connection.HyperHead (ops/hyper_connection; PyTorch only)"),
        (r"attention$", f"{_V4_ATTN} (ops/sink_attention, ops/kv_compress; PyTorch only)"),
    ),
}  # fmt: skip
_CONTAINERS = re.compile(r"(model|decoderlayer|modulelist|forcausallm|moduledict|sequential)$")
_VISION = re.compile(r"vision|visual|patch|merger", re.IGNORECASE)
_INDEXED = ("indexed_attention", "deepseek_sparse_attention")


def family(config: dict[str, Any]) -> str | None:
    """hyla's adapter family of a config.json dict (hyla.models.registry), None if unsupported."""
    from hyla.config import ConfigError
    from hyla.models.registry import family_of

    try:
        return family_of(config)
    except ConfigError:
        return None


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
        if text.get("index_kpool"):
            return OK, "layers/pooled_sparse_attention.PooledDSAttention (MLA + pooled top-k)"
        return OK, "layers/sparse_attention.DSAttention (MLA + indexer top-k)"
    if kind not in ("", "full_attention", "attention"):
        return MISSING, f"attention kind {kind!r}"
    if text.get("kv_lora_rank"):
        return OK, "layers/attention.MLAttention"
    return OK, "layers/attention.GQAttention"


def _variant(name: str, path: str, text: dict[str, Any]) -> tuple[str, str] | None:
    if name.endswith("unweightedrmsnorm"):
        if "_hc." in path or "hc_head" in path:  # the streams' norm inside mHC
            return OK, "ops/hyper_connection.hc_weights (RMS of the streams; PyTorch only)"
        if path.endswith("q_b_norm"):  # DeepSeek-V4's per-head query norm
            return OK, f"ops/norm.rms_norm_unweighted ({_V4_ATTN}; PyTorch only)"
        return MISSING, "weight-free RMSNorm"
    if name == "layernorm":
        if path.endswith("indexer.k_norm"):
            return OK, "layers/sparse_attention.LightningIndexer (k_norm)"
        return CHECK, "LayerNorm: hyla has it only as the DSA indexer's k_norm"
    if name.endswith("forgetgate"):
        if text.get("linear_lower_bound") is not None:
            return OK, "ops/gates.kda_gates_bounded (lower-bounded; Triton on CUDA)"
        return OK, "ops/gates.kda_gates"
    if re.search(r"indexer$", name) and text.get("index_kpool"):
        return OK, "layers/pooled_sparse_attention.KPoolIndexer (ops/kpool_indexer; Triton on CUDA)"
    if name.endswith("experts"):
        if text.get("swiglu_limit") is not None:
            return OK, "ops/moe_clamped.moe_experts_clamped (clamped SwiGLU; Triton on CUDA)"
        return OK, "ops/moe.moe_experts"
    if name.endswith("mlp") and text.get("swiglu_limit") is not None:
        return OK, _CLAMPED_MLP
    return None


def classify_module(
    cls: str, path: str, text: dict[str, Any], fam: str | None = None
) -> tuple[str, str] | None:
    """(status, hyla target) of one module of family `fam`, None for a container."""
    name = cls.lower()
    if _VISION.search(cls) or _VISION.search(path):
        if fam in _VISION_TOWERS:
            return OK, _VISION_TOWERS[fam] + " (model level; PyTorch only)"
        return MISSING, "vision tower / image path"
    if _CONTAINERS.search(name) and "attention" not in name:
        return None
    for pattern, target in _FAMILY_RULES.get(fam or "", ()):
        if re.search(pattern, name):
            return OK, target
    variant = _variant(name, path, text)
    if variant is not None:
        return variant
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
    fam = family(config)
    counts: Counter[str] = Counter()
    first: dict[str, tuple[str, str, str]] = {}
    for path, module in model.named_modules():
        cls = type(module).__name__
        verdict = classify_module(cls, path, text, fam)
        if verdict is None:
            continue
        if _VISION.search(path) or _VISION.search(cls):
            cls = "vision tower"
        counts[cls] += 1
        first.setdefault(cls, (path, *verdict))
    return tuple(Gap(c, counts[c], *first[c]) for c in counts)


# config fields that change the maths: (field, status when set, note)
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("swiglu_limit", OK, _CLAMPED_MLP + ", ops/moe_clamped (clamped SwiGLU)"),
    ("hc_mult", OK, _HC + ", hc_mult residual streams"),
    ("index_kpool", OK, "ops/kpool_indexer.kpool_indexer_topk (pooled indexer; Triton on CUDA)"),
    (
        "linear_lower_bound",
        OK,
        "ops/gates.kda_gates_bounded (KDA gate lower bound; Triton on CUDA)",
    ),
    ("compress_rates", MISSING, "compressed-KV attention"),
    ("o_lora_rank", MISSING, "low-rank grouped output projection"),
)


def _rope_fields(text: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    out = []
    if rope_type not in (None, "default", "linear", "yarn"):
        out.append(("rope_type", rope_type, MISSING, "rope types: default, linear, yarn"))
    if isinstance(rope, dict) and "mrope_section" in rope:
        out.append(("mrope_section", rope["mrope_section"], OK,
                    "ops/rotary/mrope.mrope_cos_sin (M-RoPE; text: 1-D positions)"))  # fmt: skip
    return out


def _vision_fields(config: dict[str, Any], fam: str | None) -> list[tuple[str, Any, str, str]]:
    if config.get("vision_config") is None:
        return []
    if fam not in _VISION_TOWERS:
        return [("vision_config", "present", MISSING, "vision tower / image inputs")]
    tower = _VISION_TOWERS[fam] + " (model level: HybridModel.forward; PyTorch only)"
    return [("vision_config", "present", OK, tower),
            ("vision_config", "present", OK, IMAGES_IN_ENGINE)]  # fmt: skip


# family -> field -> the hyla module that runs what a "missing" field row names
_FAMILY_FIELDS = {
    "deepseek_v4": {
        "compress_rates": "ops/kv_compress.compress_kv (CSA / HCA windows; PyTorch only)",
        "o_lora_rank": "ops/linear/grouped.grouped_linear (grouped output projection)",
        "sliding_window": "ops/sink_attention.sink_window_attention (window + sinks; "
                          "PyTorch only)",
        "scoring_func": "ops/moe.route_sqrt_softplus (sqrt-softplus routing; PyTorch only)",
    },
}  # fmt: skip


def _field_checks(config: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    rows = _generic_field_checks(config)
    served = _FAMILY_FIELDS.get(family(config) or "", {})
    return [(n, v, OK, served[n]) if st == MISSING and n in served else (n, v, st, note)
            for n, v, st, note in rows]  # fmt: skip


def _generic_field_checks(config: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    text, out = _text_config(config), []
    act = text.get("hidden_act", "silu")
    if act != "silu":
        out.append(("hidden_act", act, MISSING, "only silu (SwiGLU) MLPs"))
    out += [(n, text[n], st, note) for n, st, note in _FIELDS if text.get(n) is not None]
    window = text.get("sliding_window")
    if window and text.get("use_sliding_window", True):
        out.append(("sliding_window", window, MISSING, "sliding-window attention"))
    scoring = text.get("scoring_func") or text.get("moe_router_activation_func")
    if scoring and scoring not in ("softmax", "sigmoid"):
        out.append(("scoring_func", scoring, MISSING, "router scoring: softmax, sigmoid"))
    kinds = set(text.get("indexer_types") or ())
    if kinds - {"full", "shared"}:
        out.append(("indexer_types", sorted(kinds), MISSING, "indexer kinds: full, shared"))
    elif "shared" in kinds:
        layer = ("layers/pooled_sparse_attention.PooledDSAttention" if text.get("index_kpool")
                 else "layers/sparse_attention.DSAttention")  # fmt: skip
        out.append(("indexer_types", sorted(kinds), OK,
                    f"{layer} (shares the last full layer's top-k)"))  # fmt: skip
    if text.get("kv_lora_rank") and text.get("qk_rope_head_dim") == 0:
        out.append(("qk_rope_head_dim", 0, OK, "layers/attention.MLAttention (NoPE MLA)"))
    out += _rope_fields(text)
    for name in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if text.get(name):
            note = "multi-token-prediction layers are not served (speculative decoding)"
            out.append((name, text[name], SKIPPED, note))
    return out + _vision_fields(config, family(config))


def gap_report(path: str | Path) -> GapReport:
    """Gap list of the model at `path`. Raises FileNotFoundError, ValueError (no `model_type`)."""
    file = config_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no config.json at {file}")
    config = json.loads(file.read_text())
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError("model_type: config.json names no model_type")
    if model_type == "hyla":  # hyla's own layout: there is no transformers model to map
        modules, built = (), "hyla's own layout: every module is hyla's"
        return GapReport(model_type=model_type, built_with=built, modules=modules, fields=())
    try:
        modules, built = module_gaps(config), "transformers (meta device)"
    except (ValueError, KeyError, TypeError, AssertionError, ImportError) as e:  # cannot build
        modules, built = (), f"config fields only ({type(e).__name__}: {str(e)[:120]})"
    fields = tuple(Gap(n, 1, repr(v), st, note) for n, v, st, note in _field_checks(config))
    return GapReport(model_type=model_type, built_with=built, modules=modules, fields=fields)


def format_gaps(report: GapReport) -> str:
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
