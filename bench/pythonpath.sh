#!/usr/bin/env bash
# Print a PYTHONPATH under which this source tree imports without installing anything:
#
#   export PYTHONPATH=$(bash bench/pythonpath.sh [LINK_DIR])
#
# wc_fast and studies import from the repository root; the ops package's import name is
# wc_kernels and its source the kernels/ folder (an install maps one to the other, see
# setup.py), so LINK_DIR gets one entry, a link wc_kernels -> kernels/, and goes first. LINK_DIR (default: a new temporary
# folder, left in place) must not hold anything else named wc_kernels. The PYTHONPATH already
# set follows. The repository root on the path makes kernels/ shadow the PyPI package named
# kernels (importing it then fails, saying so); run code that needs that package from an install.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
links="${1:-$(mktemp -d "${TMPDIR:-/tmp}/wc_pythonpath.XXXXXX")}"
mkdir -p "$links"
links=$(cd "$links" && pwd)
ln -sfn "$root/kernels" "$links/wc_kernels"
echo "$links:$root${PYTHONPATH:+:$PYTHONPATH}"
