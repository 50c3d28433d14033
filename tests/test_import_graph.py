"""The package's import graph, read from the source (every import, those inside functions and
``TYPE_CHECKING`` blocks included): no cycle; the update rules never import the trainer; the
trainer imports no evaluation module; only the reward package dispatches on a reward's
kind."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wc_fast", "wc_kernels")
# the config fields that choose a reward: only the reward package (and the config, which
# defines and validates them) may read them; ``critic`` counts only as ``reward.critic`` (the
# name is also a model's)
REWARD_CHOICES = ("if_kind", "if_reader", "vq_mode", "reader_checkpoint", "critic_checkpoint")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports: for ``from X import y``, ``X.y`` when it is a
    module, else ``X``; the packages above each (they run first), except ``name``'s own."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[:len(package) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                module = ".".join(parts[:i])
                if module in MODULES and not (name + ".").startswith(module + "."):
                    found.add(module)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    assert "wc_fast.updates.base" in GRAPH["wc_fast.updates.nft"]
    assert "wc_fast.rewards" in GRAPH["wc_fast.trainer"]
    assert len(GRAPH) > 100


def test_no_import_cycle():
    assert _cycles() == []


@pytest.mark.parametrize("rule", sorted(m for m in MODULES if m.startswith("wc_fast.updates")))
def test_no_update_rule_imports_the_trainer(rule):
    assert "wc_fast.trainer" not in GRAPH[rule]


def test_the_trainer_imports_no_evaluation_module():
    assert not {m for m in GRAPH["wc_fast.trainer"] if m.startswith("wc_fast.evaluation")}


def _reads_reward_choice(path: Path) -> list[str]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        of_reward = isinstance(node.value, ast.Attribute) and node.value.attr == "reward"
        if node.attr in REWARD_CHOICES or (node.attr == "critic" and of_reward):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    return hits


def test_only_the_reward_package_reads_which_reward_to_build():
    outside = [path for name, path in MODULES.items() if name.startswith("wc_fast")
               and not name.startswith(("wc_fast.rewards", "wc_fast.config"))]
    assert [hit for path in outside for hit in _reads_reward_choice(path)] == []
