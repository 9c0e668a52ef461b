"""The shape of the package: no import cycles among envrl's modules, and no module reaching
into another's private names.

Both are read from the source with :mod:`ast` (nothing is imported), counting every
``import envrl...`` and ``from envrl... import`` (absolute or relative), at module level and
inside functions alike: a lazy import inside a function only hides a cycle until the day
someone moves it to the top. An import names the module it names: ``from envrl.envs.vector.base
import X`` is an edge to ``envrl.envs.vector.base``, and ``from envrl.envs import vector`` one
to ``envrl.envs.vector`` (a submodule). That Python also runs a submodule's parent packages
first is not an edge: a package's ``__init__`` that imports its own submodules is the normal
case, not a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "envrl"


def _modules() -> dict[str, Path]:
    """Every module under envrl/, by dotted name (a package by its name, for its ``__init__``)."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, str, int]]:
    """(module imported from, name imported or "", line) for each envrl import in module ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "envrl" or alias.name.startswith("envrl."):
                    yield alias.name, "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source == "envrl" or source.startswith("envrl."):
                for alias in node.names:
                    yield source, alias.name, node.lineno


def import_graph() -> dict[str, set[str]]:
    """module -> the envrl modules it imports (see the module docstring for what counts)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for source, imported, _ in _imports(name, path):
            submodule = f"{source}.{imported}"
            targets.add(submodule if imported and submodule in MODULES else source)
        graph[name] = targets - {name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (each holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph is small enough to recurse
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_import_graph_is_read():
    """Guards the test below against reading nothing: known edges, lazy ones included, are there."""
    graph = import_graph()
    assert "envrl.envs" in graph["envrl"]
    assert "envrl.envs.vector.ray_backend" in graph["envrl.envs.vector"]  # inside make_vec
    assert "envrl.ray_cluster" in graph["envrl.evaluation.runner"]  # inside functions only
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph = import_graph()
    unknown = sorted(
        {f"{module} -> {target}" for module, targets in graph.items() for target in targets if target not in MODULES}
    )
    assert not unknown, f"imports of envrl modules that do not exist: {unknown}"
    cycles = find_cycles(graph)
    described = ["; ".join(f"{m} -> {sorted(graph[m] & set(cycle))}" for m in cycle) for cycle in cycles]
    assert not cycles, "import cycles among envrl modules:\n" + "\n".join(described)


def test_no_module_imports_another_modules_private_names():
    offences = []
    for name, path in MODULES.items():
        for source, imported, line in _imports(name, path):
            private = imported.startswith("_") and not (imported.startswith("__") and imported.endswith("__"))
            if private and source != name:
                offences.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: from {source} import {imported}")
    assert not offences, "private names imported across modules:\n" + "\n".join(offences)


#: what each layer may import from envrl (docs/design.md, Layers); the shared utilities
#: (processes, ray_cluster, cache, ports, testing) are open to every layer
LAYERS = {
    "envrl.envs": (),
    "envrl.agents": (),
    "envrl.evaluation": ("envrl.envs", "envrl.agents"),
    "envrl.training": ("envrl.envs", "envrl.agents", "envrl.evaluation"),
    "envrl.integrations": ("envrl.envs", "envrl.agents"),
}
UTILITIES = ("envrl.processes", "envrl.ray_cluster", "envrl.cache", "envrl.ports", "envrl.testing")


def _layer(module: str) -> str | None:
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


def test_layers_import_only_what_they_may():
    """Envs import no agents or evaluation; agents no envs or evaluation; evaluation no CLI or training;
    training only envs, agents and evaluation; integrations only envs and agents. Nothing imports
    training or integrations (no layer lists them)."""
    offences = []
    for module, targets in import_graph().items():
        layer = _layer(module)
        if layer is None:
            continue
        allowed = (layer, *LAYERS[layer], *UTILITIES)
        for target in sorted(targets):
            if target != "envrl" and not any(target == a or target.startswith(a + ".") for a in allowed):
                offences.append(f"{module} -> {target}")
    assert not offences, "imports across layers:\n" + "\n".join(offences)


def _context_members() -> set[str]:
    """The names :class:`~envrl.training.algorithms.base.TrainingContext` declares."""
    tree = ast.parse((PACKAGE_DIR / "training" / "algorithms" / "base.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainingContext":
            return {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
    raise AssertionError("algorithms/base.py defines no TrainingContext")


def test_algorithms_read_from_the_loop_only_what_the_training_context_declares():
    """``trainer.NAME`` in an algorithm module (and ``getattr(trainer, "NAME", ...)``) names a member
    of ``TrainingContext``: an algorithm that reaches for more of the loop makes the protocol lie."""
    members = _context_members()
    assert {"policy", "config", "rank", "play"} <= members
    found = []
    for path in sorted((PACKAGE_DIR / "training" / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                found.append((path.name, node.attr, node.lineno))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "trainer"
                and isinstance(node.args[1], ast.Constant)
            ):
                found.append((path.name, str(node.args[1].value), node.lineno))
    assert found  # the walk sees the algorithms' reads
    outside = [f"{name}:{line} trainer.{attr}" for name, attr, line in found if attr not in members]
    assert not outside, outside
