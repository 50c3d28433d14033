# Sourced by the GPU scripts: install the wheels the GPU image lacks (diffusers and its needs,
# fetched into .whl/ by bench/gpu_wheels.sh) into a temporary folder removed on exit, and put
# it and this source tree (bench/pythonpath.sh) on PYTHONPATH. Nothing is installed when .whl/
# holds no wheel. Expects the repository root as the working directory and $py as Python.
gpu_site=$(mktemp -d "${TMPDIR:-/tmp}/gpu_site.XXXXXX") || exit 1
trap 'rm -rf "$gpu_site"' EXIT
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
        --target "$gpu_site" .whl/*.whl || exit 1
    export PYTHONPATH="$gpu_site${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONPATH=$(bash bench/pythonpath.sh) || exit 1
export PYTHONPATH
