"""The package's layout rules, read from the source with ``ast`` (nothing is imported).

What they keep true, so a maintainer can find each idea in one place and know what may
import what:

- the subpackages form layers: each may import only those below it (``LAYERS``), so there
  is no import cycle, at module level or inside a function;
- between subpackages, code imports a subpackage's face (``parlab.comm``), never one of its
  modules, and never a private name;
- a face (``__init__.py``) has an ``__all__`` and no logic; no module defines a module-level
  ``__getattr__``; no module is over 400 lines; at most a handful of top-level modules;
- every third-party import of the package is declared in pyproject.toml.
"""
import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "pkg" / "parlab"

#: Bottom up; a subpackage may import the ones listed before it, and itself.
LAYERS = ["units", "checks", "hardware", "launch", "comm", "models", "memory", "data_parallel", "sharded", "pipeline",
          "tensor_parallel", "hybrid", "viz", "exercises"]
#: The maintainers' command-line tools: they may import anything, and nothing imports them.
TOOLS = {"tools"}
#: The bottom layer: plain modules at the top of the package, importing nothing of parlab.
BOTTOM = {"units", "checks", "hardware"}
TOP_LEVEL = {"__init__"} | BOTTOM
MAX_LINES = 400


def _modules():
    """{dotted name: path} of every module of the package."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path):
    """(line, imported module, names) of every parlab import in a file, function-level too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                found.append((node.lineno, "." * node.level + node.module, []))
            elif node.module == "parlab" or node.module.startswith("parlab."):
                found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("parlab"):
                    found.append((node.lineno, alias.name, []))
    return found


def _targets(module, names):
    """The parlab modules an import statement reaches (a name may be a submodule)."""
    hits = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
    return hits if len(hits) == len(names) and hits else [module]


def _layer(dotted):
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph():
    edges = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for _, module, names in _imports(path):
            for target in _targets(module, names):
                if target in MODULES and target != name:
                    edges[name].add(target)
    return edges


def test_no_relative_imports():
    relative = [f"{p.relative_to(REPO)}:{line}" for p in MODULES.values()
                for line, module, _ in _imports(p) if module.startswith(".")]
    assert relative == [], "use absolute imports (from parlab.x import y)"


def test_no_import_cycle_between_modules():
    # A package's face imports its own modules, and Python runs a package's __init__ before
    # its modules, so an edge from a module to its own package's face is a real cycle too.
    edges = _graph()
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_subpackages_import_only_the_layers_below_them():
    bad = []
    for name, path in MODULES.items():
        mine = _layer(name)
        if mine in TOOLS or mine == "__init__":
            continue
        for line, module, names in _imports(path):
            theirs = _layer(module)
            if theirs in TOOLS:
                bad.append(f"{name}:{line} imports the tool {module}")
            elif theirs != mine and theirs in LAYERS and mine in LAYERS \
                    and LAYERS.index(theirs) > LAYERS.index(mine):
                bad.append(f"{name}:{line} ({mine}) imports {module} ({theirs}), a layer above it")
    assert bad == [], "\n".join(bad)


def test_between_subpackages_only_faces_and_public_names():
    """``from parlab.comm import X`` from outside comm; never parlab.comm.traffic or ``_x``."""
    bad = []
    for name, path in MODULES.items():
        mine = _layer(name)
        for line, module, names in _imports(path):
            theirs = _layer(module)
            if theirs == mine or module == "parlab":
                continue
            face = f"parlab.{theirs}"
            nested_face = module in MODULES and MODULES[module].name == "__init__.py"
            if module != face and not nested_face and mine != "__init__":
                bad.append(f"{name}:{line} imports {module}: import its face {face}")
            bad += [f"{name}:{line} imports the private name {n} from {module}"
                    for n in names if n.startswith("_")]
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("face", sorted(n for n, p in MODULES.items()
                                        if p.name == "__init__.py" and n != "parlab"))
def test_faces_have_all_and_no_logic(face):
    tree = ast.parse(MODULES[face].read_text())
    allowed = (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign)
    logic = [type(n).__name__ for n in tree.body if not isinstance(n, allowed)]
    assert logic == [], f"{face}/__init__.py holds {logic}: move them into a module"
    assigned = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets]
    assert assigned == ["__all__"], f"{face}: a face assigns only __all__, got {assigned}"
    exported = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)))
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                for a in n.names}
    assert set(exported) <= imported, f"{face}: __all__ lists {set(exported) - imported}, " \
                                      "which it does not import"
    assert len(exported) == len(set(exported))


def test_no_module_level_getattr():
    bad = [name for name, path in MODULES.items()
           if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
                  for n in ast.parse(path.read_text()).body)]
    assert bad == []


def test_no_module_over_400_lines():
    long = {name: n for name, p in MODULES.items()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these (at most {MAX_LINES} lines): {long}"


def test_a_handful_of_top_level_modules_and_each_layer_is_a_subpackage():
    top = {p.stem for p in PKG.glob("*.py")}
    assert top == TOP_LEVEL
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert packages == set(LAYERS) - BOTTOM | TOOLS


def test_every_third_party_import_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[ ;]", d)[0].lower().replace("-", "_")
                for d in project["dependencies"]
                + [d for extra in project.get("optional-dependencies", {}).values()
                   for d in extra]}
    provided_by = {"IPython": "ipython", "ipywidgets": "ipywidgets", "yaml": "pyyaml"}
    missing = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            roots = ([a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import)
                     else [node.module.split(".")[0]] if isinstance(node, ast.ImportFrom)
                     and node.module and not node.level else [])
            for root in roots:
                if root == "parlab" or root in sys.stdlib_module_names:
                    continue
                dist = provided_by.get(root, root).lower()
                if dist not in declared:
                    missing.setdefault(dist, name)
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"
