"""The package's import graph, read from the source (every import, those inside functions and
``TYPE_CHECKING`` blocks included): no cycle; the update rules never import the trainer; the
trainer imports no evaluation module; only the reward package dispatches on a reward's
kind; the packages by role import only the layers below them."""

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
    assert "wc_fast.rl.updates.base" in GRAPH["wc_fast.rl.updates.nft"]
    assert "wc_fast.rewards" in GRAPH["wc_fast.rl.trainer"]
    assert len(GRAPH) > 100


def test_no_import_cycle():
    assert _cycles() == []


@pytest.mark.parametrize("rule", sorted(m for m in MODULES if m.startswith("wc_fast.rl.updates")))
def test_no_update_rule_imports_the_trainer(rule):
    assert "wc_fast.rl.trainer" not in GRAPH[rule]


def test_the_trainer_imports_no_evaluation_module():
    assert not {m for m in GRAPH["wc_fast.rl.trainer"]
                if m == "wc_fast.eval" or m.startswith("wc_fast.measures")}


# the packages by role, each with the packages it may import: the infrastructure and the world
# sit below the models, rewards and measures, the RL loop above them, the entry points on top
# (only programs import an entry point)
ENTRY_POINTS = ("wc_fast.train", "wc_fast.eval", "wc_fast.generate", "wc_fast.pretrain")
LAYERS = {
    "wc_fast.config": set(),
    "wc_fast.actions": set(),
    "wc_fast.cli": {"wc_fast.config"},
    "wc_fast.infra": {"wc_fast.config"},
    "wc_fast.world": {"wc_fast.actions", "wc_fast.infra"},
    "wc_fast.models": {"wc_fast.actions", "wc_fast.config", "wc_fast.infra", "wc_fast.world"},
    "wc_fast.rewards": {"wc_fast.actions", "wc_fast.config", "wc_fast.infra", "wc_fast.world"},
    "wc_fast.measures": {"wc_fast.actions", "wc_fast.infra", "wc_fast.rewards", "wc_fast.world"},
    "wc_fast.rl": {"wc_fast.actions", "wc_fast.config", "wc_fast.infra", "wc_fast.models",
                   "wc_fast.rewards", "wc_fast.world"},
}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_package_imports_only_the_layers_below_it(package):
    reached = {_package(target) for name, targets in GRAPH.items()
               if _package(name) == package for target in targets
               if target.startswith("wc_fast.") and _package(target) != package}
    assert reached <= LAYERS[package], f"{package} imports {sorted(reached - LAYERS[package])}"


def test_no_library_module_imports_an_entry_point():
    programs = ENTRY_POINTS + ("wc_fast.tools",)
    assert sorted(f"{name} -> {target}" for name, targets in GRAPH.items()
                  if name.startswith("wc_fast.") and not name.startswith(programs)
                  for target in targets if target in ENTRY_POINTS) == []


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
