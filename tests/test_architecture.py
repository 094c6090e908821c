"""The package's architecture, read from its source with ``ast`` (imports inside functions included): no import
cycles between modules of ``topo_attn``, nor between its layers (the root ``__init__``, top-level modules,
subpackages); no private name (``_x``) of one package module imported or read by another, nor by the tests and
notebooks; the kernel modules importing nothing of the host layer; the language-model study (``lm``) and the
benchmark runner (``bench``) importing nothing of each other; ``import topo_attn`` loading none of the heavy
optional libraries. Each check is a function over module sources, also run here on small synthetic
packages that break it, so that each can fail."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "topo_attn"
ATTENTION_KERNELS = ("topo_attn.attention.forward", "topo_attn.attention.backward", "topo_attn.attention.decode",
                     "topo_attn.attention.hopper", "topo_attn.attention.hopper_backward",
                     "topo_attn.attention.hopper_dq")
LAUNCH = "topo_attn.launch"
"""The launch path that every kernel group may import (it imports nothing of the package)."""
GPU_KERNELS = "topo_attn.topology.gpu"
SELECTION_KERNELS = ("topo_attn.selection.quest_kernel", "topo_attn.selection.static_step_kernel")
HEAVY = ("matplotlib", "ipywidgets", "pandas", "triton")
SEPARATE = ("topo_attn.lm", "topo_attn.bench")
"""Subpackages that import nothing of each other: what both need (the commit of a result, the prefill timing)
lies below them."""


@dataclass(frozen=True)
class Module:
    """One module's source; ``is_package`` for an ``__init__.py``."""

    source: str
    is_package: bool = False


@dataclass(frozen=True)
class Import:
    """``importer`` imports the module ``target`` (at ``line``), taking ``names`` from it (empty for a plain
    import or a submodule)."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int


def package_modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Module]:
    """Every module under ``root/package`` by dotted name (``pkg.sub`` for ``pkg/sub/__init__.py``)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(path.read_text(), is_package)
    return modules


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _known_prefix(dotted: str, modules: dict[str, Module]) -> str | None:
    """The longest prefix of ``dotted`` that is one of ``modules``."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _from_base(importer: str, node: ast.ImportFrom, modules: dict[str, Module]) -> str:
    """The absolute module name of ``from <base> import ...`` in ``importer``."""
    if not node.level:
        return node.module or ""
    package = importer if modules[importer].is_package else importer.rpartition(".")[0]
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def imports(modules: dict[str, Module]) -> list[Import]:
    """Every import (at module level or inside functions and classes) of one of ``modules`` by another.
    ``from a import b`` imports the module ``a.b`` when there is one, else takes ``b`` from ``a``."""
    found = []
    for name, module in modules.items():
        for node in ast.walk(ast.parse(module.source)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _known_prefix(alias.name, modules)
                    if target is not None and target != name:
                        found.append(Import(name, target, (), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(name, node, modules)
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        found.append(Import(name, f"{base}.{alias.name}", (), node.lineno))
                    elif base in modules and base != name:
                        found.append(Import(name, base, (alias.name,), node.lineno))
    return found


def import_graph(found: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for imp in found:
        graph.setdefault(imp.importer, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:  # a shortest way back to the component's first module, inside it
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in {s for n in frontier for s in graph[n]}:
            nxt = []
            for n in frontier:
                for s in sorted(graph[n] & component):
                    if s not in paths:
                        paths[s] = paths[n] + [s]
                        nxt.append(s)
            frontier = nxt
        last = next(n for n in frontier if start in graph[n])
        cycles.append(paths[last] + [start])
    return cycles


def layer(module: str, package: str = PACKAGE) -> str:
    """The unit of layering ``module`` belongs to: the package's ``__init__`` itself, a top-level module
    (``topo_attn.schedule``) or a subpackage (``topo_attn.attention`` for ``topo_attn.attention.forward``)."""
    return ".".join(module.split(".")[:2]) if module != package else package


def layer_graph(found: list[Import]) -> dict[str, set[str]]:
    """:func:`import_graph` with modules merged into their :func:`layer` (arrows inside a layer dropped)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        a, b = layer(imp.importer), layer(imp.target)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
    return graph


def _aliases(tree: ast.AST, importer: str, modules: dict[str, Module]) -> dict[str, str]:
    """Local names bound to package modules by the imports in ``tree`` (anywhere in it)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _known_prefix(alias.name, modules) is None:
                    continue
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(importer, node, modules)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        value = _dotted(node.value)
        return None if value is None else f"{value}.{node.attr}"
    return None


def private_uses(modules: dict[str, Module]) -> list[str]:
    """Private names (``_x``, not dunders) of one package module imported or read by another: ``from m import
    _x`` and ``m._x`` (best effort: ``m`` a name bound to a package module by an import). Importing a private
    *module* of the package (``from . import _checks``) is allowed."""
    found = []
    for imp in imports(modules):
        for name in imp.names:
            if is_private(name):
                found.append(f"{imp.importer}:{imp.line} imports {name} from {imp.target}")
    for name, module in modules.items():
        tree = ast.parse(module.source)
        bound = _aliases(tree, name, modules)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
                continue
            dotted = _dotted(node.value)
            if dotted is None or dotted.split(".")[0] not in bound:
                continue
            head, _, rest = dotted.partition(".")
            owner = bound[head] + (f".{rest}" if rest else "")
            if owner in modules and owner != name and f"{owner}.{node.attr}" not in modules:
                found.append(f"{name}:{node.lineno} reads {owner}.{node.attr}")
    return sorted(found)


def code_outside_the_package(root: Path = ROOT) -> dict[str, Module]:
    """The tests' Python files and the notebooks' code cells (IPython magics and shell lines dropped), by
    path; they use the package as any user does."""
    found = {str(p.relative_to(root)): Module(p.read_text()) for p in sorted((root / "tests").rglob("*.py"))}
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        lines = [line for cell in cells if cell["cell_type"] == "code"
                 for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith(("%", "!"))]
        found[str(path.relative_to(root))] = Module("\n".join(lines) + "\n")
    return found


def private_uses_from_outside(outside: dict[str, Module], modules: dict[str, Module]) -> list[str]:
    """Private names of package modules imported or read by code outside the package (``outside``)."""
    return [use for use in private_uses(modules | outside) if use.split(":")[0] in outside]


def kernel_group(module: str) -> str | None:
    """The kernel modules: the attention kernels (``forward``, ``backward``, ...), the selection kernels
    (Quest's scores) and the GPU schedule build (``topology.gpu`` and below); ``None`` for the host layer."""
    if module == LAUNCH:
        return "launch path"
    if module in ATTENTION_KERNELS:
        return "attention kernels"
    if module in SELECTION_KERNELS:
        return "selection kernels"
    if module == GPU_KERNELS or module.startswith(GPU_KERNELS + "."):
        return GPU_KERNELS
    return None


def kernel_imports_of_the_host(modules: dict[str, Module]) -> list[str]:
    """Imports by a kernel module of any package module outside its own kernel group and the launch path
    (:data:`LAUNCH`): the host layer, its subpackage's ``__init__`` and host modules included."""
    return [f"{imp.importer}:{imp.line} imports {imp.target}" for imp in imports(modules)
            if kernel_group(imp.importer) is not None
            and kernel_group(imp.target) not in (kernel_group(imp.importer), "launch path")]


def within(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or one of its modules."""
    return module == package or module.startswith(package + ".")


def imports_between_separate(modules: dict[str, Module], separate: tuple[str, ...] = SEPARATE) -> list[str]:
    """Imports by a module of one of the ``separate`` subpackages of a module of another (its ``__init__``
    included)."""
    return [f"{imp.importer}:{imp.line} imports {imp.target}" for imp in imports(modules)
            for a in separate for b in separate
            if a != b and within(imp.importer, a) and within(imp.target, b)]


def heavy_modules_loaded(statement: str) -> list[str]:
    """Which of :data:`HEAVY` are in ``sys.modules`` after ``statement`` runs in a fresh interpreter (no GPU
    visible, ``TRITON_INTERPRET`` unset)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    code = f"import sys\n{statement}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


# --- the package -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    found = package_modules()
    assert {"topo_attn", "topo_attn.schedule", "topo_attn.attention.forward", "topo_attn.bench.runner"} <= set(found)
    return found


def test_no_import_cycles(modules):
    cycles = find_cycles(import_graph(imports(modules)))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycles_between_layers(modules):
    """The root ``__init__`` (re-exports) imports the subpackages, so a module of a subpackage that imports
    ``topo_attn`` itself points up, even inside a function."""
    found = imports(modules)
    cycles = find_cycles(layer_graph(found))
    arrows = {(layer(i.importer), layer(i.target)): i for i in found}
    detail = [" -> ".join(c) + "\n    " + "\n    ".join(
        f"{arrows[a, b].importer}:{arrows[a, b].line} imports {arrows[a, b].target}" for a, b in zip(c, c[1:]))
        for c in cycles]
    assert not cycles, "import cycles between layers:\n" + "\n".join(detail)


def test_no_private_name_used_across_modules(modules):
    found = private_uses(modules)
    assert not found, "private names used outside their module:\n" + "\n".join(found)


def test_tests_and_notebooks_use_no_private_name_of_the_package(modules):
    found = private_uses_from_outside(code_outside_the_package(), modules)
    assert not found, "private names of the package used by tests or notebooks:\n" + "\n".join(found)


def test_kernels_import_nothing_of_the_host_layer(modules):
    assert {kernel_group(m) for m in modules} >= {"attention kernels", "selection kernels", GPU_KERNELS,
                                                  "launch path"}
    found = kernel_imports_of_the_host(modules)
    assert not found, "kernel modules importing outside their kernel group:\n" + "\n".join(found)


def test_lm_and_bench_import_nothing_of_each_other(modules):
    """The experiment layer (``topo_attn.lm``) does not import the benchmark runner (``topo_attn.bench``), nor
    the other way round: each reads its own result files."""
    assert {"topo_attn.lm.study", "topo_attn.bench.model"} <= set(modules)
    found = imports_between_separate(modules)
    assert not found, "imports between topo_attn.lm and topo_attn.bench:\n" + "\n".join(found)


def test_import_topo_attn_loads_no_heavy_library():
    assert heavy_modules_loaded("import topo_attn") == []


# --- each check can fail -----------------------------------------------------------------------------------


def synthetic(sources: dict[str, str], packages: tuple[str, ...] = ("pkg",)) -> dict[str, Module]:
    return {name: Module(source, name in packages) for name, source in sources.items()}


def test_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}}
    cycle, = find_cycles(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_resolve_relative_and_function_level_imports():
    mods = synthetic({
        "pkg": "from .low import helper\n",
        "pkg.low": "def helper():\n    from .high import run  # an arrow pointing up, inside a function\n",
        "pkg.high": "from . import low\nimport pkg.low as again\n",
        "pkg.sub": "", "pkg.sub.leaf": "from ..low import helper\nfrom .. import high\n",
    }, packages=("pkg", "pkg.sub"))
    edges = {(i.importer, i.target, i.names) for i in imports(mods)}
    assert edges == {("pkg", "pkg.low", ("helper",)), ("pkg.low", "pkg.high", ("run",)),
                     ("pkg.high", "pkg.low", ()), ("pkg.sub.leaf", "pkg.low", ("helper",)),
                     ("pkg.sub.leaf", "pkg.high", ())}
    cycle, = find_cycles(import_graph(imports(mods)))
    assert cycle == ["pkg.high", "pkg.low", "pkg.high"]


def test_layer_cycles_are_found():
    mods = synthetic({
        "pkg": "from .sub import f\n", "pkg.sub": "from .inner import f\n", "pkg.sub.inner": "",
        "pkg.sub.tool": "def main():\n    import pkg\n", "pkg.top": "import pkg\n",
    }, packages=("pkg", "pkg.sub"))
    assert find_cycles(import_graph(imports(mods))) == []  # no cycle between modules
    assert find_cycles(layer_graph(imports(mods))) == [["pkg", "pkg.sub", "pkg"]]


def test_private_uses_are_found():
    mods = synthetic({
        "pkg": "",
        "pkg.a": "_x = 1\n__all__ = []\n",
        "pkg.b": "from .a import _x, __all__\n",
        "pkg.c": ("from . import a\nimport pkg.a\nimport pkg.a as m\n"
                  "def f():\n    return a._x + pkg.a._x + m._x + a.__all__\n"),
        "pkg._private_module": "",
        "pkg.d": "from . import _private_module\nfrom ._private_module import public\n",
    })
    found = private_uses(mods)
    assert sorted(found) == ["pkg.b:1 imports _x from pkg.a", "pkg.c:5 reads pkg.a._x", "pkg.c:5 reads pkg.a._x",
                             "pkg.c:5 reads pkg.a._x"]


def test_private_uses_from_outside_are_found():
    mods = synthetic({"pkg": "", "pkg.a": "_x = 1\n"})
    outside = {"tests/test_a.py": Module("import pkg.a\nfrom pkg.a import _x\nprint(pkg.a._x)\n")}
    assert private_uses_from_outside(outside, mods) == ["tests/test_a.py:2 imports _x from pkg.a",
                                                        "tests/test_a.py:3 reads pkg.a._x"]


def test_kernel_imports_of_the_host_are_found():
    mods = synthetic({
        "topo_attn": "", "topo_attn.schedule": "", "topo_attn.attention": "",
        "topo_attn.attention.scheduled": "", "topo_attn.attention.forward": "import torch\n",
        "topo_attn.attention.backward": "from .forward import kernel\nfrom . import scheduled\n",
        "topo_attn.topology": "", "topo_attn.topology.gpu": "", "topo_attn.topology.gpu.rows": "from . import pdl\n",
        "topo_attn.topology.gpu.pdl": "def f():\n    from ...schedule import BlockSchedule\n",
        "topo_attn.topology.gpu.prim": "from ...launch import launch\n",  # the launch path: allowed
        "topo_attn.launch": "from .schedule import BlockSchedule\n",  # the launch path importing the host
    }, packages=("topo_attn", "topo_attn.attention", "topo_attn.topology", "topo_attn.topology.gpu"))
    assert sorted(kernel_imports_of_the_host(mods)) == [
        "topo_attn.attention.backward:2 imports topo_attn.attention.scheduled",
        "topo_attn.launch:1 imports topo_attn.schedule",
        "topo_attn.topology.gpu.pdl:2 imports topo_attn.schedule"]


def test_imports_between_separate_subpackages_are_found():
    mods = synthetic({
        "topo_attn": "", "topo_attn.provenance": "", "topo_attn.lm": "", "topo_attn.bench": "",
        "topo_attn.bench.results": "from ..provenance import code_version\n",
        "topo_attn.bench.model": "",
        "topo_attn.lm.study": ("from ..provenance import code_version\nfrom ..bench.results import ROOT\n"
                               "def speed():\n    from topo_attn.bench import model\n"),
        "topo_attn.lm.research": "import topo_attn.bench\n",
        "topo_attn.lm.results": "from . import study\n",
    }, packages=("topo_attn", "topo_attn.lm", "topo_attn.bench"))
    assert sorted(imports_between_separate(mods)) == [
        "topo_attn.lm.research:1 imports topo_attn.bench",
        "topo_attn.lm.study:2 imports topo_attn.bench.results",
        "topo_attn.lm.study:4 imports topo_attn.bench.model"]
    mods["topo_attn.bench.results"] = Module("from ..lm import results\n")  # the other way round
    assert "topo_attn.bench.results:1 imports topo_attn.lm.results" in imports_between_separate(mods)
    assert imports_between_separate(mods, separate=("topo_attn.lm", "topo_attn.eviction")) == []


def test_heavy_import_check_sees_a_heavy_import():
    assert heavy_modules_loaded("import json") == []
    assert heavy_modules_loaded("import pandas") == ["pandas"]
