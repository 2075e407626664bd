#!/usr/bin/env bash
# Every GPU test and benchmark of issue 6 in one command, each under its own time limit, so one
# slow or hung step cannot eat the others' time. Logs and result JSONs go to $1 (default
# bench/results). Needs a CUDA machine with torch, triton, and fla-core + einops
# (`pip install -e ".[gpu]"`).
#   bash bench/gpu_suite.sh [OUT_DIR]
# On a lent machine (whose .git is stale): HYLA_COMMIT=<the commit you sent> bash bench/gpu_suite.sh
# "$OUT", carrying data/ with a previous triton_cache.tar.gz in it.
set -u
OUT_DIR=${1:-bench/results}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:.
# Triton's compiled kernels and autotune results (fla caches its autotune picks there too):
# reuse data/triton_cache.tar.gz when a previous run left one (same GPU and triton), and leave
# this run's cache in $OUT_DIR for the next (fla's autotuning is most of the tests' time)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/hyla_triton_cache}
mkdir -p "$TRITON_CACHE_DIR"
if [ -f data/triton_cache.tar.gz ]; then tar -xzf data/triton_cache.tar.gz -C "$TRITON_CACHE_DIR"; fi
trap 'tar -czf "$OUT_DIR/triton_cache.tar.gz" -C "$TRITON_CACHE_DIR" .' EXIT
run() {  # run SECONDS NAME COMMAND...
    local limit=$1 name=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log" | tail -25
}
# fla compiles and autotunes each new shape on first use (~40 s each on an H200 in 2026-11)
run 400 gpu_tests_dsa_norm_paged python3 -m pytest -q -p no:cacheprovider -rs \
    tests/gpu/test_dsa_gpu.py tests/gpu/test_norm_paged_gpu.py tests/gpu/test_kernel_strides.py \
    tests/gpu/test_moe_gpu.py tests/gpu/test_cuda_graphs_gpu.py
run 900 gpu_tests_linear_attention python3 -m pytest -q -p no:cacheprovider -rs -s \
    tests/gpu/test_linear_attention_gpu.py
run 240 gpu_dsa_decode python3 bench/gpu_dsa_decode.py
run 300 gpu_linear_attention python3 bench/gpu_linear_attention.py
run 400 gpu_e2e python3 bench/gpu_e2e.py --prefill-lens 8192,131072 --out-dir "$OUT_DIR"
run 400 gpu_long_context python3 bench/gpu_long_context.py --out-dir "$OUT_DIR"
