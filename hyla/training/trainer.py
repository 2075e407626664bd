"""The default model's training loop: weighted next-token CE + DSA indexer KL + MoE balance loss;
DSA attends densely for the first `dense_warmup` of the steps."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from hyla.models.hybrid import HybridModel
from hyla.models.loader import load_model
from hyla.training.corpus import RetrievalDocs, doc_start_windows, load_split, sample_windows
from hyla.training.forward import train_forward
from hyla.training.metrics import answer_correct, bits_per_byte, token_byte_lengths
from hyla.training.recipe import build_model, default_model_config, save_checkpoint


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a run (written to the run's `train_config.json`)."""

    data: str = "data/default_model"
    tokenizer: str = "hyla/assets/default_model/tokenizer.json"
    out: str = "runs/default_model"
    seed: int = 0
    steps: int = 1000
    batch_size: int = 64
    seq_len: int = 1024
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    retrieval_fraction: float = 0.25
    doc_start_fraction: float = 0.0  # of the code windows: start at a document's <eos>
    min_keys: int = 1
    max_keys: int = 4
    spread_queries: bool = False
    init_from: str = ""
    answer_weight: float = 5.0
    indexer_weight: float = 1.0
    balance_weight: float = 0.01
    dense_warmup: float = 0.1
    chunk_size: int = 16
    eval_every: int = 100
    eval_windows: int = 64
    time_limit_s: float = 1e9
    budget_s: float = 0.0
    probe_steps: int = 20
    device: str = "cuda"


def lr_at(cfg: TrainConfig, step: int, total_steps: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def make_batch(
    cfg: TrainConfig, tokens: np.ndarray, docs: RetrievalDocs, rng_np, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
    """Returns (ids [N, L + 1] int64, loss weights [N, L], answer spans (row, start, end))."""
    n_ret = round(cfg.batch_size * cfg.retrieval_fraction)
    n_code = cfg.batch_size - n_ret
    n_start = round(n_code * cfg.doc_start_fraction)
    rows = list(sample_windows(tokens, n_code - n_start, cfg.seq_len + 1, rng_np))
    rows += list(doc_start_windows(tokens, docs.docs, n_start, cfg.seq_len + 1, rng_np))
    weights = torch.ones(cfg.batch_size, cfg.seq_len)
    spans = []
    for _ in range(n_ret):
        num_keys = rng.randint(cfg.min_keys, cfg.max_keys)
        doc = docs.make(rng, cfg.seq_len + 1, num_keys, spread=cfg.spread_queries)
        row = len(rows)
        rows.append(np.asarray(doc.ids, dtype=np.int64))
        for start, end in doc.answer_spans:
            weights[row, start - 1 : end - 1] = cfg.answer_weight
            spans.append((row, start, end))
    return torch.from_numpy(np.stack(rows)), weights, spans


def compute_loss(model, cfg, ids, weights, sparse):
    inputs, targets = ids[:, :-1], ids[:, 1:]
    on_gpu = ids.device.type == "cuda"  # bf16 matmuls are slow on CPUs: fp32 there
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=on_gpu):
        hidden, aux = train_forward(model, inputs, sparse=sparse, chunk_size=cfg.chunk_size)
        logits = model.compute_logits(hidden)
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    w = weights.flatten()
    lm = (ce * w).sum() / w.sum()
    index_kl = torch.stack(aux.indexer_kl).sum()
    balance = torch.stack(aux.moe_balance).mean()
    total = lm + cfg.indexer_weight * index_kl + cfg.balance_weight * balance
    return total, lm, index_kl, balance, logits


def heldout_windows(cfg: TrainConfig) -> torch.Tensor:
    """`eval_windows` evenly spaced windows [M, L + 1] of the held-out stream."""
    tokens, _ = load_split(Path(cfg.data), "heldout")
    n = len(tokens) // (cfg.seq_len + 1)
    picks = np.linspace(0, n - 1, min(cfg.eval_windows, n)).astype(int)
    size = cfg.seq_len + 1
    return torch.from_numpy(
        np.stack([tokens[i * size : (i + 1) * size] for i in picks]).astype(np.int64)
    )


@torch.no_grad()
def evaluate_heldout(model, cfg, windows, byte_lengths, batch: int = 16) -> float:
    """Held-out bits per byte over `windows` (sparse attention, bf16 autocast)."""
    model.eval()
    bits = nbytes = 0
    for i in range(0, len(windows), batch):
        ids = windows[i : i + batch].to(cfg.device)
        with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16):
            hidden, _ = train_forward(model, ids[:, :-1], sparse=True, chunk_size=cfg.chunk_size)
            logits = model.compute_logits(hidden)
        b, n = bits_per_byte(logits.flatten(0, 1), ids[:, 1:].flatten(), byte_lengths)
        bits, nbytes = bits + b, nbytes + n
    model.train()
    return bits / nbytes


def _steps_for_budget(cfg: TrainConfig, done: int, elapsed: float) -> int:
    """Steps fitting `cfg.budget_s` at the first `done` steps' pace (warm-up makes it err short)."""
    return max(done + 1, int(cfg.budget_s / (elapsed / done)))


def _record(cfg, step, total_steps, lm, index_kl, balance, grad_norm, sparse) -> dict:
    rec = {
        "step": step,
        "lr": lr_at(cfg, step, total_steps),
        "loss": lm.item(),
        "indexer_kl": index_kl.item(),
        "balance": balance.item(),
        "grad_norm": grad_norm.item(),
        "sparse": sparse,
    }
    if torch.cuda.is_available():
        rec["max_mem_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
    return rec


@torch.no_grad()
def _answer_hits(logits, ids, spans) -> float:
    hits = [answer_correct(logits[r, s - 1 : e - 1], ids[r, s:e].tolist()) for r, s, e in spans]
    return sum(hits) / max(1, len(hits))


@torch.no_grad()
def _answer_token_hits(logits, ids, spans) -> float:
    """Teacher-forced per-token answer accuracy (shows partial copying before exact matches do)."""
    hit = total = 0
    for r, s, e in spans:
        hit += int((logits[r, s - 1 : e - 1].argmax(-1) == ids[r, s:e]).sum())
        total += e - s
    return hit / max(1, total)


def _param_groups(model: HybridModel, weight_decay: float) -> list[dict]:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def train(cfg: TrainConfig, log=print) -> HybridModel:
    """Run training; writes checkpoint, `log.jsonl` and `train_config.json` under `cfg.out`."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    torch.manual_seed(cfg.seed)
    tok = Tokenizer.from_file(cfg.tokenizer)
    eos_id = tok.token_to_id("<|endoftext|>")
    tokens, doc_index = load_split(Path(cfg.data), "train")
    docs = RetrievalDocs(tok, tokens, doc_index, eos_id)
    if cfg.init_from:  # continue from a checkpoint (weights only; fresh optimizer)
        model = load_model(cfg.init_from, dtype="float32", progress=False).requires_grad_(True)
    else:
        model = build_model(default_model_config(tok.get_vocab_size(), eos_id), cfg.seed)
    model.to(cfg.device).train()
    opt = torch.optim.AdamW(
        _param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=cfg.device.startswith("cuda"),
    )
    windows, byte_lengths = heldout_windows(cfg), token_byte_lengths(Path(cfg.tokenizer))
    rng_np, rng = np.random.default_rng(cfg.seed), random.Random(cfg.seed)
    logf = (out / "log.jsonl").open("w")
    start, tokens_seen, total_steps = time.time(), 0, cfg.steps
    step = 0
    while step < total_steps:
        ids, weights, spans = make_batch(cfg, tokens, docs, rng_np, rng)
        ids, weights = ids.to(cfg.device, non_blocking=True), weights.to(cfg.device)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step, total_steps)
        sparse = step >= cfg.dense_warmup * total_steps
        total, lm, index_kl, balance, logits = compute_loss(model, cfg, ids, weights, sparse)
        opt.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens_seen += ids.shape[0] * cfg.seq_len
        if cfg.budget_s and step == cfg.probe_steps - 1:
            total_steps = _steps_for_budget(cfg, step + 1, time.time() - start)
            log(json.dumps({"resolved_steps": total_steps}))
        last = step == total_steps - 1 or time.time() - start > cfg.time_limit_s
        if step % 10 == 0 or last:
            rec = _record(cfg, step, total_steps, lm, index_kl, balance, grad_norm, sparse)
            rec["retrieval_acc"] = _answer_hits(logits, ids, spans)
            rec["retrieval_tok_acc"] = _answer_token_hits(logits, ids, spans)
            rec["tokens"], rec["elapsed_s"] = tokens_seen, round(time.time() - start, 1)
            if step % cfg.eval_every == 0 or last:
                rec["heldout_bpb"] = evaluate_heldout(model, cfg, windows, byte_lengths)
            log(json.dumps(rec))
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
        step += 1
        if last:
            break
    train_wall = time.time() - start
    size = save_checkpoint(model, out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(cfg.tokenizer).parent / name, out / name)
    summary = {
        "tokens_seen": tokens_seen,
        "steps": step,
        "train_wall_s": round(train_wall, 1),
        "checkpoint_bytes": size,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(json.dumps(summary))
    return model
