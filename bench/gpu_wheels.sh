#!/usr/bin/env bash
# Download, on a machine that reaches a package registry, the wheels the GPU image lacks into
# .whl/ at the repository root (ignore it in .git/info/exclude and carry it to the GPU machine):
#
#   bash bench/gpu_wheels.sh
#
# The GPU image has torch, Triton, peft and transformers but not diffusers, which the Wan world
# model (its tests and the Wan-1.3B-shaped iteration) imports, nor prefix-grouper, a contender
# in the attention and model benchmarks (pure Python); bench/gpu_check.sh installs what it
# finds in .whl/ into a temporary folder first (pip --no-index --no-deps). The versions are
# those installed here, prefix-grouper's the one its tests ran with (PREFIX_GROUPER overrides
# it); the image's Python is 3.12.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-python3}"
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p .whl
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 -d .whl \
    "diffusers==$(version diffusers)" "importlib_metadata==$(version importlib_metadata)" \
    "lazy-importer==$(version lazy-importer)" "prefix-grouper==${PREFIX_GROUPER:-0.0.1.post1}"
ls -l .whl
