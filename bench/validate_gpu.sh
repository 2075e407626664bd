#!/usr/bin/env bash
# hyla validate on a GPU: the 1.5B bench model (bench/gpu_e2e.py's Kimi-shaped config, random
# bf16 weights, saved as a transformers checkpoint) and a tiny qwen3_next run in bf16.
# Reports land in $OUT (copy them to bench/results/validate_*). Usage: bash bench/validate_gpu.sh
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OUT=${OUT:-/tmp/out} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch, transformers, matplotlib; print(torch.__version__, transformers.__version__, matplotlib.__version__)"
python3 -c "import triton, fla; print('triton', triton.__version__, 'fla', fla.__version__)" || true
python3 - <<'PY'
import sys
sys.path.insert(0, "bench")
import torch
from gpu_e2e import build_hf_model, parse_args
args = parse_args([])
build_hf_model(args, torch.bfloat16).save_pretrained("/tmp/m15")
sys.path.insert(0, ".")
from tests.hf_tiny import save_tiny_hf_model
save_tiny_hf_model("qwen3_next", "/tmp/q3n", seed=0)
print("saved")
PY
budget=$((8 << 30))
timeout 260 python3 -m hyla.cli validate /tmp/m15 --device cuda ${QUICK:-} ${CHECKS:-} --kv-cache-memory $budget \
  --out "$OUT/validate_1p5b_h200"; echo "1.5B rc=$?"
timeout 150 python3 -m hyla.cli validate /tmp/q3n --device cuda ${QUICK:-} ${CHECKS:-} --dtype bfloat16 \
  --kv-cache-memory $budget --out "$OUT/validate_qwen3_next_tiny_h200"; echo "qwen3_next rc=$?"
