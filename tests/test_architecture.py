"""The shape of the package: no import cycles among envrl's modules, no module reaching
into another's private names (imported or read as attributes), agents that never reach envs
(not even through ``import envrl``), and tests that use only public names.

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
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "envrl"
TESTS_DIR = Path(__file__).resolve().parent


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


def _private(name: str) -> bool:
    """One leading underscore, not a dunder: ``_x`` is private, ``__init__`` is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name; None when the chain starts elsewhere (a call)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _constant_attribute(node: ast.AST) -> tuple[str, ast.expr, str] | None:
    """(function, object, name) for ``getattr(obj, "name", ...)`` and its siblings (``setattr``,
    ``monkeypatch.setattr``, ...): an attribute access by another spelling."""
    if not (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
        return None
    function = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    if function in ("getattr", "hasattr", "setattr", "delattr") and isinstance(node.args[1].value, str):
        return function, node.args[0], node.args[1].value
    return None


# ---- agents do not reach envs -----------------------------------------------------------------


_ENV_ID = re.compile(r"envrl/\w+-v\d+")


def envs_reaches(source: str) -> list[str]:
    """Where an agent module's ``source`` reaches envs: an import of ``envrl.envs`` or below (``from
    envrl import envs`` too), a bare ``import envrl`` (it runs ``envrl.envs`` to register the env
    ids: what else would an agent want it for), an ``envrl.envs...`` attribute, or an env id
    (``"envrl/ALFWorld-v0"``: an agent that makes its own env). Relative imports are the import
    graph's (see the test)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "envrl" or alias.name == "envrl.envs" or alias.name.startswith("envrl.envs."):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if (
                module == "envrl.envs"
                or module.startswith("envrl.envs.")
                or (module == "envrl" and any(alias.name == "envs" for alias in node.names))
            ):
                found.append(f"{node.lineno}: from {module} import ...")
        elif isinstance(node, ast.Attribute) and _dotted(node) == "envrl.envs":
            found.append(f"{node.lineno}: envrl.envs")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENV_ID.search(node.value):
            found.append(f"{node.lineno}: {node.value!r}")
    return found


def test_the_envs_reach_check_sees_every_spelling():
    """Guards the test below against passing by reading nothing."""
    assert envs_reaches("import envrl\ngym.make(envrl.envs.REGISTRY)") == ["1: import envrl", "2: envrl.envs"]
    assert envs_reaches("def f():\n    from envrl import envs, agents") == ["2: from envrl import ..."]
    assert envs_reaches("from envrl.envs.alfworld.env import split_games") == [
        "1: from envrl.envs.alfworld.env import ..."
    ]
    assert envs_reaches('env = gym.make("envrl/ALFWorld-v0", split="train")') == ["1: 'envrl/ALFWorld-v0'"]
    assert envs_reaches("import envrl.agents.base\nfrom envrl.agents import make_agent") == []


def test_agents_do_not_reach_envs():
    """An agent acts through the env's text API (observations, info, actions) only: it neither
    imports envs nor makes them (a module that needs both, like the ALFWorld prior's regeneration,
    lives outside the agents)."""
    agents = {name: path for name, path in MODULES.items() if _layer(name) == "envrl.agents"}
    assert len(agents) > 5
    graph = import_graph()
    offences = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{where}"
        for path in agents.values()
        for where in envs_reaches(path.read_text(encoding="utf-8"))
    ]
    offences += [
        f"{name} -> {target}" for name in agents for target in sorted(graph[name]) if _layer(target) == "envrl.envs"
    ]
    assert not offences, "agents reaching envs:\n" + "\n".join(offences)


# ---- no module reads another module's private attributes --------------------------------------

#: (module file, private attribute) -> why envrl reads a third-party library's internals there;
#: an envrl module reading another envrl module's private attribute is fixed, not listed here
FOREIGN_INTERNALS = {
    ("envrl/envs/alfworld/grammar.py", "_ModelConverter"): (
        "TextWorld's grammar converter: the cached parse must convert each part exactly as GameLogic does"
    ),
    ("envrl/envs/alfworld/grammar.py", "_unescape_block"): (
        "the same converter's unescaping of a grammar block, which GameLogic applies and exposes nowhere else"
    ),
    ("envrl/envs/alfworld/generate.py", "_parse_and_convert"): (
        "TextWorld's parse functions, memoized in the generation workers; TextWorld has no public hook"
    ),
    ("envrl/envs/alfworld/generate.py", "_inheriting"): (
        "multiprocessing's flag for a spawned child importing the main script: fail there instead of deadlocking"
    ),
    ("envrl/envs/scienceworld/engine.py", "_gateway_client"): (
        "py4j's client, whose sockets a forked child must close without py4j's shutdown of the parent's"
    ),
}
#: underscored names that are documented public API
PUBLIC_UNDERSCORED = {"os._exit"}


def _defined_here(tree: ast.Module) -> set[str]:
    """The names a module defines: functions, classes, module-level and class-level assignments, and
    attributes it assigns (``self._x = ...``, ``handler._seen = ...``) on anything but a name it
    imported: setting another module's attribute patches that module, it defines nothing here."""
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    scopes = [tree.body] + [node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    names = {
        target.id
        for body in scopes
        for statement in body
        if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (statement.targets if isinstance(statement, ast.Assign) else [statement.target])
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            root = (_dotted(node) or "").split(".")[0]
            if root not in imported:
                names.add(node.attr)
        elif (access := _constant_attribute(node)) and access[0] == "setattr":
            root = (_dotted(access[1]) or "").split(".")[0]
            if root not in imported:
                names.add(access[2])
    return names


def private_reads(source: str) -> list[tuple[int, str, str]]:
    """(line, expression, attribute) for each ``obj._name`` (or ``getattr(obj, "_name")``) in
    ``source`` whose ``_name`` the module does not define, ``obj`` being neither ``self`` nor ``cls``."""
    tree = ast.parse(source)
    defined = _defined_here(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            target, name = node.value, node.attr
        elif access := _constant_attribute(node):
            _, target, name = access
        else:
            continue
        if not _private(name) or name in defined or (isinstance(target, ast.Name) and target.id in ("self", "cls")):
            continue
        expression = ast.unparse(node)
        if expression not in PUBLIC_UNDERSCORED:
            found.append((getattr(node, "lineno", 0), expression, name))
    return found


def test_the_private_read_check_finds_a_known_violation():
    """Guards the test below against passing by reading nothing."""
    source = """
import textworld
from envrl.envs.alfworld import engine

class Env:
    _cache = None

    def __init__(self):
        self._engine = engine.AlfredEngine()
        self._engine._pddl_state = None  # assigned here: defined here

    def plan(self, other):
        textworld.logic._parse_and_convert = None  # patches textworld: defines nothing here
        return other._engine, self._secret, cls_of(other)._cache, engine._helper(), getattr(other, "_infos")

def exit_now():
    import os
    os._exit(1)
"""
    found = sorted((line, name) for line, _, name in private_reads(source))
    assert found == [(13, "_parse_and_convert"), (14, "_helper"), (14, "_infos")], found


def test_no_module_reads_another_modules_private_attributes():
    """``obj._name`` names something of this module, or of ``self``/``cls``; anything else is a
    dependency on another module's internals. Third-party internals that envrl genuinely needs are
    in FOREIGN_INTERNALS, each with its reason; an entry that is no longer used fails too."""
    offences, used = [], set()
    for path in MODULES.values():
        relative = path.relative_to(PACKAGE_DIR.parent).as_posix()
        for line, expression, name in private_reads(path.read_text(encoding="utf-8")):
            if (relative, name) in FOREIGN_INTERNALS:
                used.add((relative, name))
            else:
                offences.append(f"{relative}:{line}: {expression}")
    assert not offences, "private attributes read across modules:\n" + "\n".join(offences)
    assert used == set(FOREIGN_INTERNALS), f"allow-list entries nothing reads: {set(FOREIGN_INTERNALS) - used}"


# ---- tests use only public names ----------------------------------------------------------------

_DOTTED_PATH = re.compile(r"envrl(\.\w+)+")


def private_name_uses(source: str) -> list[str]:
    """Where a test's ``source`` uses a private envrl name: ``from envrl.x import _y`` (anywhere),
    ``m._y`` or ``getattr(m, "_y")``/``monkeypatch.setattr(m, "_y", ...)`` on a name bound to an
    envrl module (``import envrl.x as m``, ``from envrl import x``), or a patch target string
    ``"envrl.x._y"``."""
    tree = ast.parse(source)
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update((a.asname or a.name.split(".")[0]) for a in node.names if a.name.split(".")[0] == "envrl")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "envrl":
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                elif f"{node.module}.{alias.name}" in MODULES:
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            target, name = node.value, node.attr
        elif access := _constant_attribute(node):
            _, target, name = access
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED_PATH.fullmatch(node.value):
            if any(_private(part) for part in node.value.split(".")):
                found.append(f"{node.lineno}: {node.value!r}")
            continue
        else:
            continue
        root = (_dotted(target) or "").split(".")[0]
        if _private(name) and root in modules:
            found.append(f"{getattr(node, 'lineno', 0)}: {ast.unparse(node)}")
    return found


def test_the_test_check_finds_known_violations():
    """Guards the test below against passing by reading nothing."""
    source = """
import envrl.training.loop as loop
from envrl.envs.alfworld import translations
from envrl.agents.base import Agent

def test_it(monkeypatch):
    from envrl.ray_cluster import _check_reachable
    loop._schedule(None)
    monkeypatch.setattr(translations, "_DEFAULT_CACHE", None)
    monkeypatch.setattr("envrl.evaluation.runner._probe_env", None)
    Agent._hidden, loop.lr_schedule
"""
    assert sorted(int(f.split(":")[0]) for f in private_name_uses(source)) == [7, 8, 9, 10], private_name_uses(source)


def test_no_test_uses_a_private_name():
    """A test that needs a private function tests a unit worth a public name, or should go through
    the public API: either way, renaming an internal never breaks a test."""
    files = sorted(TESTS_DIR.rglob("*.py"))
    assert len(files) > 20
    offences = [
        f"{path.relative_to(TESTS_DIR.parent)}:{where}"
        for path in files
        if path.name != Path(__file__).name  # this file's guard quotes violations on purpose
        for where in private_name_uses(path.read_text(encoding="utf-8"))
    ]
    assert not offences, "tests using private envrl names:\n" + "\n".join(offences)
