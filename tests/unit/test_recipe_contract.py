"""The recipe container contract (runbook/launch/recipe.py, checkout.py), run for real where it can run here.

* The lab recipe's start.sh as a local subprocess, on a clone of the lab recipe repository at the pinned
  commit, with a fake `vllm` executable (a Python script that refuses argv it does not know) and a fake
  installed vLLM package: the patch applies (sitecustomize wraps build_app; the header comes back from an
  ASGI request), then the argv is exec'd unchanged (same pid); a missing target aborts with one FATAL
  line and nothing is exec'd.
* The seed entrypoint generator (the one that writes seed A's and seed B's chains) run for real on a
  recipe whose targets are temporary files: present -> exec; missing target or failing step -> FATAL.
* The checkout probe against real git trees; ensure_checkout on a head whose commands run in a local shell.
* The boot-log marker verifier on real chain output and on per-rank logs (TP=3 pad on every rank).
"""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runbook.checks import Status
from runbook.errors import LabError, ProfileError
from runbook.launch import recipe, server
from runbook.launch.checkout import (LAB_SOURCE, CheckoutFact, checkout_probe_cmd, ensure_checkout, lab_source_commit,
                                     lab_source_repo, parse_checkout)
from runbook.launch.recipe import ChainStep, Marker, RankRecipe, RecipePin
from runbook.launch.render import NodeFacts, render
from runbook.profile import REPO_ROOT, load_profile
from support.doubles import FakeCluster, LocalNode

ENV = REPO_ROOT / "env"
NO_ENV: dict[str, str] = {}
ALL = {n: NodeFacts(home="/home/spark") for n in ("head", "worker", "worker2")}

FAKE_VLLM = '''#!{python}
"""Test double for the `vllm` CLI: accepts only `serve <model> [known flags]`, then reports what it got."""
import asyncio, json, os, sys
KNOWN = {{"--port": 1, "--host": 1, "--served-model-name": 1, "--headless": 0, "--tensor-parallel-size": 1}}
argv = sys.argv[1:]
if len(argv) < 2 or argv[0] != "serve" or argv[1].startswith("-"):
    print(f"fake vllm: refusing argv {{argv}}", file=sys.stderr); sys.exit(2)
i = 2
while i < len(argv):
    if argv[i] not in KNOWN:
        print(f"fake vllm: unknown flag {{argv[i]}}", file=sys.stderr); sys.exit(2)
    i += 1 + KNOWN[argv[i]]
from vllm.entrypoints.launchers import app as m       # the (fake) installed vLLM, through the overlay's hook
built = m.build_app(None)
headers = []
async def send(message):
    if message["type"] == "http.response.start":
        headers.extend(message["headers"])
asyncio.run(built({{"type": "http"}}, None, send))
print("FAKE-VLLM " + json.dumps({{"argv": argv, "pid": os.getpid(),
                                  "headers": [[k.decode(), v.decode()] for k, v in headers]}}), flush=True)
'''

FAKE_APP = '''
class App:
    """Enough of a Starlette app: middleware added before start, and an ASGI call."""
    def __init__(self):
        self.middleware_stack = None
        self.wrappers = []
    def add_middleware(self, cls):
        self.wrappers.append(cls)
    async def __call__(self, scope, receive, send):
        async def inner(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"x")]})
        app = inner
        for cls in reversed(self.wrappers):
            app = cls(app)
        await app(scope, receive, send)


def build_app(args, supported_tasks=None, model_config=None):
    return App()
'''


# ----------------------------------------------------------------------------- fixtures

def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def lab_pin(tmp_path_factory) -> tuple[Path, str]:
    """The lab recipe repository built like the launch builds it, and the pinned commit."""
    tmp = tmp_path_factory.mktemp("labrepo")
    prof = load_profile(ENV / "lab.env", {"RECIPE_REPO": str(tmp / "lab-recipe.git")}, environ=NO_ENV)
    return lab_source_repo(prof), prof.recipe_commit


@pytest.fixture()
def checkout(tmp_path, lab_pin) -> Path:
    repo, commit = lab_pin
    d = tmp_path / "checkout"
    _git("clone", "--quiet", str(repo), str(d))
    _git("-C", str(d), "checkout", "--quiet", "--detach", commit)
    return d


def _fake_install(root: Path, app_source: str | None = FAKE_APP) -> Path:
    """A fake installed vLLM (site dir) and the fake `vllm` executable (bin dir)."""
    site, bin_dir = root / "site", root / "bin"
    pkg = site / "vllm" / "entrypoints" / "launchers"
    pkg.mkdir(parents=True)
    for d in (site / "vllm", site / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    if app_source is not None:
        (pkg / "app.py").write_text(app_source)
    bin_dir.mkdir()
    exe = bin_dir / "vllm"
    exe.write_text(FAKE_VLLM.format(python=sys.executable))
    exe.chmod(0o755)
    return root


def _run_chain(script: Path, argv: list[str], fake: Path, shell: str = "sh", extra_env=None):
    env = {"PATH": f"{fake / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(fake / "site"),
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(fake), "SPARK_RUNBOOK_RECIPE_COMMIT": "c" * 40,
           **(extra_env or {})}
    return subprocess.run([shell, str(script), *argv], env=env, capture_output=True, text=True, timeout=120)


def _fake_report(stdout: str) -> dict | None:
    lines = [l for l in stdout.splitlines() if l.startswith("FAKE-VLLM ")]
    return json.loads(lines[0][len("FAKE-VLLM "):]) if lines else None


ARGV = ["vllm", "serve", "/mnt/nvme/models/tiny", "--served-model-name", "tiny", "--port", "8000",
        "--tensor-parallel-size", "2", "--headless"]


# ----------------------------------------------------------------------------- the lab start chain, for real

def test_the_pinned_lab_commit_is_what_the_lab_recipe_files_make(lab_pin):
    _, commit = lab_pin
    assert lab_source_commit() == commit           # the files make the pinned commit
    for name in ("lab.env", "lab-tp3.env"):
        assert load_profile(ENV / name, environ=NO_ENV).recipe_commit == commit, \
            f"env/{name}: set RECIPE_COMMIT={lab_source_commit()} (the lab recipe files changed)"


def test_lab_source_repo_refuses_files_that_do_not_make_the_pin(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(LAB_SOURCE, src, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "start.sh").write_text((src / "start.sh").read_text() + "# edited\n")
    prof = load_profile(ENV / "lab.env", {"RECIPE_REPO": str(tmp_path / "r.git")}, environ=NO_ENV)
    with pytest.raises(LabError, match="set RECIPE_COMMIT="):
        lab_source_repo(prof, src=src)
    assert not (tmp_path / "r.git").exists()


def test_lab_chain_applies_the_patch_then_execs_the_exact_argv(tmp_path, checkout):
    fake = _fake_install(tmp_path / "fake")
    res = _run_chain(checkout / "start.sh", ARGV, fake)
    assert res.returncode == 0, res.stderr
    got = _fake_report(res.stdout)
    assert got is not None, res.stdout + res.stderr
    assert got["argv"] == ARGV[1:]                                           # exactly the argv after `vllm`
    assert ["x-spark-runbook-recipe", "lab-recipe-v1"] in got["headers"]     # the patch changed vLLM's app
    chain_pid = next(l for l in res.stdout.splitlines() if "start chain complete" in l).split("pid ")[1].rstrip(")")
    assert int(chain_pid) == got["pid"]                                     # exec, not a child process
    out = res.stdout + res.stderr
    assert out.index("applied step 2/2") < out.index("FAKE-VLLM")
    head = recipe.rank_recipe(load_profile(ENV / "lab.env", environ=NO_ENV), is_head=True)
    found = recipe.find_markers(head.markers, out)
    assert len(found) == 3 and all(found.values()), found                    # the verifier sees every marker
    assert recipe.chain_failures(out) == []


@pytest.mark.parametrize("app_source,why", [(None, "missing: "), ("def other():\n    pass\n", "does not define it")])
def test_lab_chain_fails_closed_when_the_patch_target_is_missing(tmp_path, checkout, app_source, why):
    fake = _fake_install(tmp_path / "fake", app_source)
    res = _run_chain(checkout / "start.sh", ARGV, fake)
    assert res.returncode != 0
    assert _fake_report(res.stdout) is None and "FAKE-VLLM" not in res.stdout   # nothing was exec'd
    fatal = recipe.chain_failures(res.stderr)
    assert any("FATAL: patch target vllm.entrypoints.launchers.app" in l and why in l for l in fatal), res.stderr
    assert any("FATAL: step 1/2 patch target" in l and "refusing to start" in l for l in fatal)
    assert "start chain complete" not in res.stdout


def test_lab_chain_fails_closed_on_an_incomplete_checkout_and_without_argv(tmp_path, checkout):
    fake = _fake_install(tmp_path / "fake")
    res = _run_chain(checkout / "start.sh", [], fake)
    assert res.returncode != 0 and "FATAL: no vLLM argv given" in res.stderr
    (checkout / "overlay" / "sitecustomize.py").unlink()
    res = _run_chain(checkout / "start.sh", ARGV, fake)
    assert res.returncode != 0 and _fake_report(res.stdout) is None
    assert "FATAL: missing" in res.stderr and "sitecustomize.py" in res.stderr


def test_the_overlay_hook_itself_fails_closed_on_a_module_without_the_target(tmp_path, checkout):
    fake = _fake_install(tmp_path / "fake", "def other():\n    pass\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": f"{checkout / 'overlay'}:{fake / 'site'}"}
    res = subprocess.run([sys.executable, "-c", "import vllm.entrypoints.launchers.app"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "ImportError" in res.stderr
    assert "FATAL: patch target vllm.entrypoints.launchers.app.build_app is missing" in res.stderr


def test_fake_vllm_refuses_argv_it_does_not_know(tmp_path):
    fake = _fake_install(tmp_path / "fake")
    for argv in (["bogus"], ["serve"], ["serve", "/m", "--not-a-flag"]):
        res = subprocess.run([str(fake / "bin" / "vllm"), *argv], capture_output=True, text=True, timeout=60,
                             env={"PYTHONPATH": str(fake / "site"), "PATH": "/usr/bin:/bin"})
        assert res.returncode == 2 and _fake_report(res.stdout) is None, argv


# ----------------------------------------------------------------------------- the seeds' generator, for real

def _synthetic(tmp_path: Path, *, fail_step: bool = False, warn_only: bool = False) -> RankRecipe:
    tgt = tmp_path / "opt"
    tgt.mkdir()
    (tgt / "patch_a.py").write_text("print('[patch_a] applied')\n")
    (tgt / "patch_b.py").write_text("import sys; sys.exit(7)\n" if fail_step else "print('[patch_b] ok')\n")
    steps = [ChainStep("patch a", (str(tgt / "patch_a.py"),), f"python3 {tgt / 'patch_a.py'}"),
             ChainStep("patch b", (str(tgt / "patch_b.py"), str(tgt)), f"python3 {tgt / 'patch_b.py'}",
                  warn_only=warn_only)]
    rr = RankRecipe(name="t", pin=RecipePin("https://x/y", "a" * 40, "~/y"), shell="bash", entry="/start.sh",
                    generated=True, prefix="t-head", steps=steps,
                    markers=[Marker(recipe.CHAIN_DONE.format(n=2), "chain")])
    rr.script = recipe.entrypoint_script(rr)
    return rr


def _write(tmp_path: Path, rr: RankRecipe) -> Path:
    p = tmp_path / "entry.sh"
    p.write_text(rr.script)
    return p


def test_generated_chain_runs_every_step_then_execs(tmp_path):
    rr = _synthetic(tmp_path)
    fake = _fake_install(tmp_path / "fake")
    res = _run_chain(_write(tmp_path, rr), ARGV, fake, shell="bash")
    assert res.returncode == 0, res.stderr
    assert _fake_report(res.stdout)["argv"] == ARGV[1:]
    assert res.stdout.index("[patch_a] applied") < res.stdout.index("[patch_b] ok") < res.stdout.index("FAKE-VLLM")
    assert rr.markers and all(recipe.find_markers(rr.markers, res.stdout).values())


def test_generated_chain_aborts_on_a_missing_target(tmp_path):
    rr = _synthetic(tmp_path)
    (tmp_path / "opt" / "patch_b.py").unlink()
    res = _run_chain(_write(tmp_path, rr), ARGV, _fake_install(tmp_path / "fake"), shell="bash")
    assert res.returncode == 1 and _fake_report(res.stdout) is None
    assert "[patch_a] applied" in res.stdout                               # earlier steps ran, in order
    assert recipe.chain_failures(res.stderr) == [f"[t-head] FATAL: step 2/2 patch b: missing {tmp_path}/opt/patch_b.py"]


def test_generated_chain_aborts_on_a_failing_step_with_its_exit_code(tmp_path):
    rr = _synthetic(tmp_path, fail_step=True)
    res = _run_chain(_write(tmp_path, rr), ARGV, _fake_install(tmp_path / "fake"), shell="bash")
    assert res.returncode == 1 and _fake_report(res.stdout) is None
    assert recipe.chain_failures(res.stderr) == ["[t-head] FATAL: step 2/2 patch b failed (exit 7)"]


def test_a_tolerated_step_that_fails_warns_and_the_chain_goes_on(tmp_path):
    """Risk settled (issue #22): seed A's patch loop only warns on a failing patch; the chain follows it (one WARN
    line naming the patch, then the exec) and step 04 adds a WARN row naming it."""
    from runbook.launch.server import StartResult, patch_warning_checks
    rr = _synthetic(tmp_path, fail_step=True, warn_only=True)
    res = _run_chain(_write(tmp_path, rr), ARGV, _fake_install(tmp_path / "fake"), shell="bash")
    assert res.returncode == 0, res.stderr
    assert _fake_report(res.stdout)["argv"] == ARGV[1:]                    # vLLM still started
    warned = recipe.chain_warnings(res.stdout)
    assert warned == ["[t-head] WARN: step 2/2 patch b failed (exit 7); the boot continues as the recipe's does"]
    assert recipe.chain_failures(res.stdout + res.stderr) == []
    plan = render(load_profile(ENV / "exl3-v41.env", environ=NO_ENV), ALL)
    result = StartResult(plan=plan, base_url="")
    patch_warning_checks(plan, result, {"worker": res.stdout, "head": "clean boot"})
    rows = [c for c in result.checks if c.name == "recipe patches applied"]
    assert [(c.node, c.status.value) for c in rows] == [("worker", "WARN")] and "patch b" in rows[0].observed


def test_seed_a_patch_loop_is_fail_open_and_seed_b_hotfixes_fail_closed():
    a = render(load_profile(ENV / "exl3-v41.env", environ=NO_ENV), ALL).head
    b = render(load_profile(ENV / "dspark-v4.env", environ=NO_ENV), ALL).head
    for n in recipe.SEED_A_PATCHES:
        assert "else say \"WARN: step" in a.entry_script.split(f"python3 /opt/dsv41/{n}", 1)[1].split("\n")[1], n
    assert "WARN: step" not in b.entry_script and b.entry_script.count("|| fatal") >= 20


@pytest.mark.parametrize("name,keyed", [("exl3-v41", False), ("dspark-v4", True), ("tp3-dspark", False)])
def test_seed_entrypoints_are_valid_bash_and_every_target_is_mounted_or_in_the_image(name, keyed):
    plan = render(load_profile(ENV / f"{name}.env", environ=NO_ENV), ALL, api_key_set=keyed)
    assert plan.ranks
    for r in plan.ranks:
        assert subprocess.run(["bash", "-n"], input=r.entry_script, text=True, timeout=30).returncode == 0
        rr = recipe.rank_recipe(load_profile(ENV / f"{name}.env", environ=NO_ENV), is_head=r.rank == 0,
                                api_key_set=keyed and r.rank == 0)
        assert rr.steps and rr.mounts
        mounted = [m.target for m in rr.mounts]
        # each `need <path> <label>` line of the script, its path as bash reads it (quotes removed, $SITE kept)
        needed = {shlex.split(ln)[1] for ln in r.entry_script.splitlines() if ln.strip().startswith("need ")}
        assert needed == {req for s in rr.steps for req in s.requires} and needed, (name, r.node)
        for s in rr.steps:
            for req in s.requires:
                # a recipe file is mounted from the checkout; the rest is the image, the model or the weights
                in_image = req.startswith(("$SITE/", recipe.SEED_B_VLLM, "/cache/huggingface/", "/model",
                                           "/engram-src"))
                assert in_image or any(req == t or req.startswith(t + "/") for t in mounted), (name, s.name, req)
                assert req in needed, (name, s.name, req)
        vols = [r.docker_argv[i + 1] for i, a in enumerate(r.docker_argv) if a == "-v"]
        assert f"{r.entry_path}:{rr.entry}:ro" in vols
        for m in rr.mounts:
            assert any(v.endswith(f"/{m.source}:{m.target}:ro") for v in vols), m


def test_seed_b_chain_order_keys_and_tp3_pad_on_every_rank():
    two = render(load_profile(ENV / "dspark-v4.env", environ=NO_ENV), ALL, api_key_set=True)
    names = two.recipe_chain["steps"]["head"]
    order = ["issue55 tool-call truncation", "issue22 nvfp4_ds_mla fast path", "API-key log redaction",
             "Vision-Exp hotfix", "suppress stops in reasoning"]
    assert [n for n in names if n in order] == order                         # the compose's order
    assert "API-key log redaction" not in two.recipe_chain["steps"]["worker"]   # the key is only on the head
    assert "TP=3 head pad" not in names
    three = render(load_profile(ENV / "tp3-dspark.env", environ=NO_ENV), ALL)
    for node in ("head", "worker", "worker2"):
        assert three.recipe_chain["steps"][node][-1] == "TP=3 head pad"
        assert "DSv4 TP pad: heads 64 -> 72 for TP=3" in three.rank(node).recipe_markers


def test_checkout_files_name_what_the_chains_mount():
    a = recipe.checkout_files(load_profile(ENV / "exl3-v41.env", environ=NO_ENV))
    # seed A launch_cluster: 17 recipe files under /opt/dsv41 (chat template, 12 patches, exl3.py, k map, 2 Engram)
    assert "overlay/exl3.py" in a and "files/chat_template.jinja" in a and len(a) == 17
    b = recipe.checkout_files(load_profile(ENV / "tp3-dspark.env", environ=NO_ENV))
    assert {"patches/tp3/apply_tp3_patch.py", "patches/hotfix-vllm-redact-api-key-log.sh",
            "patches/hotfix-nvfp4-ds-mla-issue22.sh", "patches/hotfix-dsv4-vision-exp.py"} <= set(b)
    assert recipe.checkout_files(load_profile(ENV / "lab.env", environ=NO_ENV)) == \
        ["start.sh", "overlay/spark_lab_patch.py", "overlay/sitecustomize.py"]


# ----------------------------------------------------------------------------- the checkout probe, real trees

def _probe(path: Path, files: list[str]) -> CheckoutFact:
    out = subprocess.run(["bash", "-c", checkout_probe_cmd(str(path), files)], capture_output=True,
                         text=True, timeout=60).stdout
    return parse_checkout(out)


def test_probe_reads_commit_cleanliness_and_missing_files(tmp_path, checkout, lab_pin):
    _, commit = lab_pin
    files = ["start.sh", "overlay/spark_lab_patch.py"]
    f = _probe(checkout, files)
    assert (f.state, f.commit, f.dirty, f.missing) == ("git", commit, 0, []) and f.good(commit)
    (checkout / "overlay" / "pycache-like.pyc").write_bytes(b"x")           # untracked files do not count
    assert _probe(checkout, files).good(commit)
    (checkout / "start.sh").write_text("#!/bin/sh\nexec \"$@\"\n")
    f = _probe(checkout, files)
    assert f.at(commit) and f.dirty == 1 and not f.good(commit)
    assert _probe(checkout, files + ["overlay/nope.py"]).missing == ["overlay/nope.py"]
    assert _probe(tmp_path / "absent", files).state == "missing"
    tree = tmp_path / "by-hand"
    tree.mkdir()
    (tree / ".recipe-commit").write_text(commit + "\n")
    (tree / "start.sh").write_text("")
    f = _probe(tree, ["start.sh"])
    assert (f.state, f.commit) == ("marker", commit) and f.good(commit)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    f = _probe(other, [])
    assert (f.state, f.entries) == ("other", 1) and not f.at(commit)


# ----------------------------------------------------------------------------- ensure_checkout on a local head

def local_head(home: Path) -> LocalNode:
    """The head as a local shell with HOME=``home``: real git, real files."""
    return LocalNode("head", 0, home=home, cwd=home, ssh="local", fabric_ip="127.0.0.1")


def test_ensure_checkout_clones_at_the_pin_then_noops_and_refuses_local_changes(tmp_path, lab_pin):
    repo, commit = lab_pin
    prof = load_profile(ENV / "lab.env", {"RECIPE_REPO": str(repo), "RECIPE_DIR": "~/recipes/lab"}, environ=NO_ENV)
    node = local_head(tmp_path)
    checks, data = ensure_checkout(FakeCluster([node]), prof)
    [c] = checks
    assert c.status == Status.PASS and "cloned" in c.observed and (tmp_path / "recipes/lab/start.sh").is_file()
    assert data["nodes"]["head"]["commit"] == commit and data["nodes"]["head"]["path"] == f"{tmp_path}/recipes/lab"
    assert any(cmd.startswith("mkdir -p") and "git clone" in cmd for cmd in node.commands)
    [c] = ensure_checkout(FakeCluster([node]), prof)[0]
    assert c.status == Status.NOOP                                         # already at the pin: nothing done
    (tmp_path / "recipes/lab/start.sh").write_text("changed\n")
    [c] = ensure_checkout(FakeCluster([node]), prof)[0]
    assert c.status == Status.FAIL and "never discards local changes" in c.fix
    assert (tmp_path / "recipes/lab/start.sh").read_text() == "changed\n"   # untouched


def test_ensure_checkout_names_the_failing_clone_and_how_to_place_it_by_hand(tmp_path, lab_pin):
    _, commit = lab_pin
    prof = load_profile(ENV / "exl3-v41.env", {"RECIPE_REPO": "https://127.0.0.1:9/none.git",
                                               "RECIPE_DIR": str(tmp_path / "r")}, environ=NO_ENV)
    [c] = ensure_checkout(FakeCluster([local_head(tmp_path)]), prof)[0]
    assert c.status == Status.FAIL and "git clone --quiet https://127.0.0.1:9/none.git" in c.observed
    assert "place it by hand" in c.fix and "checkout 503b4825f435dde0ecdacab4b333afc6acaac8c2" in c.fix
    assert not (tmp_path / "r").exists()


def test_ensure_checkout_refuses_a_directory_that_is_no_checkout(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "mine.txt").write_text("x")
    prof = load_profile(ENV / "lab.env", {"RECIPE_REPO": str(tmp_path / "repo.git"), "RECIPE_DIR": str(tmp_path / "r")},
                        environ=NO_ENV)
    [c] = ensure_checkout(FakeCluster([local_head(tmp_path)]), prof)[0]
    assert c.status == Status.FAIL and "no recipe checkout" in c.observed
    assert (tmp_path / "r" / "mine.txt").read_text() == "x"


# ----------------------------------------------------------------------------- boot-log markers, every rank

PAD = "(EngineCore pid=311) INFO 12-01 05:40:02 [dsv4_tp_pad.py:88] DSv4 TP pad: heads 64 -> 72 for TP=3"


def test_marker_checks_want_the_tp3_pad_on_every_rank_and_record_the_found_lines():
    prof = load_profile(ENV / "tp3-dspark.env", environ=NO_ENV)
    plan = render(prof, ALL)
    done = f"[dspark-v4] {recipe.CHAIN_DONE.format(n=len(plan.recipe_chain['steps']['head']))} (pid 1)"
    logs = {"head": f"{done}\n{PAD}\n", "worker": f"{done}\n{PAD}\n", "worker2": f"{done}\nno pad here\n"}
    result = server.StartResult(plan=plan, base_url="http://x")
    server.marker_checks(plan, result, logs)
    by_node = {c.node: c for c in result.checks}
    assert set(by_node) == {"head", "worker", "worker2"}
    assert by_node["head"].status == by_node["worker"].status == Status.PASS
    assert by_node["worker2"].status == Status.FAIL and "DSv4 TP pad" in by_node["worker2"].observed
    assert "apply_tp3_patch.py" in by_node["worker2"].fix
    rec = recipe.marker_record(recipe.recipe_pin(prof), {r.node: r.recipe_markers for r in plan.ranks}, logs)
    assert rec["repo"] == prof.recipe_repo and rec["commit"] == prof.recipe_commit
    assert rec["markers"]["head"] == [PAD, done] and rec["markers"]["worker2"] == [done]
    reused = server.StartResult(plan=plan, base_url="http://x", reused=True)
    server.marker_checks(plan, reused, logs)
    assert {c.node: c.status for c in reused.checks}["worker2"] == Status.NA


# ----------------------------------------------------------------------------- the profile keys

def _issues(name: str, overrides: dict[str, str]) -> dict[str, str]:
    with pytest.raises(ProfileError) as ei:
        load_profile(ENV / name, overrides, environ=NO_ENV)
    return {i.key: f"{i.message} | {i.fix}" for i in ei.value.issues}


@pytest.mark.parametrize("name,overrides,key,text", [
    ("exl3-v41.env", {"RECIPE_REPO": "", "RECIPE_COMMIT": "", "RECIPE_DIR": ""}, "RECIPE_REPO", "must be pinned"),
    ("exl3-v41.env", {"RECIPE_COMMIT": "503b482"}, "RECIPE_COMMIT", "40-character"),
    ("dspark-v4.env", {"RECIPE_COMMIT": ""}, "RECIPE_COMMIT", "RECIPE_COMMIT is empty"),
    ("dspark-v4.env", {"RECIPE_DIR": "~"}, "RECIPE_DIR", "system or private"),
    ("dspark-v4.env", {"RECIPE_DIR": "/mnt"}, "RECIPE_DIR", "system or private"),
    ("dspark-v4.env", {"RECIPE_DIR": "recipes/x"}, "RECIPE_DIR", "absolute or ~/ path"),
    ("exl3-v41.env", {"RECIPE_REPO": "/srv/recipe.git"}, "RECIPE_REPO", "https:// URL"),
    ("exl3-v41.env", {"RUNTIME": "process"}, "RUNTIME", "RUNTIME=docker"),
    ("lab.env", {"RECIPE_REPO": ""}, "RECIPE_COMMIT", "RECIPE_REPO is empty"),
])
def test_recipe_keys_are_validated(name, overrides, key, text):
    got = _issues(name, overrides)
    assert key in got and text in got[key], got


def test_a_lab_profile_without_a_recipe_serves_stock_vllm():
    prof = load_profile(ENV / "lab.env", {"RECIPE_REPO": "", "RECIPE_COMMIT": "", "RECIPE_DIR": ""}, environ=NO_ENV)
    plan = render(prof, ALL)
    assert plan.ranks and plan.recipe_chain is None
    assert all(not r.entry_argv and not r.recipe_markers for r in plan.ranks)
    assert "SPARK_RUNBOOK_RECIPE_COMMIT" not in plan.head.env
    assert textwrap.dedent(plan.head.start_command()).count(" & ") == 1
