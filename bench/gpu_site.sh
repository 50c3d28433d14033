# Sourced by the GPU scripts: install the wheels the GPU image lacks (diffusers and its needs,
# fetched into .whl/ by bench/gpu_wheels.sh) into a temporary folder removed on exit, and put
# it and this source tree (bench/pythonpath.sh) on PYTHONPATH. Nothing is installed when .whl/
# holds no wheel. Expects the repository root as the working directory and $py as Python.
# Also defines what the scripts that run jobs side by side share: wait_jobs and log_summary.
gpu_site=$(mktemp -d "${TMPDIR:-/tmp}/gpu_site.XXXXXX") || exit 1
trap 'rm -rf "$gpu_site"' EXIT
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
        --target "$gpu_site" .whl/*.whl || exit 1
    export PYTHONPATH="$gpu_site${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONPATH=$(bash bench/pythonpath.sh) || exit 1
export PYTHONPATH

# wait_jobs PID...: wait for every job; status 1 if any failed
wait_jobs() {
    local pid failed=0
    for pid in "$@"; do
        wait "$pid" || failed=1
    done
    return "$failed"
}

# log_summary DIR [PATTERN]: each DIR/*.log's last 4 lines (progress-bar redraws split into
# lines), only those matching the grep PATTERN when one is given
log_summary() {
    local log
    for log in "$1"/*.log; do
        echo "== $(basename "$log")"
        tr '\r' '\n' <"$log" | grep -a -e "${2:-}" | tail -n 4
    done
}
