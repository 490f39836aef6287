"""The folder tree is the architecture: components stacked by layer, no upward import, no cycle, no
private name reached across modules. Parsed from the source (every import, also inside functions)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "runbook"

# Lowest first. A module may import its own component, and components of its layer or below.
LAYERS = [
    {"errors", "checks"},
    {"secrets", "envfile"},
    {"profile"},
    {"remote", "evidence"},
    {"facts"},
    {"step", "fit", "diagnose"},                     # what every step records through; shared models
    {"preflight", "network", "weights", "engram", "launch", "serve", "bench", "report",   # one per step
     "lab"},                                         # the embedded lab builds its fixtures with the steps' code
    {"runner", "form", "review"},                    # the papermill runner, the profile form, the offline review
    {"cli", "__main__", "__init__"},
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


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
                # "from . import x" names submodules: resolve each
                if not node.module:
                    out += [(f"{target}.{n}", [], node.lineno) for n in names]
                else:
                    out.append((target, names, node.lineno))
    return out


MODULES = sorted(p for p in PKG.rglob("*.py"))


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
            if other in LAYER_OF and LAYER_OF[other] > LAYER_OF[me]:
                violations.append(f"{path.relative_to(PKG.parent)}:{line}: {me} (layer {LAYER_OF[me]}) imports "
                                  f"{target} (layer {LAYER_OF[other]})")
    assert not violations, "\n".join(violations)


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
    known = {module_name(p) for p in MODULES}
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        mod = module_name(path)
        deps = set()
        for target, names, _ in imports_of(path):
            # "from pkg import sub" is an import of pkg.sub when sub is a module
            subs = {f"{target}.{n}" for n in names if f"{target}.{n}" in known}
            deps |= subs or ({target} if target in known else set())
        graph[mod] = deps - {mod}
    return graph


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 20
    # a package's __init__ re-exporting its own modules is not a cycle of concern
    def edges(m):
        return {d for d in graph.get(m, ()) if not (m.startswith(d + ".") )}
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


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent != PKG and p.name == "__init__.py"
                                  and p.parent.name in {"preflight", "network", "launch", "report"}],
                         ids=lambda p: p.parent.name)
def test_step_packages_expose_run(path):
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "run" and n.args.args[0].arg == "step"
               for n in tree.body), f"{path}: no run(step, ...) entry"


def test_every_module_is_in_the_design_map():
    """docs/DESIGN.md lists every module of the package (its "Every module" table), so a newcomer finds any
    module's purpose in one place."""
    design = (PKG.parent / "docs" / "DESIGN.md").read_text()
    assert MODULES
    missing = [str(p.relative_to(PKG)) for p in MODULES if f"| `{p.relative_to(PKG)}` |" not in design]
    assert not missing, f"add these to docs/DESIGN.md's module table: {missing}"
