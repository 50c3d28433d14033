"""Build script: the packages, and the optional native CPU extension ``wc_kernels._native``
from ``csrc/``.

The ops package is the ``wc_kernels/`` folder. The extension is built into it for an editable
install.

The study programs in ``studies/`` install as the top-level package ``studies``.

The package is pure Python plus Triton; the native extension only adds ``backend="native"``.
It is built when torch is importable at build time (install with ``--no-build-isolation`` so
the build sees the installed torch instead of downloading another) and skipped, with a
warning, when ``WC_FAST_NO_NATIVE=1`` is set or the compiler fails.
"""

import os
import sys
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).parent


def packages() -> list[str]:
    """wc_fast, wc_kernels and their subpackages, and studies/ (the study programs,
    ``python -m studies.<name>``; its results/ folder is data)."""
    return sorted(find_namespace_packages(
        include=["wc_fast", "wc_fast.*", "wc_kernels", "wc_kernels.*", "studies"],
        exclude=["*.__pycache__"]))


def native_extensions() -> tuple[list, dict]:
    if os.environ.get("WC_FAST_NO_NATIVE", "0") == "1":
        print("wc_fast: WC_FAST_NO_NATIVE=1, skipping the native extension", file=sys.stderr)
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("wc_fast: torch not importable at build time, skipping the native extension "
              "(use pip install --no-build-isolation)", file=sys.stderr)
        return [], {}

    class OptionalBuildExtension(BuildExtension):
        """Build the extension if possible; a failed build leaves a working pure-Python package."""

        def run(self) -> None:
            try:
                super().run()
            except Exception as exc:  # noqa: BLE001 - any compiler failure makes the build optional
                print(f"wc_fast: native extension not built ({exc}); "
                      "backend='native' will be unavailable", file=sys.stderr)

    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cpp"))
    if not sources:
        return [], {}
    # No -std flag: BuildExtension passes the standard the installed torch's headers need.
    # -g0 drops the -g of Python's CFLAGS (debug info slows the build and bloats the library).
    ext = CppExtension(
        "wc_kernels._native",
        sources,
        extra_compile_args=["-O3", "-fopenmp", "-g0"],
        extra_link_args=["-fopenmp"],
    )
    return [ext], {"build_ext": OptionalBuildExtension.with_options(use_ninja=False)}


ext_modules, cmdclass = native_extensions()
setup(packages=packages(), ext_modules=ext_modules, cmdclass=cmdclass)
