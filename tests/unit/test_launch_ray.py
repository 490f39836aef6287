"""EXECUTOR=ray: the key, validate's refusal on the lab's CPU vLLM, the launch render (goldens), the per-node
stop/status/logs commands, and the parser of `ray status` over captured real output (tests/unit/data/ray/: Ray 2.60.0
on netns nodes; the 4-node one from docs/four-nodes.md's run). The cluster itself, for real: tests/lab/
test_ray_cluster_lab.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runbook import cli
from runbook.errors import ProfileError
from runbook.facts import ray as ray_facts
from runbook.launch.render import NodeFacts, check_consistency, flag_value, render
from runbook.profile import KEYS, REPO_ROOT, load_profile, refuse_unservable
from runbook.profile import rules
from runbook.profile.rules import RAY_CPU_ERROR
from support.golden import check_golden

ENV = REPO_ROOT / "env"
DATA = Path(__file__).parent / "data" / "ray"
GOLDEN = Path(__file__).parent / "golden" / "launch"
HOME = "/home/spark"


#: four Sparks on a switch (one /24), recipe B's profile grown by two nodes
FOUR = {"WORKER2_SSH": "spark-3", "WORKER2_IP": "10.0.0.3", "WORKER2_CX7_IF": "enp1s0f0np0",
        "WORKER2_CX7_IB": "rocep1s0f0", "WORKER3_SSH": "spark-4", "WORKER3_IP": "10.0.0.4",
        "WORKER3_CX7_IF": "enp1s0f0np0", "WORKER3_CX7_IB": "rocep1s0f0", "NNODES": "4", "TP": "4",
        "WEIGHT_SYNC": "rsync"}


def _plan(name: str, overrides=None):
    p = load_profile(ENV / f"{name}.env", {"EXECUTOR": "ray", **(overrides or {})})
    return render(p, {n.name: NodeFacts(home=HOME) for n in p.nodes})


# ----------------------------------------------------------------------------- the key

def test_executor_key_sits_after_master_port_in_every_env_file_and_is_mp_except_in_the_ray_lab_profiles():
    assert KEYS[KEYS.index("MASTER_PORT") + 1] == "EXECUTOR"
    files = sorted(ENV.glob("*.env"))
    assert files
    for f in files:
        keys = [ln.split("=", 1)[0] for ln in f.read_text().splitlines() if re.match(r"^[A-Z0-9_]+=", ln)]
        assert keys[keys.index("MASTER_PORT") + 1] == "EXECUTOR", f
        assert load_profile(f).executor == ("ray" if f.stem.endswith("-ray") else "mp"), f


def test_executor_refuses_other_values_naming_the_choices():
    with pytest.raises(ProfileError) as exc:
        load_profile(ENV / "lab.env", {"EXECUTOR": "rays"})
    assert "EXECUTOR" in str(exc.value) and "mp|ray" in str(exc.value)


# ----------------------------------------------------------------------------- validate: the lab serves through Ray
# only with the lab-only substitution (runbook/lab/ray_cpu_site) and the lab's Ray (make lab-ray)

@pytest.fixture
def lab_ray(tmp_path, monkeypatch):
    """The lab's Ray site and the substitution dir at tmp paths (present; a test removes one)."""
    site, sub = tmp_path / "ray-site", tmp_path / "ray_cpu_site"
    (site / "bin").mkdir(parents=True)
    (site / "bin" / "ray").write_text("")
    sub.mkdir()
    (sub / "sitecustomize.py").write_text("")
    monkeypatch.setattr(rules, "LAB_RAY_SITE", str(site))
    monkeypatch.setattr(rules, "LAB_RAY_CPU_SITE", str(sub))
    return site, sub


def _lab_ray_file(tmp_path):
    text = (ENV / "lab.env").read_text().replace("EXECUTOR=mp", "EXECUTOR=ray")
    f = tmp_path / "lab-ray.env"
    f.write_text(text)
    return f, 1 + text.splitlines().index("EXECUTOR=ray")


def test_ray_on_the_lab_serves_with_the_substitution_and_the_labs_ray(lab_ray, tmp_path):
    f, _ = _lab_ray_file(tmp_path)
    p = load_profile(f)
    assert rules.lab_ray_missing(p) == []
    refuse_unservable(p)
    refuse_unservable(load_profile(ENV / "lab-ray.env"))


@pytest.mark.parametrize("gone", ["ray site", "substitution"])
def test_ray_on_the_lab_is_refused_without_the_substitution_or_the_labs_ray_naming_what_and_the_fix(lab_ray, tmp_path,
                                                                                                     gone):
    site, sub = lab_ray
    (site / "bin" / "ray").unlink() if gone == "ray site" else (sub / "sitecustomize.py").unlink()
    f, line = _lab_ray_file(tmp_path)
    p = load_profile(f)                    # loads: render and the Ray cluster alone take it
    with pytest.raises(ProfileError) as exc:
        refuse_unservable(p)
    issue, = exc.value.issues
    assert (issue.key, issue.path, issue.line) == ("EXECUTOR", str(f), line)
    assert RAY_CPU_ERROR == "ValueError: current platform cpu does not support ray."
    assert RAY_CPU_ERROR in issue.message and "ray_device_key" in issue.message and "ray_utils.py:574" in issue.message
    named = f"{site}/bin/ray" if gone == "ray site" else f"{sub}/sitecustomize.py"
    assert named in issue.message and "make lab-ray" in issue.fix and "EXECUTOR=mp" in issue.fix
    # mp on the lab needs neither
    refuse_unservable(load_profile(ENV / "lab.env"))


def test_validate_cli_refuses_lab_ray_without_the_labs_ray_unless_checked_up_to_the_ray_cluster(lab_ray, capsys):
    site, _ = lab_ray
    assert cli.main(["validate", "--profile", str(ENV / "lab-ray.env")]) == 0
    assert "valid" in capsys.readouterr().out
    (site / "bin" / "ray").unlink()
    assert cli.main(["validate", "--profile", str(ENV / "lab-ray.env")]) == ProfileError.exit_code
    assert RAY_CPU_ERROR in capsys.readouterr().err
    assert cli.main(["validate", "--profile", str(ENV / "lab.env"), "-p", "EXECUTOR=ray", "--ray-cluster"]) == 0
    assert "valid" in capsys.readouterr().out


def test_lab_ray_profile_is_lab_env_with_executor_ray_and_engram_off():
    ray, mp = load_profile(ENV / "lab-ray.env"), load_profile(ENV / "lab.env")
    assert (ray.executor, ray.lab, ray.node_count, ray.tp) == ("ray", True, 2, 2)
    differ = [k for k in KEYS if ray.value(k) != mp.value(k)]
    assert differ == ["PROFILE_NAME", "EXECUTOR", "ENGRAM"], differ


def test_lab_ray_render_puts_the_substitution_on_every_ray_process_path_and_nowhere_else():
    """The lab's `ray start` on every node (whose raylet starts the actors) and the head's serve get the Ray site and
    the substitution dir on PYTHONPATH; the lab's mp ranks and a real recipe's Ray get neither."""
    plan = _plan("lab")
    want = f"{REPO_ROOT / rules.LAB_RAY_SITE}:{REPO_ROOT / rules.LAB_RAY_CPU_SITE}"
    for r in plan.ranks:
        assert r.env["PYTHONPATH"] == want, r.node
        assert f"PYTHONPATH={want}" in r.ray_start_command()
    assert f"PYTHONPATH={want}" in plan.head.start_command()
    mp = render(load_profile(ENV / "lab.env"), {n: NodeFacts(home=HOME) for n in ("head", "worker")})
    assert all("PYTHONPATH" not in r.env for r in mp.ranks)
    real = _plan("dspark-v4")
    assert all("ray_cpu_site" not in json.dumps(r.env) + " ".join(r.docker_argv) for r in real.ranks)


@pytest.mark.parametrize("name", ["exl3-v41", "dspark-v4", "tp3-dspark"])
def test_ray_on_a_real_recipe_is_not_refused(name):
    refuse_unservable(load_profile(ENV / f"{name}.env", {"EXECUTOR": "ray"}))


# ----------------------------------------------------------------------------- render

@pytest.mark.parametrize("name,ov,nodes", [("lab", {}, 2), ("lab-tp3", {}, 3), ("lab-tp4", {}, 4), ("dspark-v4", {}, 2),
                                          ("tp3-dspark", {}, 3), ("dspark-v4", FOUR, 4)])
def test_ray_render_serves_on_the_head_alone_after_ray_on_every_node(name, ov, nodes):
    plan = _plan(name, ov)
    assert len(plan.ranks) == nodes
    head, workers = plan.head, plan.workers
    assert workers and all(r.executor == "ray" for r in plan.ranks)
    assert flag_value(head.serve_argv, "--distributed-executor-backend") == "ray"
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"):
        assert flag not in head.serve_argv, flag
    assert all(not r.serve_argv and not r.serves for r in workers)
    gcs = f"{plan.head.env['VLLM_HOST_IP']}:{ray_facts.RAY_PORT}"
    assert head.ray_argv[head.ray_argv.index("start"):][:3] == ["start", "--block", "--head"]
    assert head.serve_env == {"RAY_ADDRESS": gcs}
    for r in plan.ranks:
        assert flag_value(r.ray_argv, "--node-ip-address") == r.env["VLLM_HOST_IP"]
        assert flag_value(r.ray_argv, "--num-gpus") == "1"
        assert json.loads(flag_value(r.ray_argv, "--resources")) == {f"spark_runbook_{r.node}": 1}
        assert r.env["GLOO_SOCKET_IFNAME"] and r.env["RAY_memory_monitor_refresh_ms"] == "0"
    assert [flag_value(r.ray_argv, "--address") for r in workers] == [gcs] * len(workers)
    assert check_consistency(plan) == []


def test_ray_consistency_names_a_worker_pointed_at_another_gcs():
    plan = _plan("lab-tp3")
    w = plan.workers[1]
    w.ray_argv[w.ray_argv.index("--address") + 1] = "10.9.9.9:6379"
    assert check_consistency(plan) == [f"worker2 ray --address 10.9.9.9:6379 but head GCS "
                                       f"{plan.head.env['VLLM_HOST_IP']}:6379"]


def test_mp_fingerprint_is_untouched_and_ray_changes_it():
    mp = render(load_profile(ENV / "lab.env"), {"head": NodeFacts(home=HOME), "worker": NodeFacts(home=HOME)})
    assert mp.head.executor == "mp" and not mp.head.ray_argv and "--nnodes" in mp.head.serve_argv
    assert _plan("lab").fingerprint != mp.fingerprint


def _commands_text(plan) -> str:
    out = [plan.to_text(), "\n# ---- commands, per node (start: head first; stop: vLLM, then Ray)"]
    for r in plan.ranks:
        out += [f"\n## {r.node}: ray start", r.ray_start_command()]
        if r.serves:
            out += [f"## {r.node}: vllm serve", r.start_command()]
        out += [f"## {r.node}: ray stop", r.ray_stop_command(),
                f"## {r.node}: ray status", r.ray_status_command(),
                f"## {r.node}: ray logs", r.ray_logs_command(50)]
    text = "\n".join(out)
    if str(REPO_ROOT) in text:      # a lab plan runs the checkout's own venv: its fingerprint hashes this path
        text = text.replace(plan.fingerprint, "<fingerprint>").replace(plan.fingerprint[:16], "<fingerprint>")
    return text.replace(str(REPO_ROOT), "<repo>") + "\n"


GOLDEN_CASES = [("lab", {}, "default"), ("lab", {"RUNTIME": "docker"}, "docker"), ("lab-tp3", {}, "default"),
                ("lab-tp4", {}, "default"),
                ("dspark-v4", {}, "default"), ("tp3-dspark", {}, "default"), ("dspark-v4", FOUR, "4nodes")]


@pytest.mark.parametrize("name,ov,tag", GOLDEN_CASES, ids=[f"{n}-{t}" for n, _, t in GOLDEN_CASES])
def test_ray_golden(name, ov, tag):
    """2, 3 and 4 nodes, process and docker: the whole plan and every node's start/serve/stop/status/logs line."""
    check_golden(GOLDEN / f"{name}-{tag}-ray.txt", _commands_text(_plan(name, ov)))


def test_ray_commands_in_docker_run_inside_the_nodes_containers():
    plan = _plan("dspark-v4")
    head = plan.head
    assert head.docker_argv[:3] == ["docker", "run", "-d"]
    assert head.docker_argv[head.docker_argv.index("--entrypoint") + 1:][:2] == ["bash", plan.head.docker_argv[
        head.docker_argv.index("--entrypoint") + 2]]
    assert "ray start --block --head" in " ".join(head.docker_argv)
    assert f"{head.state_dir}:{head.state_dir}" in head.docker_argv        # the serve's pid and log land there
    assert head.start_command().split(" && ", 1)[1].startswith("docker exec -d -e RAY_ADDRESS=")
    assert head.ray_stop_command().startswith(f"docker exec {head.container} ray stop")
    assert head.ray_status_command().startswith(f"docker exec {head.container} sh -c ")
    proc = _plan("lab").rank("worker")
    assert proc.ray_stop_command().startswith(f"g=$(cat {proc.ray_pid_path}")
    assert "-- -$g" not in proc.ray_stop_command()      # dash's kill takes no `--`
    assert "ray stop" not in proc.ray_stop_command()    # never by name on a host


# ----------------------------------------------------------------------------- `ray status`, parsed

def test_status_of_two_nodes_with_their_gpus_names_both():
    st = ray_facts.parse_status((DATA / "status-2-nodes-gpus.txt").read_text())
    assert len(st.active) == 2 and st.active[0].startswith("node_a4070489")
    assert st.totals == {"CPU": 2.0, "GPU": 2.0, "spark_runbook_head": 1.0, "spark_runbook_worker": 1.0}
    assert st.joined(["head", "worker"]) == ["head", "worker"] and st.complete(["head", "worker"])
    assert not st.complete(["head", "worker", "worker2"])


def test_status_while_vllm_serves_counts_the_gpus_its_placement_group_holds():
    """Captured from the lab's EXECUTOR=ray server (env/lab-ray.env): Ray appends `(2.0 used of 2.0 reserved in
    placement groups)` to the GPU line, which the parser once skipped (`status` said 0 GPU while serving)."""
    text = (DATA / "status-2-nodes-serving.txt").read_text()
    assert "2.0/2.0 GPU (2.0 used of 2.0 reserved in placement groups)" in text
    st = ray_facts.parse_status(text)
    assert st.totals["GPU"] == 2.0 and st.gpus == 2.0 and st.complete(["head", "worker"])


def test_status_after_a_worker_died_names_it():
    st = ray_facts.parse_status((DATA / "status-worker-gone.txt").read_text())
    assert len(st.active) == 1 and st.missing(["head", "worker"]) == ["worker"]
    assert not st.complete(["head", "worker"])
    assert st.describe(["head", "worker"]) == "1 active node(s), 1 GPU; joined: head; never joined: worker"


def test_status_of_four_cpu_nodes_without_gpus_is_not_complete():
    st = ray_facts.parse_status((DATA / "status-4-nodes-no-gpus.txt").read_text())
    names = ["head", "worker", "worker2", "worker3"]
    assert len(st.active) == 4 and st.gpus == 0 and st.totals["CPU"] == 4.0
    assert not st.complete(names) and st.missing(names) == names     # no node resource: started by hand


def test_status_of_nothing_is_empty():
    st = ray_facts.parse_status("")
    assert st.active == [] and st.totals == {} and not st.complete(["head"])


# ----------------------------------------------------------------------------- the start's wait, over captured output

def test_start_names_the_worker_ray_status_never_shows_and_never_starts_vllm():
    """The head's GCS answers (the captured status of a cluster its worker left), the worker's `ray start`
    returns; the wait ends at its timeout naming the worker. Every command is the plan's own."""
    from runbook.launch import ray_cluster
    from support.doubles import FakeCluster, FakeNode, res
    plan = _plan("lab")
    gone = (DATA / "status-worker-gone.txt").read_text()
    head = FakeNode("head", 0, rules=[(r"ray start --block --head", res(0, "101\n")),
                                      (r"ray status --address 169\.254\.77\.1:6379", res(0, gone))])
    worker = FakeNode("worker", 1, rules=[(r"ray start --block --address 169\.254\.77\.1:6379", res(0, "202\n"))])
    up = ray_cluster.start_cluster(FakeCluster([head, worker]), plan, timeout=0.3, poll=0.05)
    assert [c.name for c in up.checks] == [ray_cluster.GCS_ROW, ray_cluster.JOIN_ROW]
    gcs, join = up.checks
    assert not gcs.failed and join.failed and join.data["missing"] == ["worker"]
    assert "never joined: worker" in join.observed and join.fix.startswith("on worker: ")
    assert not any("serve" in c.command for n in (head, worker) for c in n.calls)   # vLLM was never started
    assert head.calls[0].command == plan.head.ray_start_command()       # the head's GCS first


def test_start_waits_for_every_node_with_its_gpu():
    from runbook.launch import ray_cluster
    from support.doubles import FakeCluster, FakeNode, res
    plan = _plan("lab")
    both = (DATA / "status-2-nodes-gpus.txt").read_text()
    head = FakeNode("head", 0, rules=[(r"ray start --block --head", res(0, "101\n")),
                                      (r"ray status --address", res(0, both))])
    worker = FakeNode("worker", 1, rules=[(r"ray start --block --address", res(0, "202\n"))])
    up = ray_cluster.start_cluster(FakeCluster([head, worker]), plan, timeout=5, poll=0.05)
    assert up.ok and up.status.joined(["head", "worker"]) == ["head", "worker"]


def test_render_shows_a_lab_ray_profile_every_node_ray_first_then_the_heads_serve(capsys):
    """The offline review takes EXECUTOR=ray on the lab (validate/start refuse it): the commands recorded for
    step 04 are each node's `ray start`, head first, then the head's serve, and no worker serve."""
    assert cli.main(["render", "--profile", str(ENV / "lab.env"), "-p", "EXECUTOR=ray", "--step", "4"]) == 0
    runs = [ln for ln in capsys.readouterr().out.splitlines() if re.match(r"^\[\w+\] \[run\] ", ln)]
    starts = [(ln.split()[0], "ray start" in ln, "vllm_cli.py serve" in ln) for ln in runs
              if "ray start --block" in ln or "vllm_cli.py serve" in ln]
    assert starts == [("[head]", True, False), ("[worker]", True, False), ("[head]", False, True)]


def test_a_ray_worker_runs_when_its_ray_start_runs():
    """status, the health rows and a second start read a Ray worker's state from its ray start's pid (it runs no
    vLLM); the head is still its vLLM rank."""
    from runbook.facts import ranks
    from support.doubles import FakeNode
    profile = load_profile(ENV / "lab.env", {"EXECUTOR": "ray"})
    ps = "  4242  4242 Sl /x/python /x/ray-site/bin/ray start --block --address 169.254.77.1:6379\n"
    worker = FakeNode("worker", 1, rules=[(r"cat /root/\.cache/spark-runbook/launch/worker\.ray\.pid ",
                                           "4242\n@@\n@@\n@@\n@@\n" + ps)])
    st = ranks.rank_state(worker, profile, "/root")
    assert st.running and st.pid == 4242 and st.runtime == "process" and not st.processes
    gone = FakeNode("worker", 1, rules=[(r"worker\.ray\.pid", "4242\n@@\n@@\n@@\n@@\n")])
    assert not ranks.rank_state(gone, profile, "/root").running


def test_diagnose_collects_each_nodes_ray_logs_and_reads_them():
    """The bundle of an EXECUTOR=ray profile holds each node's Ray log (ray start's output and the session logs),
    and the catalogue reads it: a worker's GCS error there names ray-node-not-joined with the address."""
    from runbook.diagnose import bundle as B
    from runbook.diagnose.match import match
    profile = load_profile(ENV / "lab.env", {"EXECUTOR": "ray"})
    cmds = B.collect_commands(profile)
    ray_logs = {n: [c.cmd for c in cs if c.name == B.RAY_LOG] for n, cs in cmds.items()}
    assert set(ray_logs) == {"head", "worker"} and all(len(v) == 1 for v in ray_logs.values())
    assert "worker.ray.log" in ray_logs["worker"][0] and ray_facts.logs_dir("worker") in ray_logs["worker"][0]
    assert not any(c.name == B.RAY_LOG for cs in B.collect_commands(load_profile(ENV / "lab.env")).values()
                   for c in cs)
    line = ("[2026-12-05 12:19:20,489 W 2702 2702] rpc_client.h:153: Failed to connect to GCS at address "
            "10.80.0.11:6379 within 5 seconds.")      # a worker's ray start log, tests/lab/test_ray_cluster_lab.py
    found = [f for f in match(B.Bundle(texts={"worker": {B.RAY_LOG: line}})) if f.id == "ray-node-not-joined"]
    assert found and "10.80.0.11:6379" in found[0].fix
