"""No import cycles in specbound, and no import from a layer above.

* Static: the import graph of src/specbound (``ast``; relative imports resolved; importing a.b.c also
  runs the ``__init__`` of every package on the way that the importer is not already inside) must have
  no cycle — neither among module-level imports, nor once function-level imports are added: an import
  moved into a function to dodge a cycle is still a cycle (it just fails later, at call time).
* Layers: the measurement layer ``specbound.measure`` sits below the product command
  (``specbound.advise``) and the studies (``specbound.experiments``): it imports only ``theory``,
  ``models``, ``decoding``, ``assets``, ``errors`` and ``seeds`` (never the studies, ``advise`` or the
  command line), and ``advise`` never reaches the studies — at module or function level. ``seeds``,
  like ``errors``, is the bottom layer: it imports no other specbound module but ``errors``.
* Layer order (``LAYERS``, bottom first, as in README's layout): errors/seeds/options/runtime <
  theory, assets < models < decoding < measure < advise, export, serve < experiments < cli. No module imports
  (at module or function level) from a layer above its own; theory/ imports no torch.
* At run time: every specbound module imports on its own in a fresh interpreter (each one with no
  other specbound module loaded), so no module depends on another having been imported first.
"""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import specbound

SRC = Path(specbound.__file__).resolve().parent
ROOT = SRC.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _targets(importer: str, node) -> list[str]:
    """specbound modules an import statement executes (the module or package, or X.name submodules)."""
    out = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = _resolve(importer, node.level, node.module)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    for name in names:
        while name and name not in MODULES:       # `import specbound.x.y.Class` style: nearest module
            name = name.rpartition(".")[0]
        if name.startswith("specbound"):
            out.append(name)
    return out


def _with_packages(importer: str, target: str) -> list[str]:
    """``target`` plus the packages its import runs first (those the importer is not already inside)."""
    parts = target.split(".")
    chain = [".".join(parts[:i]) for i in range(1, len(parts))] + [target]
    inside = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
    return [m for m in chain if m in MODULES and m not in inside and m != importer]


def _type_checking(node) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and ("TYPE_CHECKING" in ast.unparse(test))


def import_graph(include_function_level: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def visit(node, in_function: bool):
            for child in ast.iter_child_nodes(node):
                if _type_checking(child):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if include_function_level or not in_function:
                        for target in _targets(name, child):
                            edges.update(_with_packages(name, target))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(tree, False)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a self-loop): Tarjan."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_graph_sees_the_imports():
    graph = import_graph(include_function_level=True)
    assert len(MODULES) > 50
    assert "specbound.decoding.verify" in graph["specbound.decoding.engine"]
    assert "specbound.measure.records" in graph["specbound.measure.journal"]
    # function-level: a command imports the study it runs inside its run()
    assert "specbound.experiments.analyze" in graph["specbound.cli.analyze"]
    assert "specbound.experiments.analyze" not in import_graph(include_function_level=False)["specbound.cli.analyze"]


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_cycle_among_module_level_imports():
    assert cycles(import_graph(include_function_level=False)) == []


def test_no_cycle_hidden_in_function_level_imports():
    found = cycles(import_graph(include_function_level=True))
    assert found == [], f"function-level imports that close a cycle: {found}"


def test_every_module_imports_alone_in_a_fresh_interpreter():
    script = (
        "import importlib, json, sys, traceback\n"
        f"names = {sorted(m for m in MODULES if not m.endswith('.__main__'))!r}\n"   # scripts run on import
        "failed = {}\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m == 'specbound' or m.startswith('specbound.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException as exc:\n"
        "        failed[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(failed))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failed == {}, failed


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_measurement_layer_sits_below_advise_and_the_studies():
    graph = import_graph(include_function_level=True)
    measure = [m for m in MODULES if _under(m, "specbound.measure")]
    assert "specbound.measure.oracle" in measure and "specbound.measure.journal" in measure
    below = ("specbound.measure", "specbound.theory", "specbound.models", "specbound.decoding", "specbound.assets",
             "specbound.errors", "specbound.seeds")
    for name in measure:                    # only the engine and the theory below it, never a layer above
        bad = sorted(m for m in graph[name] if not any(_under(m, b) for b in below))
        assert bad == [], f"{name} imports outside the layers below the measurements: {bad}"
    assert not any(_under(m, "specbound.experiments") for name in measure for m in _reach(graph, name))
    bad = sorted(m for m in _reach(graph, "specbound.advise") if _under(m, "specbound.experiments"))
    assert bad == [], f"specbound.advise reaches the studies: {bad}"
    assert "specbound.measure.oracle" in graph["specbound.advise"]        # module level, not hidden in a function
    assert "specbound.measure.oracle" in import_graph(include_function_level=False)["specbound.advise"]


def test_seeds_and_errors_are_the_bottom_layer():
    graph = import_graph(include_function_level=True)
    assert graph["specbound.seeds"] <= {"specbound", "specbound.errors"}, graph["specbound.seeds"]
    assert graph["specbound.errors"] <= {"specbound"}, graph["specbound.errors"]


# The layers, bottom first: a module may import its own package and any package of a lower layer, never
# one above (entry scripts ``__main__`` excepted: ``python -m specbound.assets`` runs the command line).
LAYERS = [
    {"errors", "seeds", "options", "runtime"},      # no specbound imports but errors
    {"theory", "assets"},                            # pure NumPy/SciPy formulas; packaged data and the cache
    {"models"},                                      # backends behind one protocol
    {"decoding"},                                    # one loop, one tree, one verify
    {"measure"},                                     # measurement primitives
    {"advise", "export", "serve"},                   # the product command, its exports, the HTTP server
    {"experiments"},                                 # the studies
    {"cli"},                                         # parse, run, write
]


def _layer(name: str) -> int:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else ""
    for rank, packages in enumerate(LAYERS):
        if top in packages:
            return rank
    raise AssertionError(f"{name}: its package {top!r} is in no layer; add it to LAYERS")


def test_layer_table_covers_every_package():
    for name in MODULES:
        if name != "specbound":
            _layer(name)


def test_no_module_imports_from_a_layer_above_it():
    graph = import_graph(include_function_level=True)
    bad = []
    for name, targets in graph.items():
        if name == "specbound" or name.endswith(".__main__"):
            continue
        for target in targets:
            if target != "specbound" and _layer(target) > _layer(name):
                bad.append(f"{name} -> {target}")
    assert bad == [], "imports from a layer above:\n" + "\n".join(sorted(bad))


def test_layer_check_catches_an_upward_import():
    graph = {"specbound.theory.x": {"specbound.decoding.engine"}, "specbound.cli.y": {"specbound.theory.x"}}
    up = [(a, b) for a, bs in graph.items() for b in bs if _layer(b) > _layer(a)]
    assert up == [("specbound.theory.x", "specbound.decoding.engine")]


def test_theory_is_pure_numpy():
    for name, path in MODULES.items():
        if _under(name, "specbound.theory"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    roots = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    roots = [node.module.split(".")[0]]
                else:
                    continue
                assert not {"torch", "transformers", "llama_cpp"} & set(roots), f"{name} imports {roots}"
