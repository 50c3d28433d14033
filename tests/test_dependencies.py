"""Every third-party import is declared in ``pyproject.toml``, and a core install (no extras)
imports the entry points and the ops.

The first test reads the imports of every Python file of the package, the tests, the
benchmarks and the studies from their syntax trees and checks each against the declared
requirements: core for what ``wc_fast`` and ``wc_kernels`` import at module level (outside the
modules of an extra), core or an extra for everything else. The second imports the entry
points in a child process where every non-core distribution is hidden, as after a plain
``pip install wc_fast``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"wc_fast", "wc_kernels", "studies"}
SCANNED = ("wc_fast", "wc_kernels", "studies", "tests", "bench", "setup.py")
# import name -> distribution, where they differ
DISTRIBUTION = {"PIL": "pillow", "pynvml": "nvidia-ml-py", "flash_attn": "flash-attn",
                "yaml": "pyyaml"}
# imports that are not dependencies of the project, and why
NOT_DEPENDENCIES = {
    "hyvideo": "the official HY-WorldPlay checkout, which studies/make_worldplay_fixture.py "
               "imports from a path the user gives to build a test fixture",
    "kernels": "PyPI's hub kernel loader: .ci/run installs it to check that it coexists with "
               "wc_kernels (tests/check_kernels_coexist.py)",
}
# modules of the package that belong to an extra: they may import it at module level, and no
# core entry point imports them at module level (the second test)
EXTRA_MODULES = {
    "wc_fast/models/wan/model.py": "wan",
    "wc_fast/models/wan/embedded.py": "wan",
    "wc_fast/models/wan/vae.py": "wan",
    "wc_fast/models/worldplay/model.py": "wan",
    "wc_fast/models/worldplay/modules.py": "wan",
    "wc_fast/models/worldplay/tiny.py": "wan",
    "wc_fast/models/worldplay/vae.py": "wan",
}
ENTRY_POINTS = ("wc_fast.train", "wc_fast.eval", "wc_fast.pretrain", "wc_fast.tools.compare",
                "wc_fast.tools.train_reward_models", "wc_kernels", "wc_kernels.aot")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalize(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0))


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """Core distributions (with the build requirements) and those of each extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    core = {requirement_name(r) for r in project["project"]["dependencies"]}
    core |= {requirement_name(r) for r in project["build-system"]["requires"]}
    extras = {name: {requirement_name(r) for r in reqs}
              for name, reqs in project["project"]["optional-dependencies"].items()}
    return core, extras


def local_modules() -> set[str]:
    """Modules the tests and benchmarks import from their own folders (conftest, helpers)."""
    return {p.stem for folder in ("tests", "bench") for p in (ROOT / folder).rglob("*.py")}


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path) -> list[tuple[str, bool]]:
    """``(top-level module, at module level?)`` of every absolute import in ``path``; imports
    under ``if TYPE_CHECKING`` are skipped (they never run)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[0], top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.split(".")[0], top))
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda, ast.ClassDef))
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), True)
    return found


def python_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        files.extend([path] if path.is_file() else sorted(path.rglob("*.py")))
    return files


def test_every_third_party_import_is_declared():
    core, extras = declared()
    anywhere = core.union(*extras.values())
    skip = set(sys.stdlib_module_names) | FIRST_PARTY | local_modules() | set(NOT_DEPENDENCIES)
    undeclared, not_core = [], []
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        package_module = rel.startswith(("wc_fast/", "wc_kernels/")) and rel not in EXTRA_MODULES
        for module, top in imports(path):
            if module in skip:
                continue
            dist = normalize(DISTRIBUTION.get(module, module))
            if dist not in anywhere:
                undeclared.append(f"{rel}: {module} ({dist})")
            elif package_module and top and dist not in core:
                not_core.append(f"{rel}: {module} ({dist})")
    assert not undeclared, f"imports no requirement or extra declares: {undeclared}"
    assert not not_core, ("module-level imports of an extra in a core module (import it where "
                          f"it is used, through wc_fast.infra.extras.require): {not_core}")


def test_the_scan_sees_imports_in_functions_and_skips_type_checking(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(textwrap.dedent("""
        import numpy as np
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import diffusers
        def f():
            import peft
        class C:
            from PIL import Image
    """))
    assert imports(source) == [("numpy", True), ("typing", True), ("peft", False),
                               ("PIL", False)]


def test_every_extra_module_exists():
    assert all((ROOT / rel).is_file() for rel in EXTRA_MODULES)


CORE_ONLY = """
import importlib, importlib.metadata, sys
allowed = set(sys.argv[1].split(","))
hidden = set()
for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"].lower().replace("_", "-")
    if name not in allowed:
        hidden |= {line.split("/")[0].split(".")[0] for line in (dist.read_text("top_level.txt")
                   or "").split()}
        hidden |= {str(f).split("/")[0].removesuffix(".py") for f in (dist.files or [])
                   if "/" not in str(f) or str(f).split("/")[0].isidentifier()}
hidden -= {"wc_fast", "wc_kernels", "studies", "_distutils_hack"}
for name in hidden:  # None in sys.modules: import fails, importlib.util.find_spec says None
    sys.modules[name] = None
for module in sys.argv[2].split(","):
    importlib.import_module(module)
from wc_fast.infra.extras import require
try:
    require("diffusers", user="model.backbone wan")
except ModuleNotFoundError as exc:
    print("MISSING", exc)
print("imported", len(sys.argv[2].split(",")))
"""


def core_closure(core: set[str]) -> set[str]:
    """The core distributions and everything they require, as installed here."""
    import importlib.metadata

    seen, todo = set(), list(core)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo.extend(requirement_name(r) for r in requires if "extra ==" not in r)
    return seen


@pytest.mark.slow
def test_entry_points_import_with_the_core_requirements_alone():
    """Every non-core distribution hidden (diffusers, peft, scipy, the trackers...): the entry
    points and the ops import, and an optional one, asked for, names its extra."""
    core, _ = declared()
    allowed = core_closure(core) | {"pip", "setuptools", "wc-fast"}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", CORE_ONLY, ",".join(sorted(allowed)),
                           ",".join(ENTRY_POINTS)], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported {len(ENTRY_POINTS)}" in done.stdout
    assert "MISSING model.backbone wan needs the diffusers package" in done.stdout
    assert "pip install 'wc_fast[wan]'" in done.stdout
