#!/usr/bin/env bash
# Print a PYTHONPATH under which this source tree imports without installing anything:
#
#   export PYTHONPATH=$(bash bench/pythonpath.sh)
#
# wc_fast, wc_kernels and studies import from the repository root, which goes first; the
# PYTHONPATH already set follows. (The native CPU extension, wc_kernels._native, exists only
# after a build; nothing on the GPU needs it.)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
echo "$root${PYTHONPATH:+:$PYTHONPATH}"
