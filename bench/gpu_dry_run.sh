#!/usr/bin/env bash
# The GPU check's CPU dry run in a fresh venv that installs only from a folder of wheels
# (pip --no-index, no pip configuration): proves, without a GPU and without a registry, that
# bench/gpu_check.sh needs nothing beyond the packages the GPU image has.
#
#   bash bench/gpu_dry_run.sh WHEEL_DIR [OUT_DIR]      (default OUT_DIR: runs/gpu_dry_run)
#
# WHEEL_DIR holds wheels of the packages below and their dependencies, downloaded beforehand
# on a machine that reaches a package registry, e.g.
#   python -m pip download -d WHEEL_DIR torch triton==3.6.0 "numpy<2.4" nvidia-ml-py \
#       safetensors tqdm rich pytest pytest-benchmark hypothesis
# (a CPU build of torch is enough: the dry run skips every GPU test). These are the project's
# dependencies and the test tools, a subset of the GPU image's packages (which also has peft,
# tensorboard and matplotlib, and has no diffusers, prefix-grouper, flash-attn or xformers:
# the first two travel as wheels, bench/gpu_wheels.sh), so what runs here runs there.
# GPU_DRY_RUN_PACKAGES overrides the list. The venv lives in a temporary folder and is removed
# at exit. The dry run's own settings pass through (GPU_CHECK_SKIP_RL=1 leaves out the
# RL-iteration step, GPU_CHECK_BUDGET_S). Exits with gpu_check.sh's status.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ $# -lt 1 || ! -d "$1" ]]; then
    echo "usage: bash bench/gpu_dry_run.sh WHEEL_DIR [OUT_DIR] (WHEEL_DIR: a folder of wheels)" >&2
    exit 2
fi
wheels=$(cd "$1" && pwd)
out="${2:-runs/gpu_dry_run}"
packages=(${GPU_DRY_RUN_PACKAGES:-torch triton numpy nvidia-ml-py safetensors tqdm rich pytest
           pytest-benchmark hypothesis})

venv=$(mktemp -d "${TMPDIR:-/tmp}/gpu_dry_run.XXXXXX")
trap 'rm -rf "$venv"' EXIT
# No pip configuration and no PIP_* variables: nothing but WHEEL_DIR is a source.
for name in "${!PIP_@}"; do unset "$name"; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1

start=$SECONDS
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels" "${packages[@]}"
echo "gpu_dry_run: fresh venv with ${packages[*]} from $wheels in $((SECONDS - start)) s:"
"$venv/bin/python" -m pip list --format=freeze | sed 's/^/  /'

GPU_CHECK_DRY_RUN=1 PYTHON="$venv/bin/python" bash bench/gpu_check.sh "$out"
