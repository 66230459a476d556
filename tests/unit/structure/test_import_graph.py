"""The shape of `src/elastic_gpu`, checked (docs/architecture.md, "The tree"), and of the code
beside it: the test helpers (`tests/egpu_testing`), the benches (`bench/`) and the tests.

Read from the source with `ast`, never by importing: an import inside a function counts like one
at the top, because a lazy import that breaks a circle at run time still ties the two modules
together for a reader. Only `if TYPE_CHECKING:` blocks are left out (they never run).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src"
PACKAGE = SRC / "elastic_gpu"
TESTS = ROOT / "tests"
#: The test doubles and bench helpers: a package on the tests' and benches' path.
TESTING = TESTS / "egpu_testing"
BENCH = ROOT / "bench"

#: Files written by a generator, not by hand.
GENERATED = ("_pb2.py", "_pb2_grpc.py")
MAX_LINES = 600

#: Which top-level packages each may import (besides itself). The arrows point down only:
#: core is pure, api is wire contracts over core, kube is the only API I/O, runtime is the
#: process plumbing; the components sit on those and never on each other.
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "api": {"core"},
    "kube": {"api", "core"},
    "runtime": {"api", "core"},
    "sim": {"core"},
    "scheduler": {"api", "core", "kube", "runtime"},
    "agent": {"api", "core", "kube", "runtime"},
    "webhook": {"api", "core", "kube", "runtime"},
    "controller": {"api", "core", "kube", "runtime"},
    "devcluster": {"api", "core", "kube", "runtime", "agent", "scheduler", "webhook",
                   "controller"},
    "cli": {"api", "core", "kube", "runtime", "sim", "scheduler", "agent", "webhook",
            "controller", "devcluster"},
}


def _module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield _module_name(path), path, ast.parse(path.read_text(), str(path))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk_runtime(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking(child):
            yield from (n for stmt in child.orelse for n in _walk_runtime_self(stmt))
            continue
        yield child
        yield from _walk_runtime(child)


def _walk_runtime_self(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    yield from _walk_runtime(node)


def _imports(module: str, tree: ast.Module, is_package: bool) -> Iterator[str]:
    """The names `tree` imports, absolute: `import x.y` yields x.y; `from x import y` yields
    x.y and, unless x.y is a module of ours (the usual way to import a module of a package),
    x itself."""
    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
            yield from names
            if not all(name in _MODULES for name in names):
                yield base


_MODULES = frozenset([*(_module_name(path) for path in PACKAGE.rglob("*.py")),
                      *(_module_name(path, TESTS) for path in TESTING.rglob("*.py"))])


def _graph() -> dict[str, set[str]]:
    sources = list(_sources())
    ours = {name for name, _, _ in sources}
    graph: dict[str, set[str]] = {}
    for name, path, tree in sources:
        targets = set()
        for target in _imports(name, tree, path.name == "__init__.py"):
            if target in ours and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
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
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_circle() -> None:
    # A package's __init__ importing its own modules is how a package re-exports; a module
    # importing its package's __init__ back would close a circle and is caught here.
    assert _cycles(_graph()) == []


def test_packages_import_only_downwards() -> None:
    wrong = []
    for module, targets in sorted(_graph().items()):
        top = _top(module)
        if top not in MAY_IMPORT:
            continue
        for target in sorted(targets):
            other = _top(target)
            if other and other != top and other not in MAY_IMPORT[top]:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


#: The agent's two node modes (`agent.nodemode`, docs/agent.md): each builds on what a node is
#: (the shared agent modules), never on the other; the shared modules know neither. Only
#: `agent.runtime`, which picks the mode from the config, imports both.
AGENT_MODES = ("elastic_gpu.agent.deviceplugin", "elastic_gpu.agent.dra")
AGENT_MODE_PICKER = "elastic_gpu.agent.runtime"


def _agent_mode(module: str) -> str | None:
    return next((mode for mode in AGENT_MODES
                 if module == mode or module.startswith(mode + ".")), None)


def test_agent_node_modes_stay_apart_and_the_shared_agent_knows_neither() -> None:
    wrong = []
    for module, targets in sorted(_graph().items()):
        if _top(module) != "agent" or module == AGENT_MODE_PICKER:
            continue
        mine = _agent_mode(module)
        wrong.extend(f"{module} imports {target}" for target in sorted(targets)
                     if (theirs := _agent_mode(target)) is not None and theirs != mine)
    assert wrong == []


def test_every_top_level_package_has_a_layer() -> None:
    tops = {path.name for path in PACKAGE.iterdir()
            if path.is_dir() and (path / "__init__.py").exists()}
    assert tops == set(MAY_IMPORT)
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]


def test_no_file_is_too_long_to_read_in_one_sitting() -> None:
    long = {str(path.relative_to(SRC)): n for path in PACKAGE.rglob("*.py")
            if not path.name.endswith(GENERATED)
            and (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_core_imports_only_numpy_and_itself() -> None:
    allowed = {"numpy", "elastic_gpu"}
    wrong = []
    for module, path, tree in _sources():
        if _top(module) != "core":
            continue
        for target in _imports(module, tree, path.name == "__init__.py"):
            root = target.split(".")[0]
            if root and root not in allowed and root not in _STDLIB:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


_STDLIB = frozenset(__import__("sys").stdlib_module_names) | {"__future__"}


@pytest.mark.parametrize("library", ["lightkube", "httpx", "httpx2"])
def test_api_client_libraries_only_inside_kube(library: str) -> None:
    wrong = [module for module, path, tree in _sources() if _top(module) != "kube"
             and any(t.split(".")[0] == library
                     for t in _imports(module, tree, path.name == "__init__.py"))]
    assert wrong == []


def test_no_pytest_in_the_installed_package() -> None:
    wrong = [module for module, path, tree in _sources()
             if any(t.split(".")[0] in {"pytest", "_pytest"}
                    for t in _imports(module, tree, path.name == "__init__.py"))]
    assert wrong == []


def test_every_watch_loop_is_kube_informer() -> None:
    """A watch is opened only in `kube/` (the informer and the transport under it): outside it
    nobody calls a `.watch(...)` method or asks for `watch=true`."""
    wrong = []
    for module, _, tree in _sources():
        if _top(module) == "kube":
            continue
        for node in _walk_runtime(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "watch"):
                wrong.append(f"{module}:{node.lineno} calls .watch()")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    "watch=true" in node.value.lower() or "watch=1" in node.value):
                wrong.append(f"{module}:{node.lineno} asks for watch=true")
    assert wrong == []


#: prometheus_client's own HTTP servers: a second `/metrics` implementation beside
#: `runtime/metrics.py` (its content negotiation, its shutdown, its logging).
_OTHER_METRICS_SERVERS = frozenset({"start_http_server", "start_wsgi_server", "make_wsgi_app",
                                    "MetricsHandler"})


def test_one_metrics_server_implementation() -> None:
    """Every `/metrics` page is `runtime/metrics.py`'s: nothing in the package names
    prometheus_client's own servers (imported, called or looked up as an attribute)."""
    wrong = []
    for module, _, tree in _sources():
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.ImportFrom)
                     else [node.attr] if isinstance(node, ast.Attribute)
                     else [node.id] if isinstance(node, ast.Name) else [])
            line = getattr(node, "lineno", 0)
            wrong += [f"{module}:{line} {name}" for name in names
                      if name in _OTHER_METRICS_SERVERS]
    assert wrong == []


# The whole tree: the package and egpu_testing by their dotted names; a bench or a test module by
# its path, since each runs with its own folder first on sys.path (a script's folder; pytest's
# default "prepend" import mode for test folders without __init__.py), so a bare `import x`
# there means the x.py beside it.

def _tree_sources() -> Iterator[tuple[str, Path, ast.Module]]:
    yield from _sources()
    for path in sorted(TESTS.rglob("*.py")):
        name = (_module_name(path, TESTS) if TESTING in path.parents
                else str(path.relative_to(ROOT)))
        yield name, path, ast.parse(path.read_text(), str(path))
    for path in sorted(BENCH.glob("*.py")):
        yield str(path.relative_to(ROOT)), path, ast.parse(path.read_text(), str(path))


@functools.cache  # parsed once for the tests below (~600 files)
def _tree_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path, tree in _tree_sources():
        targets = set()
        for target in _imports(name, tree, path.name == "__init__.py"):
            beside = path.parent / f"{target.replace('.', '/')}.py"
            if target in _MODULES:
                targets.add(target)
            elif "/" in name and beside.exists():
                targets.add(str(beside.relative_to(ROOT)))
        graph[name] = targets - {name}
    return graph


def _part(module: str) -> str:
    """Which part of the tree a module is: package, testing, bench or tests."""
    if module.startswith("elastic_gpu"):
        return "package"
    if module.startswith("egpu_testing"):
        return "testing"
    return "bench" if module.startswith("bench/") else "tests"


#: Which parts of the tree each may import (besides itself): the package stands alone; the test
#: helpers drive the package; a bench drives the package through the helpers and may reuse
#: another bench; no bench and no helper leans on a test module.
PART_MAY_IMPORT: dict[str, set[str]] = {
    "package": set(),
    "testing": {"package"},
    "bench": {"package", "testing"},
    "tests": {"package", "testing"},
}


def test_no_import_circle_anywhere_in_the_tree() -> None:
    assert _cycles(_tree_graph()) == []


def test_parts_of_the_tree_import_only_downwards() -> None:
    wrong = [f"{module} imports {target}" for module, targets in sorted(_tree_graph().items())
             for target in sorted(targets)
             if _part(target) != _part(module)
             and _part(target) not in PART_MAY_IMPORT[_part(module)]]
    assert wrong == []


def test_no_module_imports_a_test_module() -> None:
    """What tests share is a helper (egpu_testing, or a folder's *_helpers.py), never another
    test file: importing one ties a test to another's fixtures and collection."""
    wrong = [f"{module} imports {target}" for module, targets in sorted(_tree_graph().items())
             for target in sorted(targets) if Path(target).name.startswith("test_")]
    assert wrong == []


def test_the_tree_graph_sees_bench_and_test_modules_import_each_other() -> None:
    """The tests above would pass vacuously if bare imports between scripts were missed."""
    graph = _tree_graph()
    assert "bench/sched_scale.py" in graph["bench/sched_ready.py"]
    assert "tests/unit/sim/sim_helpers.py" in graph["tests/unit/sim/test_sim_defrag.py"]
    assert "egpu_testing.workbench" in graph["bench/sched_throughput.py"]
