#!/usr/bin/env bash
# The whole GPU check in under 8 minutes on one H200; installs nothing.
#
#   bench/gpu_check.sh [OUT_DIR]        (default OUT_DIR: runs/gpu_check)
#
# 1. the GPU-marked tests:  pytest -m gpu tests/               -> OUT_DIR/gpu_tests.xml
# 2. every benchmark file:  pytest --benchmark-only bench/...  -> OUT_DIR/bench_<file>.json
#    (kernel benchmarks first)
# 3. one RL iteration, ours vs official-style     -> OUT_DIR/rl_iteration.json
# 4. a short table of the tests and benchmarks (bench/summarize.py).
# Each step gets what is left of a fixed time budget, so a slow step cannot push the check
# past the limit; the exit status is non-zero if any step failed or ran out of time.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
out="${1:-runs/gpu_check}"
budget_s=450
mkdir -p "$out"

if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device visible to torch" >&2
    exit 1
fi

status=0
reports=()

# Run "$@" under what is left of the budget; record a failure or a timeout in $status.
run_step() {
    local left=$((budget_s - SECONDS))
    if ((left <= 10)); then
        echo "gpu_check: time budget spent, skipping: $*" >&2
        status=1
        return
    fi
    timeout "$left" "$@"
    local rc=$?
    if ((rc == 124)); then
        echo "gpu_check: timed out: $*" >&2
    fi
    if ((rc != 0)); then
        status=1
    fi
}

run_step python -m pytest -m gpu tests/ -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml"
reports+=("$out/gpu_tests.xml")

bench_files=(bench/test_bench_kernels.py)
for f in bench/test_bench_*.py; do
    [[ "$f" == bench/test_bench_kernels.py ]] || bench_files+=("$f")
done
for f in "${bench_files[@]}"; do
    json="$out/bench_$(basename "$f" .py).json"
    run_step python -m pytest --benchmark-only "$f" -q -p no:cacheprovider \
        --benchmark-group-by=group --benchmark-json="$json"
    reports+=("$json")
done

run_step python bench/rl_iteration.py --preset paper --init random --json "$out/rl_iteration.json"

python bench/summarize.py "${reports[@]}"
echo "gpu_check: finished in ${SECONDS}s, status ${status}; reports in $out"
exit "$status"
