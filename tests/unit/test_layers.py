"""The folder tree is the architecture: components stacked by layer, no upward import, no cycle, no
private name reached across modules. Parsed from the source (every import, also inside functions)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "runbook"

# Lowest first. A module imports its own component and components of lower layers; on the steps' layer
# never another step (a step package uses the shared services below it, never a sibling).
LAYERS = [
    {"__init__", "errors", "checks"},                # the package root holds only its docstring and version
    {"secrets", "envfile", "console"},              # console: what `run` shows a person (rich), below every user
    {"profile"},
    {"remote", "evidence"},
    {"facts"},
    {"step", "fit", "diagnose"},                     # what every step records through; shared models
    {"api", "engram_tools", "weights_tools"},        # shared services: the server's API; Engram's and the weights' node tools
    {"answers", "benchmark"},                        # what a good answer is; the benchmark engine
    {"lab"},                                         # the embedded lab: below the steps, which may use it
    {"preflight", "network", "weights", "engram", "launch", "smoke", "vision_tools", "bench", "report"},
    {"runner", "form", "review"},                    # the papermill runner, the profile form, the offline review
    {"cli", "__main__"},
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
STEPS = LAYERS[LAYER_OF["preflight"]]


def component(module: str) -> str:
    """``runbook.launch.server`` -> ``launch``; ``runbook`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = sorted(p for p in PKG.rglob("*.py"))
KNOWN = {module_name(p) for p in MODULES}


def imports_of(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names, line) for every import statement, resolved to absolute names."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("runbook")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("runbook"):
                names = [a.name for a in node.names]
                # "from . import x": x is a submodule, or a name the package's __init__ defines
                subs = [n for n in names if f"{target}.{n}" in KNOWN]
                out += [(f"{target}.{n}", [], node.lineno) for n in subs]
                rest = [n for n in names if n not in subs]
                if rest:
                    out.append((target, rest, node.lineno))
    return out




def test_every_component_has_a_layer():
    assert MODULES, "no modules found"
    unknown = {component(module_name(p)) for p in MODULES} - set(LAYER_OF)
    assert not unknown, f"components without a layer in LAYERS: {sorted(unknown)}"


def test_no_upward_imports():
    violations = []
    for path in MODULES:
        me = component(module_name(path))
        for target, _, line in imports_of(path):
            other = component(target)
            assert other in LAYER_OF, f"{path}:{line}: {target}: component {other!r} has no layer"
            if LAYER_OF[other] > LAYER_OF[me]:
                violations.append(f"{path.relative_to(PKG.parent)}:{line}: {me} (layer {LAYER_OF[me]}) imports "
                                  f"{target} (layer {LAYER_OF[other]})")
    assert not violations, "\n".join(violations)


def test_no_step_imports_another_step():
    """A step package reaches what another step also needs through a shared layer below both."""
    violations = []
    for path in MODULES:
        me = component(module_name(path))
        if me not in STEPS:
            continue
        for target, _, line in imports_of(path):
            other = component(target)
            if other in STEPS and other != me:
                violations.append(f"{path.relative_to(PKG.parent)}:{line}: step {me} imports step {target}")
    assert not violations, "\n".join(violations)


def test_every_step_has_a_package():
    """The nine notebooks' steps are the nine packages of the steps' layer, each a folder of runbook/."""
    assert len(STEPS) == 9
    assert all((PKG / name / "__init__.py").is_file() for name in STEPS), sorted(STEPS)


def test_no_private_names_across_modules():
    violations = []
    for path in MODULES:
        mod = module_name(path)
        for target, names, line in imports_of(path):
            if target == mod:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                violations.append(f"{path.relative_to(PKG.parent)}:{line}: imports {private} from {target}")
    assert not violations, "\n".join(violations)


def _graph() -> dict[str, set[str]]:
    """module -> the modules it imports (a package import is an edge to its ``__init__``)."""
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        mod = module_name(path)
        graph[mod] = {target for target, _, _ in imports_of(path) if target in KNOWN} - {mod}
    return graph


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 20
    # no exemption: a submodule importing its own package's __init__ (which imports the submodule) is a cycle
    def edges(m):
        return graph.get(m, set())
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for d in edges(m):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_step_packages_expose_run(name):
    """Every step package's ``__init__`` defines ``run(step, *, knobs...)``: the one entry its notebook calls."""
    tree = ast.parse((PKG / name / "__init__.py").read_text())
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert runs, f"runbook/{name}/__init__.py: no run(step, ...) defined there"
    args = runs[0].args
    assert [a.arg for a in args.posonlyargs + args.args] == ["step"], \
        f"runbook/{name}/__init__.py: run must take the step first and only keyword knobs after it"


def test_every_module_is_in_the_design_map():
    """docs/DESIGN.md lists every module of the package (its "Every module" table), so a newcomer finds any
    module's purpose in one place."""
    design = (PKG.parent / "docs" / "DESIGN.md").read_text()
    assert MODULES
    missing = [str(p.relative_to(PKG)) for p in MODULES if f"| `{p.relative_to(PKG)}` |" not in design]
    assert not missing, f"add these to docs/DESIGN.md's module table: {missing}"


def test_nothing_below_run_takes_the_step():
    """Below ``__init__.run`` (and its recorders) no function of a step or shared package takes the step, and
    no class holds it: inner functions take ``(cluster, profile, ...)`` or ``(api_client, profile, ...)`` and
    explicit values, and return rows, data and raw files for ``run`` to record (docs/DESIGN.md)."""
    packages = STEPS | {"api", "answers", "benchmark", "engram_tools"}
    scanned = 0
    found: dict[str, set[str]] = {}
    for path in MODULES:
        rel = str(path.relative_to(PKG))
        if component(module_name(path)) not in packages or path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scanned += 1
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.arg == "step" for a in args):
                    found.setdefault(rel, set()).add(node.name)
            elif isinstance(node, ast.ClassDef):     # a dataclass field that carries the step object down
                for item in node.body:
                    if (isinstance(item, ast.AnnAssign) and getattr(item.target, "id", "") == "step"
                            and ast.unparse(item.annotation).strip("'\"") in ("Any", "Step", "runbook.step.Step")):
                        found.setdefault(rel, set()).add(f"{node.name}.step")
    assert scanned > 100, f"only {scanned} functions scanned below the steps' run: the package list is wrong"
    assert not found, f"these take the step below run (return rows and data instead): {found}"
