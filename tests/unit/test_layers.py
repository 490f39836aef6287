"""The folder tree is the architecture: components stacked by layer, no upward import, no cycle (between modules,
or between the components of one layer), no private name reached across modules. Parsed from the source: every
import statement (also inside functions), ``importlib.import_module("runbook.…")`` and ``__import__("runbook.…")``
with their literal names, and attribute chains that reach a module through an imported package
(``import runbook; runbook.launch.server.start(…)``). One checker (:func:`layer_violations`) reads the real
package and, in the negative tests at the end, small planted packages that must each be reported."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "runbook"

# Lowest first. A module imports its own component and components of lower layers; on the steps' layer
# never another step (a step package uses the shared services below it, never a sibling).
LAYERS = [
    {"__init__", "errors", "checks"},                # the package root holds only its docstring and version
    {"secrets", "envfile", "progress", "console"},  # progress: the one channel for counted work; console: what
                                                     # `run` shows a person (rich), below every user
    {"profile"},
    {"remote", "evidence", "records"},              # records: the table of steps and their typed records
    {"facts"},
    {"site", "fit", "diagnose"},                     # what differs between Sparks, lab and rehearsal; shared models
    {"api", "engram_tools", "weights_tools"},        # shared services: the server's API; Engram's and the weights' node tools
    {"answers", "benchmark"},                        # what a good answer is; the benchmark engine
    {"lab"},                                         # the embedded lab; it builds the sites (lab.site.site_for)
    {"step"},                                        # what every step records through; begin attaches the site
    {"preflight", "network", "weights", "engram", "launch", "smoke", "vision_tools", "bench", "report"},
    {"runner", "form", "review", "bench_share"},     # the papermill runner, the profile form, the offline review,
                                                     # the benchmark of step 02's share on a switch of its own
    {"cli", "__main__"},
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
STEPS = LAYERS[LAYER_OF["preflight"]]


def component(module: str) -> str:
    """``runbook.launch.server`` -> ``launch``; ``runbook`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@dataclass(frozen=True)
class Ref:
    """One reach from a module to another: ``how`` is import | import_module | __import__ | attribute | dynamic."""
    target: str
    names: tuple[str, ...]
    line: int
    how: str = "import"


class Tree:
    """The modules of one package folder (the real ``runbook/``, or a planted one in a test's tmp dir)."""

    def __init__(self, pkg: Path):
        self.pkg = Path(pkg)
        self.root = self.pkg.name
        self.modules = sorted(self.pkg.rglob("*.py"))
        self.known = {self.module_name(p) for p in self.modules}

    def module_name(self, path: Path) -> str:
        parts = list(path.relative_to(self.pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.pkg.parent))

    def ours(self, name: str) -> bool:
        return name == self.root or name.startswith(self.root + ".")

    def deepest(self, module: str, attrs: list[str]) -> str:
        """``module`` extended by the attributes that name its submodules (``runbook`` + launch.server.x ->
        ``runbook.launch.server``)."""
        for attr in attrs:
            if f"{module}.{attr}" not in self.known:
                break
            module = f"{module}.{attr}"
        return module

    def refs(self, path: Path) -> list[Ref]:
        """Every reach from ``path`` into the package, resolved to absolute module names."""
        mod = self.module_name(path)
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]

        def absolute(name: str, level: int) -> str:
            if not level:
                return name
            base = package.split(".")
            base = base[: len(base) - (level - 1)]
            return ".".join(base + ([name] if name else []))

        tree = ast.parse(path.read_text(), str(path))
        out: list[Ref] = []
        bound: dict[str, str] = {}        # a local name -> the package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if self.ours(a.name):
                        out.append(Ref(a.name, (), node.lineno))
                        bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else self.root
            elif isinstance(node, ast.ImportFrom):
                target = absolute(node.module or "", node.level)
                if not self.ours(target):
                    continue
                names = [a.name for a in node.names]
                # "from . import x": x is a submodule, or a name the package's __init__ defines
                subs = [a for a in node.names if f"{target}.{a.name}" in self.known]
                out += [Ref(f"{target}.{a.name}", (), node.lineno) for a in subs]
                bound.update({a.asname or a.name: f"{target}.{a.name}" for a in subs})
                rest = tuple(n for n in names if n not in {a.name for a in subs})
                if rest:
                    out.append(Ref(target, rest, node.lineno))
        importers = {"import_module": "import_module", "__import__": "__import__"}
        for node in ast.walk(tree):       # "from importlib import import_module as load"
            if isinstance(node, ast.ImportFrom) and node.module == "importlib" and not node.level:
                importers.update({a.asname or a.name: a.name for a in node.names if a.name == "import_module"})
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            called = importers.get(fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", ""))
            if called is None or not node.args:
                continue
            arg = node.args[0]
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                out.append(Ref("?", (), node.lineno, "dynamic"))    # a computed name no test can follow
                continue
            name = arg.value
            if called == "import_module":
                level = len(name) - len(name.lstrip("."))
                anchor = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "package"), None)
                if level and isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
                    base = anchor.value.split(".")        # import_module(".x", "runbook.launch")
                    target = ".".join(base[: len(base) - (level - 1)] + [name.lstrip(".")]).rstrip(".")
                else:
                    target = absolute(name.lstrip("."), level)
            else:
                level = next((k.value.value for k in node.keywords if k.arg == "level"
                              and isinstance(k.value, ast.Constant)), 0)
                target = absolute(name, level)
            if self.ours(target):
                out.append(Ref(target, (), node.lineno, called))
        # attribute chains through a bound package: runbook.launch.server.start -> runbook.launch.server
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in inner:     # the whole chain once
                continue
            attrs, base = [], node
            while isinstance(base, ast.Attribute):
                attrs.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                start = bound[base.id]
                reached = self.deepest(start, attrs)
                if reached != start:
                    out.append(Ref(reached, (), node.lineno, "attribute"))
        return list(dict.fromkeys(out))

    def graph(self) -> dict[str, set[str]]:
        """module -> the modules it reaches (a package import is an edge to its ``__init__``)."""
        return {self.module_name(p): {r.target for r in self.refs(p) if r.target in self.known}
                - {self.module_name(p)} for p in self.modules}


def cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, set())):
            if state.get(d) == 1:
                found.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found


RULES = ("layer", "upward", "step_to_step", "step_to_lab", "private", "dynamic", "module_cycle", "component_cycle",
         "argument_order")


def argument_order(path: Path, rel: str) -> list[str]:
    """Every function (and lambda) of one module whose parameters put ``profile`` before ``cluster``: the one order
    is ``(cluster, profile, …)`` (docs/DESIGN.md), so a positional call never swaps the two unnoticed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            if "profile" in names and "cluster" in names and names.index("profile") < names.index("cluster"):
                found.append(f"{rel}:{node.lineno}: {getattr(node, 'name', 'lambda')}({', '.join(names)}) puts "
                             f"profile before cluster (the order is (cluster, profile, …))")
    return found


def layer_violations(pkg: Path) -> dict[str, list[str]]:
    """rule -> what breaks it in the package at ``pkg`` (every rule of this file's drawing)."""
    tree = Tree(pkg)
    out: dict[str, list[str]] = {rule: [] for rule in RULES}
    comp_graph: dict[str, set[str]] = {}
    for path in tree.modules:
        mod = tree.module_name(path)
        me = component(mod)
        out["argument_order"] += argument_order(path, tree.rel(path))
        if me not in LAYER_OF:
            out["layer"].append(f"{tree.rel(path)}: component {me!r} has no layer in LAYERS")
            continue
        for ref in tree.refs(path):
            where = f"{tree.rel(path)}:{ref.line}"
            via = "" if ref.how == "import" else f" (through {ref.how})"
            if ref.how == "dynamic":
                out["dynamic"].append(f"{where}: import by a computed name (write the module's name as a literal)")
                continue
            other = component(ref.target)
            if other not in LAYER_OF:
                out["layer"].append(f"{where}: {ref.target}: component {other!r} has no layer in LAYERS")
                continue
            if LAYER_OF[other] > LAYER_OF[me]:
                out["upward"].append(f"{where}: {me} (layer {LAYER_OF[me]}) imports {ref.target} "
                                     f"(layer {LAYER_OF[other]}){via}")
            if me in STEPS and other in STEPS and other != me:
                out["step_to_step"].append(f"{where}: step {me} imports step {ref.target}{via}")
            if me in STEPS and other == "lab":
                out["step_to_lab"].append(f"{where}: step {me} imports {ref.target}{via} (ask step.site: runbook.site)")
            private = [n for n in ref.names if n.startswith("_") and not n.startswith("__")]
            if private and ref.target != mod:
                out["private"].append(f"{where}: imports {private} from {ref.target}")
            if other != me:
                comp_graph.setdefault(me, set()).add(other)
    out["module_cycle"] = cycles(tree.graph())
    # two components of one layer reaching each other through different modules form no module cycle,
    # yet neither can be understood (or moved) without the other
    out["component_cycle"] = cycles(comp_graph)
    return out


REAL = layer_violations(PKG)
MODULES = Tree(PKG).modules


def test_every_component_has_a_layer():
    assert MODULES, "no modules found"
    assert not REAL["layer"], "\n".join(REAL["layer"])


def test_no_upward_imports():
    assert not REAL["upward"], "\n".join(REAL["upward"])


def test_no_step_imports_another_step():
    """A step package reaches what another step also needs through a shared layer below both."""
    assert not REAL["step_to_step"], "\n".join(REAL["step_to_step"])


def test_no_step_imports_the_lab():
    """What differs between the Sparks, the lab and a rehearsal reaches a step through its site (``step.site``,
    built by ``runbook.lab.site``): a step package never imports ``runbook.lab`` in any form."""
    assert not REAL["step_to_lab"], "\n".join(REAL["step_to_lab"])


def test_every_step_has_a_package():
    """The nine notebooks' steps are the nine packages of the steps' layer, each a folder of runbook/."""
    assert len(STEPS) == 9
    assert all((PKG / name / "__init__.py").is_file() for name in STEPS), sorted(STEPS)


def test_no_private_names_across_modules():
    assert not REAL["private"], "\n".join(REAL["private"])


def test_no_import_by_computed_name():
    """``import_module(name)`` with a computed name hides an edge from every rule above."""
    assert not REAL["dynamic"], "\n".join(REAL["dynamic"])


def test_no_import_cycles():
    # no exemption: a submodule importing its own package's __init__ (which imports the submodule) is a cycle
    assert len(Tree(PKG).graph()) > 20
    assert not REAL["module_cycle"], "\n".join(REAL["module_cycle"])


def test_no_cycle_between_components():
    assert not REAL["component_cycle"], "\n".join(REAL["component_cycle"])


def test_cluster_comes_before_profile():
    """One argument order in the whole package: ``(cluster, profile, …)``, never ``(profile, cluster, …)``."""
    assert not REAL["argument_order"], "\n".join(REAL["argument_order"])


@pytest.mark.parametrize("name", sorted(STEPS))
def test_step_packages_expose_run(name):
    """Every step package's ``__init__`` defines ``run(step, *, knobs...)``: the one entry its notebook calls."""
    tree = ast.parse((PKG / name / "__init__.py").read_text())
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert runs, f"runbook/{name}/__init__.py: no run(step, ...) defined there"
    args = runs[0].args
    assert [a.arg for a in args.posonlyargs + args.args] == ["step"], \
        f"runbook/{name}/__init__.py: run must take the step first and only keyword knobs after it"


@pytest.mark.parametrize("name", sorted(STEPS))
def test_step_run_returns_one_outcome(name):
    """One outcome type: every step's ``run`` is annotated ``-> StepOutcome`` and each of its returns is
    ``step.outcome(shown)`` (runbook/step.py): what the notebook shows, the status and the record."""
    tree = ast.parse((PKG / name / "__init__.py").read_text())
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    assert run.returns is not None and ast.unparse(run.returns) == "StepOutcome", \
        f"runbook/{name}/__init__.py: run must be annotated -> StepOutcome"
    returns = []

    def visit(node):                      # run's own returns, not those of a function defined inside it
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Return):
                returns.append(child)
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                visit(child)
    visit(run)
    wrong = [r.lineno for r in returns if not (isinstance(r.value, ast.Call)
                                               and ast.unparse(r.value.func) == "step.outcome")]
    assert returns and not wrong, f"runbook/{name}/__init__.py: run returns other than step.outcome(...) at {wrong}"


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
        if component(Tree(PKG).module_name(path)) not in packages or path.name == "__init__.py":
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


# -- the checker against planted violations: each must be reported (a checker that reports nothing fails here) ----

CLEAN = {
    "__init__.py": '"""root"""\n',
    "errors.py": '"""errors"""\n',
    "api/__init__.py": '"""api"""\n',
    "api/client.py": "from ..errors import __doc__ as _unused\n",
    "api/guards.py": '"""guards"""\n',
    "engram_tools/__init__.py": '"""engram tools"""\n',
    "engram_tools/layout.py": "from ..api import client\n",
    "launch/__init__.py": "from . import server\n",
    "launch/server.py": "from ..api import client\n\ndef start():\n    return client\n",
    "smoke/__init__.py": "import runbook.api\n\ndef run(step):\n    return runbook.api.client\n",
}


def planted(tmp_path: Path, changes: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The checker's verdict on a small package ``runbook`` written under ``tmp_path``: CLEAN with ``changes``
    (file -> text) written over it."""
    files = {**CLEAN, **(changes or {})}
    for rel, text in files.items():
        path = tmp_path / "runbook" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return layer_violations(tmp_path / "runbook")


def test_the_clean_planted_package_passes(tmp_path):
    """The base the plants change is clean, so each negative test below fails only for its plant."""
    found = planted(tmp_path)
    assert not any(found.values()), found
    assert Tree(tmp_path / "runbook").graph()["runbook.smoke"] == {"runbook.api", "runbook.api.client"}


def test_planted_import_module_upward(tmp_path):
    found = planted(tmp_path, {"api/client.py": 'import importlib\n\ndef later():\n'
                                              '    return importlib.import_module("runbook.launch.server")\n'})
    assert found["upward"] == ["runbook/api/client.py:4: api (layer 6) imports runbook.launch.server (layer 10) "
                               "(through import_module)"]


def test_planted_aliased_relative_import_module_between_steps(tmp_path):
    found = planted(tmp_path, {"smoke/__init__.py": 'from importlib import import_module as load\n\ndef run(step):\n'
                                                  '    return load(".server", "runbook.launch")\n'})
    assert found["step_to_step"] == ["runbook/smoke/__init__.py:4: step smoke imports step runbook.launch.server "
                                     "(through import_module)"]


def test_planted_dunder_import_upward(tmp_path):
    found = planted(tmp_path, {"api/guards.py": 'def later():\n    return __import__("runbook.launch", fromlist=["x"])\n'})
    assert found["upward"] == ["runbook/api/guards.py:2: api (layer 6) imports runbook.launch (layer 10) "
                               "(through __import__)"]


def test_planted_attribute_chain_through_a_step(tmp_path):
    """``import runbook.api`` binds ``runbook``: ``runbook.launch.server`` then reaches another step."""
    found = planted(tmp_path, {"smoke/__init__.py": 'import runbook.api\n\ndef run(step):\n'
                                                  '    return runbook.launch.server.start()\n'})
    assert found["step_to_step"] == ["runbook/smoke/__init__.py:4: step smoke imports step runbook.launch.server "
                                     "(through attribute)"]


def test_planted_cycle_inside_one_layer(tmp_path):
    """api.guards -> engram_tools.layout -> api.client: no module cycle, but api and engram_tools (one layer)
    need each other."""
    found = planted(tmp_path, {"api/guards.py": "from ..engram_tools import layout\n"})
    assert found["module_cycle"] == []
    assert found["component_cycle"] == ["api -> engram_tools -> api"]


def test_planted_import_by_computed_name(tmp_path):
    found = planted(tmp_path, {"api/guards.py": 'import importlib\nNAME = "runbook.launch"\n'
                                                'mod = importlib.import_module(NAME)\n'})
    assert found["dynamic"] == ["runbook/api/guards.py:3: import by a computed name (write the module's name as a "
                                "literal)"]


def test_planted_profile_before_cluster(tmp_path):
    """A function (or lambda) taking ``profile`` before ``cluster`` is reported, wherever the two sit; the
    documented order and a function with only one of them are not."""
    found = planted(tmp_path, {"launch/server.py": "from ..api import client\n\n"
                                                   "def start(cluster, profile, plan):\n    return client\n\n"
                                                   "def stop(profile, *, cluster=None):\n    return profile\n\n"
                                                   "def status(profile):\n    return profile\n\n"
                                                   "later = lambda profile, node, cluster: node\n"})
    assert found["argument_order"] == [
        "runbook/launch/server.py:6: stop(profile, cluster) puts profile before cluster (the order is (cluster, "
        "profile, …))",
        "runbook/launch/server.py:12: lambda(profile, node, cluster) puts profile before cluster (the order is "
        "(cluster, profile, …))"]


# -- step_to_lab: a step reaches the lab in none of the ways an import can be written ------------------------------

LAB = {"lab/__init__.py": '"""lab"""\n', "lab/sim.py": "def install():\n    return []\n"}


@pytest.mark.parametrize("plant, line, via", [
    ({"smoke/__init__.py": "import runbook.lab.sim\n\ndef run(step):\n    return step\n"},
     "runbook/smoke/__init__.py:1: step smoke imports runbook.lab.sim", ""),
    ({"launch/server.py": "from ..lab import sim\n\ndef start():\n    return sim\n"},
     "runbook/launch/server.py:1: step launch imports runbook.lab.sim", ""),
    ({"launch/server.py": "def start():\n    from ..lab.sim import install\n    return install()\n"},
     "runbook/launch/server.py:2: step launch imports runbook.lab.sim", ""),
    ({"launch/server.py": 'import importlib\n\ndef start():\n    return importlib.import_module("runbook.lab.sim")\n'},
     "runbook/launch/server.py:4: step launch imports runbook.lab.sim", " (through import_module)"),
    ({"smoke/__init__.py": "import runbook.api\n\ndef run(step):\n    return runbook.lab.sim.install()\n"},
     "runbook/smoke/__init__.py:4: step smoke imports runbook.lab.sim", " (through attribute)"),
], ids=["import", "from_import", "lazy_import", "import_module", "attribute_chain"])
def test_planted_step_imports_the_lab(tmp_path, plant, line, via):
    """Each way of reaching the lab from a step is reported by step_to_lab, and by no other rule: the lab's layer is
    below the steps', so without this rule none of them would fail."""
    found = planted(tmp_path, {**LAB, **plant})
    assert found["step_to_lab"] == [f"{line}{via} (ask step.site: runbook.site)"]
    assert not any(v for rule, v in found.items() if rule != "step_to_lab"), found


def test_the_planted_lab_itself_is_clean(tmp_path):
    """The planted lab package alone breaks no rule (so each plant above fails only for its import)."""
    found = planted(tmp_path, LAB)
    assert not any(found.values()), found
