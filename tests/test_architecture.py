"""The package's layout rules, read from the source with ``ast`` (nothing is imported).

What they keep true, so a maintainer can find each idea in one place and know what may
import what:

- the subpackages form layers: each may import only those below it (``LAYERS``), so there
  is no import cycle, at module level or inside a function;
- the strategy subpackages (``STRATEGIES``) are siblings on one layer: none imports another,
  only ``hybrid`` and the layers above combine them;
- ``viz`` draws only: it imports nothing that starts ranks (``parlab.launch``,
  ``parlab.experiments``, or a rank-starting function of a lower layer, ``RANK_STARTERS``),
  and its drawings (every module but the widgets) import no function of a lower layer: they
  take what a calculator returned, and import only its types and constants (and the few
  formatting helpers of ``DRAWING_HELPERS``);
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

#: The parallelism strategies: siblings on one layer, none imports another (context and expert
#: parallelism are listed ahead of their subpackages).
STRATEGIES = ("data_parallel", "sharded", "pipeline", "tensor_parallel", "context_parallel",
              "expert_parallel")
#: Bottom up; a subpackage may import the layers listed before it, and itself. A tuple is one
#: layer of siblings.
LAYERS = [("units", "checks", "hardware", "progress"), "launch", "comm", "models", "memory", STRATEGIES, "hybrid", "viz", "experiments",
          "exercises"]
#: Functions that start ranks (``parlab.launch.run`` or ``parlab.comm.run_with_traffic``, directly
#: or through one another), by name: ``viz`` imports none of them. The chapters' experiments are
#: named too, in case a lower layer re-exports one. ``test_rank_starters_are_all_listed`` keeps
#: the list complete.
RANK_STARTERS = frozenset({
    "run", "run_with_traffic", "execute", "run_expert_data", "pipeline_data_parallel", "torch_pipelining", "run_3d",
    "train", "train_zero", "train_fsdp", "train_stages", "launch_spec", "measure_traffic", "traffic_table",
    "layer_traffic", "hybrid_traffic", "hybrid_step", "run_attention", "run_ffn",
    "run_layer_strategy", "run_mlp", "run_embedding", "run_figure_8_2", "stage_table",
    "collective_explorer", "strategy_explorer", "book_step_explorer", "run_zero_tensor",
    "zero_tensor_rank", "compare_methods", "causal_work", "run_sequence_parallel",
    "causal_work_chart", "execute_program", "execute_programs"})
#: The only functions (and classes) of the layers below viz that a drawing (``viz`` but its
#: widgets) may call: notation and units that format a result (``Action`` is the key that
#: ``action_code`` names), and the fixed cluster Figure 8-19 is drawn on. Every other function
#: below viz computes (``estimate``, ``compare``, ``place``, ``sync_cost``,
#: ``count_parameters``, ...) and every other class is built by the caller: a drawing takes the
#: result as an argument, and the caller (a recipe in parlab.experiments, a chapter's cell, a
#: widget) computes it.
DRAWING_HELPERS = frozenset({"action_code", "Action", "gpu_name", "replica_names",
                             "format_bytes", "figure_8_19"})
#: The maintainers' command-line tools: they may import anything, and nothing imports them.
TOOLS = {"tools"}
#: The bottom layer: plain modules at the top of the package, importing nothing of parlab.
BOTTOM = {"units", "checks", "hardware", "progress"}
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
    return _imports_of(path.read_text())


def _imports_of(source):
    """(line, imported module, names) of every parlab import in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
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


def _level(subpackage):
    """The index in ``LAYERS`` of the layer that holds ``subpackage`` (None: not a layer)."""
    for level, layer in enumerate(LAYERS):
        if subpackage == layer or (isinstance(layer, tuple) and subpackage in layer):
            return level
    return None


SUBPACKAGES = [s for layer in LAYERS for s in (layer if isinstance(layer, tuple) else (layer,))]


def import_map():
    """{module: [(line, imported module, names)]} of the whole package (the rules' input)."""
    return {name: _imports(path) for name, path in MODULES.items()}


def layer_violations(imports):
    """Imports of a tool, of a layer above, or of a sibling on the same layer, in ``imports``."""
    bad = []
    for name, found in imports.items():
        mine = _layer(name)
        if mine in TOOLS or mine == "__init__":
            continue
        for line, module, _ in found:
            theirs = _layer(module)
            if theirs in TOOLS:
                bad.append(f"{name}:{line} imports the tool {module}")
            elif theirs == mine or _level(theirs) is None or _level(mine) is None:
                continue
            elif _level(theirs) > _level(mine):
                bad.append(f"{name}:{line} ({mine}) imports {module} ({theirs}), a layer above it")
            elif _level(theirs) == _level(mine):
                bad.append(f"{name}:{line} ({mine}) imports {module} ({theirs}), a sibling: only "
                           "hybrid and the layers above combine strategies")
    return bad


def viz_violations(imports, rank_starters=RANK_STARTERS):
    """Imports in ``viz`` of what starts ranks: parlab.launch, parlab.experiments, a starter."""
    bad = []
    for name, found in imports.items():
        if _layer(name) != "viz":
            continue
        for line, module, names in found:
            if _layer(module) in ("launch", "experiments"):
                bad.append(f"{name}:{line} imports {module}: viz draws only, it starts no ranks")
            bad += [f"{name}:{line} imports {n} from {module}, which starts ranks"
                    for n in names if n in rank_starters and _layer(module) != "viz"]
    return bad


def lower_functions(sources):
    """The public module-level functions defined in ``{module: source}``: what viz may not call."""
    return {node.name for source in sources.values() for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}


def drawing_violations(imports, functions, helpers=DRAWING_HELPERS):
    """Imports in viz's drawings (not its widgets) of a lower layer's function or whole module.

    ``functions`` are the lower layers' public functions (:func:`lower_functions`); the
    ``helpers`` among them format a result and are allowed. A module imported whole
    (``from parlab import memory``) is reported too: its functions could be called unseen.
    """
    bad = []
    for name, found in imports.items():
        if _layer(name) != "viz" or name.startswith("parlab.viz.widgets"):
            continue
        for line, module, names in found:
            if _layer(module) == "viz":
                continue
            bad += [f"{name}:{line} imports the module parlab.{n}: import the types it draws"
                    for n in names if module == "parlab" and f"parlab.{n}" in MODULES]
            bad += [f"{name}:{line} imports {n} from {module}, a function that computes: viz "
                    "draws what its caller computed (in parlab.experiments, a cell or a widget)"
                    for n in names if n in functions and n not in helpers]
    return bad


def constructor_calls(sources):
    """Calls, in viz's drawings, of a class imported from a lower layer (``BookMLP(...)``):
    building a model or a calculator's object is computing too; a drawing takes it built."""
    bad = []
    for name, source in sources.items():
        if _layer(name) != "viz" or name.startswith("parlab.viz.widgets"):
            continue
        lower = {n for _, module, names in _imports_of(source) if _layer(module) != "viz"
                 for n in names}
        bad += [f"{name}:{c.lineno} builds {c.func.id}: take it built, as an argument"
                for c in ast.walk(ast.parse(source)) if isinstance(c, ast.Call)
                and isinstance(c.func, ast.Name) and c.func.id in lower - DRAWING_HELPERS
                and c.func.id[:1].isupper()]
    return bad


def rank_starters(sources):
    """Public functions of ``{module: source}`` that start ranks, directly or through another.

    A call of ``run`` counts where the module imports it from parlab.launch; a call of
    ``run_with_traffic`` counts everywhere; so does a call of a function already found.
    """
    calls = {}
    for module, source in sources.items():
        tree = ast.parse(source)
        launch_run = any(isinstance(n, ast.ImportFrom) and n.module == "parlab.launch"
                         and any(a.name == "run" for a in n.names) for n in ast.walk(tree))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                called = {c.func.id for c in ast.walk(node)
                          if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                if not launch_run and _layer(module) != "launch":
                    called.discard("run")
                calls.setdefault(node.name, set()).update(called)
    found, grown = {"run", "run_with_traffic"}, True
    while grown:
        new = {f for f, called in calls.items() if f not in found and called & found}
        found |= new
        grown = bool(new)
    return found


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
    bad = layer_violations(import_map())
    assert bad == [], "\n".join(bad)


def test_the_layer_rule_reports_planted_violations():
    planted = {"parlab.pipeline.fake": [(3, "parlab.tensor_parallel", ["split"]),
                                        (4, "parlab.hybrid", ["plan"]),
                                        (5, "parlab.memory", ["estimate"]),
                                        (6, "parlab.pipeline.schedules", ["schedule"])],
               "parlab.context_parallel.fake": [(7, "parlab.sharded", ["Zero"])],
               "parlab.comm.fake": [(8, "parlab.tools.book", [])],
               "parlab.experiments.fake": [(9, "parlab.viz", ["figure"]),
                                           (10, "parlab.data_parallel", ["train"])]}
    bad = layer_violations(planted)
    assert len(bad) == 4, bad
    assert "parlab.pipeline.fake:3" in bad[0] and "a sibling" in bad[0]
    assert "parlab.pipeline.fake:4" in bad[1] and "a layer above" in bad[1]
    assert "parlab.context_parallel.fake:7" in bad[2] and "a sibling" in bad[2]
    assert "parlab.comm.fake:8 imports the tool" in bad[3]


def test_strategies_are_siblings_between_memory_and_hybrid():
    level = _level("data_parallel")
    assert all(_level(s) == level for s in STRATEGIES)
    assert _level("memory") < level < _level("hybrid") < _level("viz") < _level("experiments") \
        < _level("exercises")


def test_viz_imports_nothing_that_starts_ranks():
    bad = viz_violations(import_map())
    assert bad == [], "\n".join(bad)


def test_the_viz_rule_reports_planted_violations():
    source = ("from parlab.launch import run\n"
              "from parlab.comm import TrafficLog, run_with_traffic\n"
              "from parlab.viz.style import show\n"
              "def draw():\n"
              "    from parlab.experiments import run_attention\n"
              "    from parlab.pipeline import execute, schedule\n")
    planted = {"parlab.viz.plots.fake": _imports_of(source),
               "parlab.hybrid.fake": [(1, "parlab.launch", ["run"])]}  # below viz: allowed
    bad = viz_violations(planted)
    assert [b.split(" ")[0] for b in bad] == ["parlab.viz.plots.fake:1"] * 2 + [
        "parlab.viz.plots.fake:2", "parlab.viz.plots.fake:5", "parlab.viz.plots.fake:5",
        "parlab.viz.plots.fake:6"], bad
    assert "execute" in bad[-1]


def _below_viz_sources():
    return {name: path.read_text() for name, path in MODULES.items()
            if _level(_layer(name)) is not None and _level(_layer(name)) < _level("viz")}


def test_viz_drawings_take_results_and_call_no_calculator():
    bad = drawing_violations(import_map(), lower_functions(_below_viz_sources()))
    assert bad == [], "\n".join(bad)


def test_viz_drawings_build_no_lower_layer_object():
    sources = {name: path.read_text() for name, path in MODULES.items()}
    bad = constructor_calls(sources)
    assert bad == [], "\n".join(bad)


def test_the_constructor_rule_reports_planted_violations():
    source = ("from parlab.models import BookMLP, GB\n"
              "from parlab.viz.style import Thing\n"
              "def draw(mlp: BookMLP):\n"
              "    Thing(1)\n"
              "    return BookMLP((4, 2)).step(1)\n")
    bad = constructor_calls({"parlab.viz.plots.fake": source,
                             "parlab.viz.widgets.fake": source})  # explorers may build
    assert bad == ["parlab.viz.plots.fake:5 builds BookMLP: take it built, as an argument"]


def test_the_drawing_helpers_are_defined_in_lower_layers():
    defined = {node.name for source in _below_viz_sources().values()
               for node in ast.parse(source).body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert DRAWING_HELPERS <= defined, DRAWING_HELPERS - defined


def test_the_drawing_rule_reports_planted_violations():
    functions = lower_functions({
        "parlab.memory.fake": "GB = 10**9\nclass Breakdown:\n    pass\n"
                              "def estimate(config):\n    return config\n"
                              "def _helper():\n    return 1\n",
        "parlab.pipeline.fake": "def compare():\n    pass\ndef action_code(a):\n    pass\n"})
    assert functions == {"estimate", "compare", "action_code"}
    source = ("from parlab.memory import Breakdown, estimate, GB\n"
              "from parlab.units import format_bytes\n"
              "from parlab import memory\n"
              "def draw(result):\n"
              "    from parlab.pipeline import action_code, compare\n"
              "    from parlab.viz.style import show\n")
    planted = {"parlab.viz.plots.fake": _imports_of(source),
               "parlab.viz.widgets.fake": [(1, "parlab.memory", ["estimate"])],  # explorers
               "parlab.experiments.fake": [(1, "parlab.pipeline", ["compare"])]}  # above viz
    bad = drawing_violations(planted, functions)
    assert [b.split(" ")[0] for b in bad] == ["parlab.viz.plots.fake:1", "parlab.viz.plots.fake:3",
                                              "parlab.viz.plots.fake:5"], bad
    assert "estimate" in bad[0] and "parlab.memory" in bad[1] and "compare" in bad[2]


def test_rank_starters_are_all_listed():
    sources = _below_viz_sources()
    missing = rank_starters(sources) - RANK_STARTERS
    assert missing == set(), f"add these to RANK_STARTERS: {sorted(missing)}"


def test_the_rank_starter_search_finds_planted_starters():
    sources = {"parlab.data_parallel.fake": (
        "from parlab.launch import run\n"
        "def go(n):\n    return run(print, n)\n"
        "def go_twice(n):\n    return [go(n), go(n)]\n"
        "def idle():\n    return 1\n"),
        "parlab.memory.fake": "def run(x):\n    return x\ndef uses_a_local_run():\n    return run(1)\n"}
    assert rank_starters(sources) == {"run", "run_with_traffic", "go", "go_twice"}


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
    assert packages <= set(SUBPACKAGES) | TOOLS, f"not in LAYERS: {packages - set(SUBPACKAGES)}"
    assert set(SUBPACKAGES) - BOTTOM - packages <= {"context_parallel", "expert_parallel"}


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
