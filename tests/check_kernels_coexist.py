"""Check that the PyPI package ``kernels`` (the hub kernel loader that diffusers and transformers
import when it is installed) and this project's ops package ``wc_kernels`` coexist.

    python -m pip install kernels        # not a dependency of wc_fast; .ci/run installs it
    python tests/check_kernels_coexist.py

Run it from the repository root (where ``python`` puts the current directory on the path) or
from anywhere else. Checks that ``import kernels`` gives the PyPI package, that
``import wc_kernels`` works beside it and ``nft_loss`` (value and gradient) on small CPU tensors
matches its reference, that ``diffusers.utils.is_kernels_available()`` is true, and that the
Wan world model (diffusers' transformer, with peft and so transformers imported) imports.
Prints one line per check and exits 1 on the first failure.
"""

import importlib.metadata
import sys
from pathlib import Path


def check(condition: bool, what: str) -> None:
    if not condition:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main() -> None:
    try:
        import kernels
    except ImportError as exc:
        check(False, f"import kernels: {exc}")

    where = Path(kernels.__file__).resolve()
    check("site-packages" in where.parts,  # CI's virtual environment is inside the checkout
          f"import kernels gives the PyPI package {importlib.metadata.version('kernels')} "
          f"({where.parent}), not this repository's folder")
    check(callable(getattr(kernels, "get_kernel", None)), "kernels.get_kernel exists")

    import torch

    import wc_kernels
    from wc_kernels import reference
    from wc_kernels._backend import native_built

    check(sys.modules["kernels"] is kernels,
          f"import wc_kernels ({Path(wc_kernels.__file__).parent}) leaves kernels as it was")
    gen = torch.Generator().manual_seed(0)
    v_theta = torch.randn(4, 3, 8, generator=gen, requires_grad=True)
    v_old, v_target = torch.randn(2, 4, 3, 8, generator=gen)
    r = torch.rand(4, generator=gen)
    loss = wc_kernels.nft_loss(v_theta, v_old, v_target, r, beta=0.5)
    (grad,) = torch.autograd.grad(loss, v_theta)
    expected = reference.nft_loss(v_theta, v_old, v_target, r, beta=0.5).mean()
    (expected_grad,) = torch.autograd.grad(expected, v_theta)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    check(True, f"wc_kernels.nft_loss and its gradient match the reference on CPU "
                f"(native extension built: {native_built()})")

    from diffusers.utils import is_kernels_available

    check(is_kernels_available(), "diffusers.utils.is_kernels_available() is true")

    import peft  # noqa: F401 - imports transformers, whose kernel-hub integration imports kernels

    from wc_fast.models.wan.model import WanWorldModel

    check(WanWorldModel.__module__ == "wc_fast.models.wan.model", "the Wan world model imports")


if __name__ == "__main__":
    main()
