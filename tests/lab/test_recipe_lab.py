"""The recipe container contract on the lab, with real vLLM (CPU build) in both runtimes.

The lab recipe (runbook/lab/recipe/) is pinned in env/lab.env: the head clones it from the lab's local
"upstream" repository, the worker gets it over the fabric, every node is verified at the pinned commit,
every rank starts through start.sh (fail-closed patch target check, overlay on PYTHONPATH, exec), the
API answers with the patch's header, and every rank's boot log shows its markers. A hand-placed tree
whose patch names a function vLLM does not have is refused by the chain on every rank (FATAL, no server).
"""
from __future__ import annotations

import time
import urllib.request

import pytest

from runbook.checks import Status
from runbook.launch import checkout, image, server, stop
from runbook.facts import ranks
from runbook.launch.plan import render_plan
from runbook.api import endpoint
from runbook.profile import REPO_ROOT, load_profile
from runbook.remote import Cluster, quote
from support.tiny import tiny_model_on

VENV = REPO_ROOT / ".lab" / "vllm-venv"
MODEL_DIR = "/mnt/nvme/models/tiny-recipe"
OVERRIDES = {"MODEL_DIR": MODEL_DIR, "WEIGHTS_DIR": MODEL_DIR, "READY_TIMEOUT": "900", "HANG_SECONDS": "300"}
CHECKOUT_ROW = "recipe checkout at the pinned commit"
MARKER_ROW = "recipe start chain markers in the boot log"

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                 reason=f"{VENV} missing: make lab-vllm installs the lab's CPU vLLM")]


def _profile(**extra):
    return load_profile(REPO_ROOT / "env" / "lab.env", {**OVERRIDES, **extra})


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    profile = _profile()
    c = Cluster.from_profile(profile, run_dir=tmp_path_factory.mktemp("recipe-run"))
    stop.stop(c, profile, mem_settle_s=0)
    yield c
    try:
        stop.stop(c, profile, mem_settle_s=0)
    finally:
        c.close()


@pytest.fixture(scope="module")
def tiny_model(cluster, tmp_path_factory):
    return tiny_model_on(cluster, MODEL_DIR, tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def stop_after(cluster):
    yield
    stop.stop(cluster, _profile(), mem_settle_s=0)


def _rows(result, name):
    return {c.node: c for c in result.checks if c.name == name}


# the docker runtime through the same chain is what every recipe rehearsal runs (tests/lab/test_rehearsal_lab.py:
# checkout on every node, markers on every rank, the second start); one more CPU vLLM boot here would only
# repeat it, so this file starts the process runtime
@pytest.mark.parametrize("runtime", ["process"])
def test_every_rank_starts_through_the_pinned_recipe_chain(cluster, tiny_model, stop_after, runtime):
    profile = _profile(RUNTIME=runtime)
    if runtime == "docker":
        assert not image.ensure_image(cluster, profile).failures()
    worker = cluster["worker"]
    worker.run(f"rm -rf {quote(profile.recipe_dir)}")          # the worker gets it over the fabric again
    plan = render_plan(cluster, profile)
    result = server.start(cluster, profile, plan)
    assert result.ok, result.checks.to_text()

    rows = _rows(result, CHECKOUT_ROW)
    assert set(rows) == {"head", "worker"} and all(c.status in (Status.PASS, Status.NOOP) for c in rows.values())
    assert "shipped from the head" in rows["worker"].observed
    for node in cluster:                                       # the read-only fact, on every node
        got = node.read(f"git -C {quote(profile.recipe_dir)} rev-parse HEAD").stdout.strip()
        assert got == profile.recipe_commit, node.name

    markers = _rows(result, MARKER_ROW)
    assert set(markers) == {"head", "worker"} and all(c.status == Status.PASS for c in markers.values())
    rec = result.recipe
    assert rec["repo"] == profile.recipe_repo and rec["commit"] == profile.recipe_commit
    assert len(rec["markers"]["head"]) == 3 and len(rec["markers"]["worker"]) == 2
    assert any("patched vllm.entrypoints.launchers.app.build_app" in line for line in rec["markers"]["head"])

    with urllib.request.urlopen(endpoint.base_url(profile) + "/v1/models", timeout=30) as resp:
        assert resp.headers.get("x-spark-runbook-recipe") == "lab-recipe-v1"     # the patch changed vLLM

    again = server.start(cluster, profile, render_plan(cluster, profile))   # reused: verified only
    assert again.reused and all(c.status == Status.NOOP for c in _rows(again, CHECKOUT_ROW).values())


def test_a_head_checkout_with_local_changes_is_refused_before_anything_starts(cluster, tiny_model, stop_after):
    profile = _profile()
    assert not checkout.ensure_checkout(cluster, profile)[0].failures()
    path = f"{profile.recipe_dir}/start.sh"
    cluster.head.run(f"printf '# local edit\\n' >> {quote(path)}")
    try:
        result = server.start(cluster, profile, render_plan(cluster, profile), raise_on_failure=False)
        assert not result.ok
        head = _rows(result, CHECKOUT_ROW)["head"]
        assert head.status == Status.FAIL and "never discards local changes" in head.fix
        assert not any(ranks.rank_state(n, profile).processes for n in cluster)
    finally:
        cluster.head.run(f"git -C {quote(profile.recipe_dir)} checkout -- start.sh")


def test_a_missing_patch_target_stops_every_rank_before_vllm(cluster, tiny_model, stop_after):
    """A tree placed by hand (.recipe-commit) whose patch targets a function this vLLM lacks: the chain
    refuses on every rank, the start fails fast naming the FATAL line, nothing is left running."""
    base = _profile()
    d = "/mnt/nvme/recipe/hand-placed-broken"
    for node in cluster:
        node.run(f"rm -rf {quote(d)} && mkdir -p {quote(d)} && "
                 f"cp -r {quote(str(checkout.LAB_SOURCE))}/. {quote(d)} && "
                 f"printf '%s\\n' {base.recipe_commit} > {quote(d)}/.recipe-commit && sed -i "
                 f"'s/^TARGET_FUNC = \"build_app\"/TARGET_FUNC = \"build_app_gone\"/' {quote(d)}/overlay/spark_lab_patch.py")
    profile = _profile(RECIPE_DIR=d)
    t0 = time.monotonic()
    result = server.start(cluster, profile, render_plan(cluster, profile), raise_on_failure=False)
    assert not result.ok and time.monotonic() - t0 < 300
    failed = [c for c in result.checks if c.status == Status.FAIL]
    text = " ".join(c.observed for c in failed)
    assert "FATAL: patch target vllm.entrypoints.launchers.app.build_app_gone missing" in text, text
    checkout_rows = _rows(result, CHECKOUT_ROW)
    assert checkout_rows and all(c.status == Status.NOOP for c in checkout_rows.values())   # the tree was at the pin
    for node in cluster:
        st = ranks.rank_state(node, profile)
        assert not st.running and not st.processes, (node.name, st)
