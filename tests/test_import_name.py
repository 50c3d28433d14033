"""The ops package is ``wc_kernels``, a folder of that name: ``kernels`` is the PyPI package of
the hub kernel loader, which transformers imports whenever it is installed, so no folder of
this repository may take that name (from a checkout's root it would shadow the package and
break every import of diffusers' models). (``tests/check_kernels_coexist.py``, run by
``.ci/run``, checks the PyPI package beside ours.)
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_from_the_root_kernels_is_not_this_repository():
    """``python -c`` puts the current directory first on the path: from the root, ``kernels``
    is the PyPI package or absent, never a folder here, and wc_kernels imports."""
    code = ("import importlib.util, wc_kernels\n"
            "spec = importlib.util.find_spec('kernels')\n"
            "print(spec.origin if spec is not None else None)\n"
            "print(wc_kernels.__file__)\n")
    proc = _python(code, ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    origin, ours = proc.stdout.strip().splitlines()[-2:]
    # a virtual environment may live inside the checkout (CI's does): what matters is that
    # kernels is not a folder of the repository's own
    assert origin == "None" or "site-packages" in Path(origin).resolve().parts, origin
    assert Path(ours).resolve().parent.name == "wc_kernels", ours


def test_diffusers_models_import_from_the_root():
    """A run started in a checkout's root imports diffusers' Wan transformer, and peft with it
    (which imports transformers and, where installed, the PyPI ``kernels``)."""
    code = ("import wc_fast.train, peft\n"
            "from diffusers import WanTransformer3DModel\n"
            "from wc_fast.models.wan.model import WanWorldModel\n"
            "print('imported')\n")
    proc = _python(code, ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("imported"), proc.stdout


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
