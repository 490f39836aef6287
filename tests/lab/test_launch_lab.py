"""Step 04 in the lab: real vLLM (CPU build 0.32) tensor-parallel 2 across the two lab nodes, started
over SSH by runbook.launch.server with both runtimes, plus the faults.

One server start per runtime is shared by the assertions on it (start, reuse, refuse, status, logs,
stop); the faults start their own short-lived server. The model is a tiny random one placed on each
node's private /mnt/nvme by a fixture (generated with runbook.lab.tinymodel when absent). It lives in
its own directory so the weights step's tests, which own /mnt/nvme/models/tiny, cannot race with it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from runbook.launch import image, server, status, stop
from runbook.facts import ranks, system
from runbook.launch.plan import render_plan
from runbook.api import endpoint
from runbook.errors import ActionError
from runbook.profile import REPO_ROOT, load_profile
from runbook.remote import Cluster, quote
from support.tiny import tiny_model_on

VENV = REPO_ROOT / ".lab" / "vllm-venv"
MODEL_DIR = "/mnt/nvme/models/tiny-launch"
OVERRIDES = {"MODEL_DIR": MODEL_DIR, "WEIGHTS_DIR": MODEL_DIR, "READY_TIMEOUT": "900", "HANG_SECONDS": "300"}

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                 reason=f"{VENV} missing: make lab-vllm installs the lab's CPU vLLM")]

TIMINGS: dict[str, dict] = {}


def _profile(**extra):
    return load_profile(REPO_ROOT / "env" / "lab.env", {**OVERRIDES, **extra})


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    profile = _profile()
    c = Cluster.from_profile(profile, run_dir=tmp_path_factory.mktemp("launch-run"))
    stop.stop(c, profile, mem_settle_s=0)        # leftovers of an interrupted earlier run
    yield c
    try:
        stop.stop(c, profile, mem_settle_s=0)
    finally:
        c.close()
        if TIMINGS:
            print("\n[launch timings] " + json.dumps(TIMINGS, indent=1))


@pytest.fixture(scope="module")
def tiny_model(cluster, tmp_path_factory):
    """The tiny model at MODEL_DIR on every node (node-private /mnt/nvme)."""
    return tiny_model_on(cluster, MODEL_DIR, tmp_path_factory.mktemp("tiny"))


def _assert_nothing_left(cluster, profile):
    for node in cluster:
        st = ranks.rank_state(node, profile)
        assert not st.running and not st.processes and not st.container_status, (node.name, st)


def _record(name, result):
    TIMINGS[name] = {**result.data()["readiness_s"], "head_started_s": result.readiness.head_started,
                     "kv_tokens": result.startup.get("head", {}).get("kv_tokens")}


# ----------------------------------------------------------------------------- process runtime

@pytest.fixture
def stop_after(cluster):
    """Whatever a test leaves running is stopped (the next test starts from a clean lab)."""
    yield
    stop.stop(cluster, _profile(), mem_settle_s=0)


def test_process_runtime_start_reuse_refuse_status_logs_stop(cluster, tiny_model, stop_after):
    profile = _profile()
    plan = render_plan(cluster, profile)
    assert plan.runtime == "process" and plan.head.serve_argv[0].endswith(".lab/vllm-venv/bin/python")
    result = server.start(cluster, profile, plan)
    _record("process", result)
    r = result.readiness
    assert r.port_open is not None and r.port_open <= r.health <= r.models <= r.first_token
    # API_HOST=127.0.0.1 (the default): the head serves loopback, this machine reaches it over an SSH forward
    assert result.base_url == "http://127.0.0.1:8000 on spark-head (through an SSH forward)"
    assert "--host 127.0.0.1" in " ".join(plan.head.serve_argv)
    head_log = result.startup["head"]
    assert head_log["kv_tokens"] and head_log["startup_complete"]
    assert result.startup["worker"]["headless_master"] == "169.254.77.1:29501"
    assert result.startup["worker"]["world"]["init_method"] == "tcp://169.254.77.1:29501"
    assert [row["tokens"] for row in result.capacity] == [128, 781, 1953, 4096]
    assert result.ok, result.checks.to_text()

    # the same configuration again: reused (the seeds' "exit 3"), not restarted
    t0 = time.monotonic()
    again = server.start(cluster, profile, render_plan(cluster, profile))
    assert again.reused
    assert [c.status.value for c in again.checks if c.name == "server started"] == ["NO-OP"]
    assert time.monotonic() - t0 < 60

    # a different configuration: refused with the stop command
    other = _profile(MAX_NUM_SEQS="4")
    with pytest.raises(ActionError) as exc:
        server.start(cluster, other, render_plan(cluster, other))
    assert "different vLLM server" in exc.value.what and "runbook stop" in exc.value.fix

    st = status.status(cluster, profile)
    assert st["health"] == 200 and st["nodes"]["head"]["running"] and st["nodes"]["worker"]["running"]
    assert "Launching vLLM" in status.logs(cluster, profile, "worker", tail_lines=500)

    # stop through the CLI: both ranks (the headless worker does not exit by itself)
    args = [sys.executable, "-m", "runbook", "stop", "--profile", "env/lab.env"]
    for k, v in OVERRIDES.items():
        args += ["-p", f"{k}={v}"]
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    TIMINGS["process"]["stop_s"] = round(time.monotonic() - t0, 1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("no vLLM process or container left") == 2
    _assert_nothing_left(cluster, profile)


# ----------------------------------------------------------------------------- faults

def test_dead_worker_ends_the_wait_within_30s_with_both_log_tails(cluster, tiny_model, stop_after):
    profile = _profile()
    plan = render_plan(cluster, profile)
    killed: dict[str, float] = {}

    def kill_worker_soon():
        def run():
            worker = cluster.worker
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:        # wait until the worker is booting, then kill it
                if "Launching vLLM" in worker.read(f"cat {quote(plan.rank('worker').log_path)}").stdout:
                    break
                time.sleep(1)
            worker.run(f"kill -9 $(cat {quote(plan.rank('worker').pid_path)})")
            killed["t"] = time.monotonic()
        threading.Thread(target=run, daemon=True).start()

    with pytest.raises(ActionError) as exc:
        server.start(cluster, profile, plan, on_launched=kill_worker_soon)
    detected = exc.value.result.failure_detected_at - killed["t"]     # the wait ended (cleanup follows)
    TIMINGS["dead_worker_detected_s"] = round(detected, 1)
    assert detected <= 30
    assert "worker rank died" in exc.value.what
    assert "--- head log tail ---" in exc.value.observed and "--- worker log tail ---" in exc.value.observed
    _assert_nothing_left(cluster, profile)         # the failed start cleaned up after itself


def test_a_worker_that_never_started_stops_the_launch_before_the_head(cluster, tiny_model, stop_after):
    """The worker's command launches nothing (here a binary that does not exist, as when nested quoting split
    its environment): the start says so within seconds with the worker's log, and the head is never started
    (it would wait for the rendezvous until vLLM's timeout)."""
    profile = _profile()
    plan = render_plan(cluster, profile)
    worker = plan.rank("worker")
    worker.entry_argv, worker.serve_argv[0] = [], "/nonexistent/vllm"      # nothing to exec: dies at once
    t0 = time.monotonic()
    result = server.start(cluster, profile, plan, raise_on_failure=False)
    took = time.monotonic() - t0
    TIMINGS["worker_never_started_s"] = round(took, 1)
    failed = result.checks.failures()
    assert failed and failed[0].name == "workers running before the head starts", result.checks.to_text()
    assert failed[0].node == "worker" and "/nonexistent/vllm" in failed[0].observed, failed[0].observed
    assert result.readiness.head_started is None and took < 30, took
    _assert_nothing_left(cluster, profile)


def test_workers_master_port_disagreeing_is_refused_before_anything_runs(cluster, tiny_model):
    profile = _profile()
    plan = render_plan(cluster, profile, node_overrides={"worker": {"master_port": 29599}})
    t0 = time.monotonic()
    with pytest.raises(ActionError) as exc:
        server.start(cluster, profile, plan)
    assert time.monotonic() - t0 < 10
    assert "worker --master-port 29599 but head --master-port 29501" in exc.value.observed
    _assert_nothing_left(cluster, profile)


def test_master_port_in_use_on_the_head_is_refused_before_anything_runs(cluster, tiny_model, stop_after,
                                                                        hold_port):
    """A MASTER_PORT that something else holds on the head: refused at once, naming the port, not a
    rendezvous that never completes."""
    profile = _profile()
    port = profile.master_port
    with hold_port(cluster.head, port):
        plan = render_plan(cluster, profile)
        t0 = time.monotonic()
        with pytest.raises(ActionError) as exc:
            server.start(cluster, profile, plan)
        assert time.monotonic() - t0 < 20
        assert "in use on the head" in str(exc.value) + exc.value.observed, exc.value
        assert f"{port}:" in exc.value.observed, exc.value.observed
        _assert_nothing_left(cluster, profile)


def test_a_leftover_holding_the_master_port_on_the_worker_is_named_before_the_start(cluster, tiny_model, stop_after,
                                                                                     hold_port):
    """Relaunch safety (issue 25 item 4): a process of an earlier run still holding MASTER_PORT on a WORKER (where the
    new worker would join the old rendezvous) refuses the start before anything runs, naming the node, the port and
    the process, with `runbook stop` as the first fix."""
    profile = _profile()
    port = profile.master_port
    with hold_port(cluster.worker, port):
        t0 = time.monotonic()
        with pytest.raises(ActionError) as exc:
            server.start(cluster, profile, render_plan(cluster, profile))
        assert time.monotonic() - t0 < 20
        assert "in use on the worker" in exc.value.what, exc.value
        assert f"worker: {port}: python3(pid " in exc.value.observed and "import socket" in exc.value.observed
        assert exc.value.fix.startswith("python -m runbook stop --profile")
        _assert_nothing_left(cluster, profile)


def test_a_worker_with_another_vllm_build_is_refused_before_the_start(cluster, tiny_model, stop_after):
    """Identity before launch (issue 25 item 4): one file of the worker's vLLM package differs (a copy with one more
    line bind-mounted over it in the worker's own mount namespace: the head, the host and the venv are untouched;
    unmounted after). The start refuses before any rank runs, naming the package tree hash of each rank."""
    from runbook.launch import identity
    profile = _profile()
    py = render_plan(cluster, profile).head.serve_argv[0]
    where = cluster.worker.read(f"{quote(py)} -c " + quote("import importlib.util as u; "
                                                          "print(u.find_spec('vllm').submodule_search_locations[0])"),
                                timeout=60).stdout.strip()
    target, copy = f"{where}/envs.py", "/run/identity-test/envs.py"       # /run is each lab node's own tmpfs
    cluster.worker.run(f"mkdir -p /run/identity-test && cp {quote(target)} {copy} && "
                       f"echo '# another build' >> {copy} && mount --bind {copy} {quote(target)}", timeout=30)
    try:
        assert cluster.worker.read(f"tail -n 1 {quote(target)}").stdout.strip() == "# another build"
        assert "# another build" not in cluster.head.read(f"tail -n 1 {quote(target)}").stdout
        plan = render_plan(cluster, profile)
        t0 = time.monotonic()
        with pytest.raises(ActionError) as exc:
            server.start(cluster, profile, plan)
        TIMINGS["identity_refused_s"] = round(time.monotonic() - t0, 1)
        assert "would not run one build" in exc.value.what
        assert "vLLM package tree differs: head=sha256 " in exc.value.observed and ", worker=sha256 " in exc.value.observed
        rows = {c.name: c for c in exc.value.result.checks}
        table = rows[identity.CHECK_NAME].data["identity"]["ranks"]
        assert table["head"]["vLLM"] == table["worker"]["vLLM"]            # same version: only the content differs
        _assert_nothing_left(cluster, profile)
    finally:
        cluster.worker.run(f"umount {quote(target)}; rm -rf /run/identity-test", timeout=30, warn=True)
    after = identity.identity_check(identity.gather(cluster, profile, render_plan(cluster, profile)), profile)
    assert after.status.value == "PASS", after


# ----------------------------------------------------------------------------- docker runtime

def test_docker_runtime_start_api_key_status_and_stop(cluster, tiny_model, stop_after):
    """One docker-runtime start serves every assertion (a CPU vLLM boot costs over a minute on 2 cores): it starts
    and streams; the API key reaches the server (401 without it, 200 with it) but never a node's process table
    during the launch (every node's `ps -eo args` sampled every 0.2 s from before the first start command until
    the server answers) nor the ranks' logs, start records or generated entrypoints; status sees the containers;
    stop leaves nothing."""
    import httpx
    from runbook.secrets import Secrets
    planted = "sk-planted-" + "9f3c" * 6
    profile = _profile(RUNTIME="docker", API_HOST="0.0.0.0")      # reached directly: the key guards it
    checks = image.ensure_image(cluster, profile)
    assert not checks.failures(), checks.to_text()
    plan = render_plan(cluster, profile, secrets=Secrets(api_key=planted))
    assert plan.head.docker_argv[:3] == ["docker", "run", "-d"]
    sampler = ("rm -f /tmp/ps-samples; for i in $(seq 1 1500); do ps -eo args >> /tmp/ps-samples 2>/dev/null; "
               "[ -e /tmp/ps-stop ] && break; sleep 0.2; done")
    for node in cluster:
        node.run("rm -f /tmp/ps-stop; (setsid nohup sh -c " + quote(sampler) + " >/dev/null 2>&1 &)", timeout=30)
    try:
        result = server.start(cluster, profile, plan, api_key=planted)
    finally:
        for node in cluster:
            node.run("touch /tmp/ps-stop", timeout=30)
    _record("docker", result)
    assert result.ok, result.checks.to_text()
    assert result.startup["head"]["kv_tokens"] and result.readiness.first_token is not None
    url = endpoint.base_url(profile)
    assert url == "http://10.77.0.11:8000"
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {planted}"}, timeout=10).status_code == 200
    time.sleep(0.5)
    for node in cluster:
        samples = node.read("cat /tmp/ps-samples", timeout=60).stdout
        assert samples.count("\n") > 100, (node.name, "the sampler did not run through the launch")
        assert planted not in samples, f"{node.name}: the key in the process table"
        rank = plan.rank(node.name)
        logs = node.read(f"docker logs {quote(rank.container)} 2>&1; cat {quote(rank.state_dir)}/* 2>/dev/null",
                         timeout=60).stdout
        assert logs.strip() and planted not in logs, f"{node.name}: the key in a log or a state file"
    st = status.status(cluster, profile)
    assert st["nodes"]["head"]["runtime"] == "docker" and st["nodes"]["worker"]["container"] == "running"
    stopped = stop.stop(cluster, profile)
    assert stopped.ok, stopped.checks.to_text()
    _assert_nothing_left(cluster, profile)


def test_a_docker_run_failing_after_create_leaves_no_container_behind(cluster, tiny_model, stop_after):
    """`docker run` creates the container before it starts it: a start that fails then (here a device the node
    lacks, as `--device /dev/infiniband` on a machine without RDMA) leaves a container in state "created".
    The failed start removes it with the ranks already started, so the next start is not refused as a
    stale rank."""
    profile = _profile(RUNTIME="docker")
    assert not image.ensure_image(cluster, profile).failures()
    plan = render_plan(cluster, profile)
    argv = plan.head.docker_argv                 # the head starts last: the worker is already up by then
    plan.head.docker_argv = argv[:3] + ["--device", "/dev/no-such-device"] + argv[3:]
    result = server.start(cluster, profile, plan, raise_on_failure=False)
    assert not result.ok
    failed = result.checks.failures()
    assert failed and failed[0].name == "server started" and "no-such-device" in failed[0].observed, \
        result.checks.to_text()
    _assert_nothing_left(cluster, profile)


def test_image_is_shipped_head_to_worker_when_the_worker_lacks_it(cluster):
    tag = "spark-runbook/lab-runtime:ship-test"
    profile = _profile(RUNTIME="docker", IMAGE=tag)
    cluster.head.run(f"docker tag spark-runbook/lab-runtime:1 {tag}")
    cluster.worker.run(f"docker rmi {tag} >/dev/null 2>&1; true")
    try:
        before = system.plan_image(profile, image.image_infos(cluster, tag))
        assert before.action == "ship" and before.targets == ["worker"]
        checks = image.ensure_image(cluster, profile)
        assert not checks.failures(), checks.to_text()
        assert system.plan_image(profile, image.image_infos(cluster, tag)).action == "none"
    finally:
        for node in cluster:
            node.run(f"docker rmi {tag} >/dev/null 2>&1; true")
