#!/usr/bin/env bash
# Every GPU test and benchmark of issue 6, in three parts that each fit one 10-minute command on
# a lent machine; every step has its own time limit, so one slow or hung step cannot eat the
# others' time. Logs and result JSONs go to OUT_DIR (default bench/results). Needs a CUDA machine
# with torch, triton, and fla-core + einops (`pip install -e ".[gpu]"`).
#   bash bench/gpu_suite.sh tests [OUT_DIR]   # all of tests/gpu, files in parallel (~7 min)
#   bash bench/gpu_suite.sh ops [OUT_DIR]     # 4a DSA decode, 4b KDA/GDN vs fla (~8 min)
#   bash bench/gpu_suite.sh tune [OUT_DIR]    # decode GEMV tiles: dense, MoE (~4 min)
#   bash bench/gpu_suite.sh model [OUT_DIR]   # 4c end to end, 4d one 1M-token prompt (~8 min)
#   bash bench/gpu_suite.sh glm5 [OUT_DIR]    # issue 30: GLM-5.3-Flash vs Kimi-Linear (~5 min)
#   bash bench/gpu_suite.sh all [OUT_DIR]     # the three in a row (a machine without limits)
# On a lent machine (whose .git is stale) prefix HYLA_COMMIT=<the commit you sent>, and carry
# data/ holding the triton_cache.tar.gz a previous part left in its OUT_DIR.
set -u
PART=${1:-all}
OUT_DIR=${2:-bench/results}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:.
# Triton's compiled kernels and autotune results (fla caches its autotune picks there too; its
# autotuning, ~40 s per new shape, is most of the tests' time): reuse, and leave for the next
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

tests() {  # one process per group, all at once: the GPU is mostly idle while fla autotunes
    local pytest="python3 -m pytest -q -p no:cacheprovider -rs -s" la=tests/gpu/test_linear_attention_gpu.py
    local g=tests/gpu t=${GPU_TEST_LIMIT:-420}  # kernel files in groups (as one, they overran 420 s)
    run $t gpu_tests_dsa $pytest $g/test_dsa_gpu.py $g/test_sparse_safe_gpu.py \
        $g/test_kpool_indexer_gpu.py > /dev/null &
    run $t gpu_tests_mla $pytest $g/test_mla_prefill_gpu.py > /dev/null &
    run $t gpu_tests_moe $pytest $g/test_moe_gpu.py $g/test_moe_grouped_gpu.py \
        $g/test_moe_clamped_gpu.py > /dev/null &
    run $t gpu_tests_linear $pytest $g/test_linear_gpu.py $g/test_greedy_gpu.py > /dev/null &
    run $t gpu_tests_kernels $pytest $g/test_norm_paged_gpu.py $g/test_kernel_strides.py \
        $g/test_short_conv_gpu.py $g/test_gates_gpu.py $g/test_activation_gpu.py \
        $g/test_short_conv_varlen_gpu.py $g/test_gqa_gpu.py $g/test_hyper_connection_gpu.py \
        > /dev/null &
    run $t gpu_tests_graphs $pytest $g/test_cuda_graphs_gpu.py $g/test_piecewise_graphs_gpu.py \
        $g/test_mixed_graphs_gpu.py \
        > /dev/null &
    run $t gpu_tests_fp8 $pytest $g/test_fp8_gpu.py > /dev/null &
    run $t gpu_tests_prefix $pytest $g/test_prefix_reuse_gpu.py $g/test_state_boundaries_gpu.py \
        $g/test_spec_decode_gpu.py $g/test_kv_offload_gpu.py > /dev/null &
    run $t gpu_tests_models $pytest $g/test_glm5_next_gpu.py $g/test_images_gpu.py > /dev/null &
    run $t gpu_tests_validate $pytest $g/test_validate_vision_gpu.py > /dev/null &
    run $t gpu_tests_tp $pytest $g/test_tp_world1_gpu.py > /dev/null &
    run $t gpu_tests_structured $pytest $g/test_structured_gpu.py > /dev/null &
    run $t gpu_tests_la_kda $pytest -n 2 $la -k "chunk and kda and not 100k" > /dev/null &
    run $t gpu_tests_la_gdn $pytest $la -k "chunk and gdn and not 100k" > /dev/null &
    run $t gpu_tests_la_100k $pytest $la -k "100k" > /dev/null &
    run $t gpu_tests_la_decode $pytest $la -k "recurrent or decode or tiny_model" > /dev/null &
    wait
    for f in "$OUT_DIR"/gpu_tests_*.log; do echo "== $f"; grep -E "passed|failed|error" "$f" | tail -3; done
    # every file of tests/gpu but the interpreter ones must be in a group above
    for f in $g/test_*_gpu.py $g/test_kernel_strides.py; do
        grep -q "$(basename "$f")" "$0" || echo "NOT RUN: $f"
    done
}

ops() {
    run 300 gpu_dsa_decode python3 bench/gpu_dsa_decode.py
    run 270 gpu_linear_attention python3 bench/gpu_linear_attention.py
}

tune() {  # decode GEMV tiles vs cuBLAS / PyTorch (the picks in hyla/ops/{linear,moe}/gemv.py)
    run 240 gpu_gemv_sweep python3 bench/gpu_gemv_sweep.py --out-dir "$OUT_DIR"
}

model() {
    run 300 gpu_e2e python3 bench/gpu_e2e.py --prefill-lens 8192,131072 --skip-eager --out-dir "$OUT_DIR"
    run 260 gpu_long_context python3 bench/gpu_long_context.py --out-dir "$OUT_DIR"
}

glm5() {
    run 560 gpu_glm5 python3 bench/gpu_glm5.py --out-dir "$OUT_DIR"
}

case "$PART" in
    tests) tests ;;
    ops) ops ;;
    model) model ;;
    glm5) glm5 ;;
    tune) tune ;;
    all) tests; ops; tune; model; glm5 ;;
    *) echo "usage: bash bench/gpu_suite.sh tests|ops|tune|model|glm5|all [OUT_DIR]" >&2; exit 2 ;;
esac
