#!/usr/bin/env bash
# The whole GPU check in under 10 minutes on one H200; installs nothing, needs no network.
#
#   bash bench/gpu_check.sh [OUT_DIR]        (default OUT_DIR: runs/gpu_check)
#
# Runs from a copy of the working tree, so nothing is installed: wc_fast and wc_kernels import
# from the repository root on PYTHONPATH (bench/pythonpath.sh). The native CPU extension
# (wc_kernels._native) is not built: nothing on the GPU needs it, and the tests and benchmarks
# that do skip without it.
# Python is ${PYTHON:-python3} (the GPU image has no plain `python`).
#
# Steps, in order of priority, each under a cap and under what is left of a fixed time budget;
# a step that runs out of time is interrupted (SIGINT), so pytest still writes what finished:
# 1. tests: the GPU-marked tests, pytest -m gpu tests/ -> OUT_DIR/gpu_tests.xml
# 2. kernels: fused-op benchmarks (nft_loss, flow_noise, grpo_sde_loss) -> OUT_DIR/bench_kernels.json
# 3. profile: where the fused ops' time goes (python -m studies.op_profile; the log only)
# 4. attention: shared-prefix attention benchmarks, prefix-grouper among the contenders (its
#    wheel travels in .whl/, bench/gpu_wheels.sh)     -> OUT_DIR/bench_attention.json
# 5. model: model-level benchmarks: the shared-prefix forward, one RL iteration at the
#    Wan2.1-1.3B shape (ours vs a batched eager loop), then the sampler -> OUT_DIR/bench_model.json
# 6. rl: one RL iteration, ours vs official-style     -> OUT_DIR/rl_iteration.json
# 7. wan: one RL iteration of a Wan2.1-1.3B-shaped model with random weights, with and
#    without LoRA and activation checkpointing       -> OUT_DIR/wan_iteration.json
# 8. a short table of all of the above (python -m studies.summarize) -> OUT_DIR/summary.txt
# Steps 6 and 7 measure what earlier runs already measured (the official-style ratio, the memory
# of the Wan variants), so they come after what has no GPU number yet and get what is left.
# Everything printed also goes to OUT_DIR/gpu_check.log: at most 8 files, none in a subfolder.
# The exit status is non-zero if any step failed or ran out of time.
#
# GPU_CHECK_DRY_RUN=1 checks the script without a GPU: the tests run (every GPU test skips),
# the benchmark files are only collected (imported), and the RL iteration runs the smoke
# preset on the CPU; the output folder must then hold the same files as on the GPU.
# GPU_CHECK_STEPS picks steps by name, comma-separated (default: all, in the order above; e.g.
# GPU_CHECK_STEPS=rl,profile for a short second run); GPU_CHECK_SKIP_RL=1 leaves out rl and wan
# (the test suite's dry run does: they take minutes on a busy 2-core machine and have their
# own tests); GPU_CHECK_BUDGET_S sets the time budget (default 480 s: the whole script in 8
# minutes), GPU_CHECK_TESTS_CAP_S the tests step's cap (default 120 s).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
root=$(pwd)
out="${1:-runs/gpu_check}"
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
py="${PYTHON:-python3}"
dry_run="${GPU_CHECK_DRY_RUN:-0}"
steps="${GPU_CHECK_STEPS:-tests,kernels,profile,attention,model,rl,wan}"
if [[ "${GPU_CHECK_SKIP_RL:-0}" == 1 ]]; then
    steps=$(tr , '\n' <<<"$steps" | grep -vx -e rl -e wan | paste -sd, -)
fi
wanted() { [[ ",$steps," == *",$1,"* ]]; }
budget_s="${GPU_CHECK_BUDGET_S:-480}"
max_files=8

# wheels the GPU image lacks, and this source tree, on PYTHONPATH
source bench/gpu_site.sh
export PYTHONDONTWRITEBYTECODE=1
# Native Triton on the GPU: never the CPU interpreter (tests/conftest.py sets it only
# without CUDA).
unset TRITON_INTERPRET

main() {
    echo "gpu_check: $(date -u +%FT%TZ) in $root, output $out, budget ${budget_s}s, dry run $dry_run"
    if ! command -v "$py" >/dev/null; then
        echo "gpu_check: no $py on PATH (set PYTHON)" >&2
        return 1
    fi
    "$py" - <<'EOF'
import platform, torch
try:
    import triton
    tv = triton.__version__
except ImportError as exc:
    tv = f"missing ({exc})"
print(f"python {platform.python_version()}, torch {torch.__version__}, triton {tv}, "
      f"CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"device {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}, "
          f"{p.multi_processor_count} SMs")
import wc_kernels, wc_fast
print("wc_kernels from", wc_kernels.__file__, "| wc_fast from", wc_fast.__file__)
import importlib.metadata as metadata
for dist in ("diffusers", "prefix-grouper", "flash-attn", "xformers"):
    try:
        print(f"{dist} {metadata.version(dist)}")
    except metadata.PackageNotFoundError:
        print(f"{dist} not installed (its tests and benchmarks skip)")
if torch.cuda.is_available():  # one small Triton launch: compiler and launcher work here
    try:
        x0, sig = torch.randn(2, 1000, device="cuda"), torch.rand(2, 3, device="cuda")
        x_t, v = wc_kernels.flow_noise(x0, sig, backend="triton")
        torch.cuda.synchronize()
        print("triton smoke test: flow_noise on CUDA ran, outputs", tuple(x_t.shape))
    except Exception as exc:  # reported, not fatal: eager and SDPA numbers still come
        print(f"triton smoke test FAILED: {type(exc).__name__}: {exc}"[:2000])
EOF
    if [[ "$dry_run" != 1 ]] && ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "gpu_check: no CUDA device visible to torch" >&2
        return 1
    fi
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
    # Triton builds its launcher with the host C compiler; torch.compile's CPU side needs g++.
    echo "compilers: cc=$(command -v cc || echo none) gcc=$(command -v gcc || echo none)" \
        "g++=$(command -v g++ || echo none) nvcc=$(command -v nvcc || echo none)"

    local status=0
    local pytest=("$py" -m pytest -q -p no:cacheprovider)
    # One hung test (a compile, a capture) must not take the whole budget.
    if "$py" -c 'import pytest_timeout' 2>/dev/null; then
        pytest+=(--timeout=100)
    fi
    local bench=("${pytest[@]}" --benchmark-only --benchmark-group-by=group
                 "--benchmark-columns=min,median,max,rounds" --benchmark-sort=name)
    if [[ "$dry_run" == 1 ]]; then
        bench=("${pytest[@]}" --collect-only --benchmark-only)
    fi

    # run_step CAP_S NAME CMD...: run CMD under min(CAP_S, what is left of the budget);
    # on time-out SIGINT (pytest then writes its reports), SIGKILL 20 s later.
    run_step() {
        local cap=$1 name=$2
        shift 2
        local left=$((budget_s - SECONDS))
        local limit=$((cap < left ? cap : left))
        if ((limit <= 10)); then
            echo "gpu_check: time budget spent, skipping $name" >&2
            status=1
            return
        fi
        echo "=== gpu_check: $name (limit ${limit}s, ${SECONDS}s elapsed)"
        local start=$SECONDS
        timeout -s INT -k 20 "$limit" "$@"
        local rc=$?
        if ((rc == 124 || rc == 137)); then
            echo "gpu_check: $name timed out after ${limit}s" >&2
        fi
        if ((rc != 0)); then
            echo "gpu_check: $name failed (exit $rc)" >&2
            status=1
        fi
        echo "=== gpu_check: $name done in $((SECONDS - start))s, exit $rc"
    }

    local results=()
    if wanted tests; then
        run_step "${GPU_CHECK_TESTS_CAP_S:-120}" "GPU tests" "${pytest[@]}" -m gpu tests/ --junitxml="$out/gpu_tests.xml"
        results+=("$out/gpu_tests.xml")
    fi
    if wanted kernels; then
        run_step 110 "fused-op benchmarks" "${bench[@]}" bench/test_bench_kernels.py \
            --benchmark-json="$out/bench_kernels.json"
        results+=("$out/bench_kernels.json")
    fi
    if wanted profile; then
        local profile=("$py" -m studies.op_profile)
        if [[ "$dry_run" == 1 ]]; then
            profile+=(--device cpu --scale 0.001)
        fi
        run_step 60 "fused-op profile" "${profile[@]}"
    fi
    if wanted attention; then
        run_step 120 "attention benchmarks" "${bench[@]}" bench/test_bench_attention.py \
            --benchmark-json="$out/bench_attention.json"
        results+=("$out/bench_attention.json")
    fi
    if wanted model; then
        # the Wan-shaped RL iteration (about 150 s of its 300) before the sampler, which
        # earlier runs have measured
        run_step 300 "model benchmarks" "${bench[@]}" bench/test_bench_prefix.py \
            bench/test_bench_rl_iteration.py bench/test_bench_sampler.py \
            --benchmark-json="$out/bench_model.json"
        results+=("$out/bench_model.json")
    fi
    if wanted rl; then
        local rl=("$py" -m studies.rl_iteration --preset paper --init random)
        if [[ "$dry_run" == 1 ]]; then
            rl=("$py" -m studies.rl_iteration --preset smoke --device cpu)
        fi
        run_step 150 "RL iteration" "${rl[@]}" --json "$out/rl_iteration.json"
        results+=("$out/rl_iteration.json")
    fi
    if wanted wan; then
        local wan=("$py" -m studies.wan_iteration --shape wan2.1-1.3b)
        if [[ "$dry_run" == 1 ]]; then
            wan=("$py" -m studies.wan_iteration --shape tiny --device cpu --resolution 64
                 --clip-frames 2 --group-size 4 --steps 2 --variants full,lora+checkpointing)
        fi
        run_step 120 "Wan iteration" "${wan[@]}" --json "$out/wan_iteration.json"
        results+=("$out/wan_iteration.json")
    fi

    echo "=== gpu_check: summary"
    "$py" -m studies.summarize "${results[@]}" | tee "$out/summary.txt"
    local files
    files=$(find "$out" -mindepth 1 | wc -l)
    if ((files > max_files)) || [[ -n "$(find "$out" -mindepth 1 ! -type f)" ]]; then
        echo "gpu_check: $out holds $files entries, more than $max_files files or a folder" >&2
        status=1
    fi
    if [[ -n "$(find "$out" -type f -size +16M)" ]]; then
        echo "gpu_check: a file in $out is over 16 MiB" >&2
        status=1
    fi
    echo "gpu_check: finished in ${SECONDS}s, status $status; $files files in $out"
    return "$status"
}

main 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
