"""The ops package imports as ``wc_kernels`` only. Its source folder ``kernels/`` is inert under
the name ``kernels`` (that of a PyPI package, the hub kernel loader diffusers and transformers
use): imported under two names, the same files would register the ``torch.library`` ops twice. And
nothing but a checkout's root on the path makes the folder importable as ``kernels``.
(``tests/check_kernels_coexist.py``, run by ``.ci/run``, checks the PyPI package beside ours.)
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFUSAL = "import wc_kernels instead"


def _python(code: str, cwd: Path, env: dict[str, str] | None = None,
            module: bool = False) -> subprocess.CompletedProcess:
    args = ["-m", code] if module else ["-c", code]
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_folder_is_inert_under_the_name_kernels_even_after_wc_kernels():
    """From the repository root (first on the path for ``python -c``) ``import kernels`` is the
    folder, which imports as an inert module: every attribute lookup raises AttributeError
    naming wc_kernels, no submodule imports (it would register its ops twice), also once
    wc_kernels has registered its ops; wc_kernels keeps working."""
    code = ("import torch, wc_kernels\n"
            "import importlib\n"
            "for op in ('nft_loss', 'flow_noise', 'grpo_sde_loss', 'prefix_attention'):\n"
            "    importlib.import_module(f'wc_kernels.ops.{op}.library')\n"
            "import kernels\n"
            "print('version:', getattr(kernels, '__version__', 'N/A'))\n"
            "try:\n"
            "    kernels.nft_loss\n"
            "except AttributeError as exc:\n"
            "    print('refused:', exc)\n"
            "try:\n"
            "    import kernels.ops.nft_loss.library\n"
            "except ModuleNotFoundError as exc:\n"
            "    print('no submodule:', exc.name)\n"
            "x = torch.randn(3, 4)\n"
            "print(float(wc_kernels.nft_loss(x, x, x + 1, torch.rand(3), backend='reference')))\n")
    proc = _python(code, ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "version: N/A" in proc.stdout, proc.stdout
    assert "refused:" in proc.stdout and REFUSAL in proc.stdout, proc.stdout
    assert str(ROOT / "kernels") in proc.stdout, proc.stdout
    assert "no submodule: kernels.ops" in proc.stdout, proc.stdout


def test_libraries_probing_for_kernels_work_from_the_root():
    """transformers (which diffusers imports when peft is installed) probes for the PyPI
    ``kernels`` by importing it and reading ``__version__``; from a checkout's root that finds
    this folder, which must leave the probe saying "not available" instead of failing every
    import of diffusers' models, and so every run started there."""
    code = ("import importlib.util, wc_fast.train\n"
            "from diffusers import WanTransformer3DModel\n"
            "if importlib.util.find_spec('transformers') is not None:\n"
            "    from transformers.utils import is_kernels_available\n"
            "    print('transformers sees kernels:', is_kernels_available())\n"
            "print('imported')\n")
    proc = _python(code, ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("imported"), proc.stdout
    assert "sees kernels: True" not in proc.stdout, proc.stdout


def test_running_a_module_as_kernels_fails():
    proc = _python("kernels.aot", ROOT, module=True)
    assert proc.returncode != 0
    assert "No module named kernels.aot" in proc.stderr, proc.stderr[-3000:]


def test_outside_the_root_kernels_is_not_this_folder(tmp_path):
    """With the root off the path (an install, or bench/pythonpath.sh's link alone),
    wc_kernels imports and ``kernels`` is absent or another package (PyPI's, when installed)."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in paths if p and Path(p).resolve() != ROOT)}
    code = ("import importlib.util, wc_kernels\n"
            "spec = importlib.util.find_spec('kernels')\n"
            "print(spec.origin if spec is not None else None)\n")
    proc = _python(code, tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    origin = proc.stdout.strip().splitlines()[-1]
    assert origin == "None" or ROOT not in Path(origin).resolve().parents, origin


def test_an_op_name_is_its_function_and_its_package_holds_its_pieces():
    """``wc_kernels.<op>`` is the public function; its subpackage ``wc_kernels.ops.<op>`` is not
    hidden by it: ``import wc_kernels.ops.<op>.naive`` works, and the one namespace of
    references re-exports each op's ``naive`` module."""
    import importlib

    import wc_kernels
    from wc_kernels import reference

    for op in ("nft_loss", "flow_noise", "prefix_attention", "grpo_sde_loss"):
        function = getattr(wc_kernels, op)
        assert callable(function) and function.__module__ == f"wc_kernels.ops.{op}", op
        package = importlib.import_module(f"wc_kernels.ops.{op}")
        assert package.__file__.endswith("__init__.py") and getattr(package, op) is function
        pieces = {}
        exec(f"import wc_kernels.ops.{op}.naive\n"
             f"import wc_kernels.ops.{op}.library\n"
             f"import wc_kernels.ops.{op}.triton\n"
             f"naive = wc_kernels.ops.{op}.naive\n"
             f"library = wc_kernels.ops.{op}.library\n"
             f"triton = wc_kernels.ops.{op}.triton", pieces)
        assert getattr(pieces["naive"], op) is getattr(reference, op), op
        assert pieces["library"].OPS and pieces["triton"].aot_configs(), op
