"""LAB ONLY: the substitution that lets the lab's CPU vLLM serve through Ray (runbook/lab/ray_cpu_site/
sitecustomize.py): its import hook over a stand-in ``vllm.platforms.cpu`` in a real interpreter (no vLLM needed), the
row step 04 writes from the head's log, and the rehearsal's listing. The render and validate's rule:
test_launch_ray.py; the real serve through Ray: docs/four-nodes.md."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from runbook.checks import Status
from runbook.lab import rehearsal
from runbook.launch import ray_cluster
from runbook.launch.render import NodeFacts, render
from runbook.profile import REPO_ROOT, load_profile
from runbook.profile.rules import LAB_RAY_CPU_MARKER, LAB_RAY_CPU_SITE

SITE = REPO_ROOT / LAB_RAY_CPU_SITE
ENV = REPO_ROOT / "env"


def _fake_vllm(tmp_path, key: str = ""):
    pkg = tmp_path / "fake" / "vllm" / "platforms"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cpu.py").write_text(textwrap.dedent(f"""
        class Platform:
            ray_device_key = ""
        class CpuPlatform(Platform):
            device_name = "cpu"
            ray_device_key = {key!r}
    """))
    comm = pkg.parent / "distributed" / "device_communicators"
    comm.mkdir(parents=True, exist_ok=True)
    for d in (comm.parent, comm):
        (d / "__init__.py").write_text("")
    (comm / "cpu_communicator.py").write_text(textwrap.dedent("""
        class _CPUSHMDistributed:
            @staticmethod
            def make_group_name(communicator):
                return f"{communicator}-tp-[0-1]-cpushm"
    """))
    return tmp_path / "fake"


def _run(tmp_path, code: str, key: str = "", **env):
    fake = _fake_vllm(tmp_path, key)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{fake}:{SITE}", **env})


KEY = "import vllm.platforms.cpu as c; print(repr(c.CpuPlatform.ray_device_key), repr(c.Platform.ray_device_key))"


def test_the_hook_gives_the_cpu_platform_the_ray_device_key_gpu_and_says_so_once(tmp_path):
    r = _run(tmp_path, KEY + "; import vllm.platforms.cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "'GPU' ''"            # the CPU platform only, not its base class
    assert r.stderr.count(LAB_RAY_CPU_MARKER) == 1 and "LAB-ONLY SUBSTITUTION" in r.stderr
    assert "runbook/lab/ray_cpu_site" in r.stderr


def test_the_hook_leaves_a_platform_that_has_a_key_and_a_process_that_never_imports_vllm_alone(tmp_path):
    r = _run(tmp_path, KEY, key="CPU")
    assert r.returncode == 0 and r.stdout.strip() == "'CPU' ''" and LAB_RAY_CPU_MARKER not in r.stderr
    r = _run(tmp_path, "import sys; print(sorted(m for m in sys.modules if m.startswith('vllm')))")
    assert r.returncode == 0 and r.stdout.strip() == "[]" and not r.stderr


def test_the_shm_group_name_carries_the_nodes_dev_shm_so_ranks_on_two_nodes_never_share_one_segment(tmp_path):
    code = ("import os; from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed as D; "
            "print(D.make_group_name('7'), D().make_group_name('7'), os.stat('/dev/shm').st_dev)")
    r = _run(tmp_path, code)
    assert r.returncode == 0, r.stderr
    name, again, dev = r.stdout.split()
    assert name == again == f"7-tp-[0-1]-cpushm-shm{dev}"       # class and instance lookups agree
    assert "CPU SHM group name per /dev/shm" in r.stderr


def test_the_switch_turns_the_hook_off_and_the_unpatched_platform_comes_back(tmp_path):
    r = _run(tmp_path, KEY, SPARK_RUNBOOK_LAB_RAY_CPU="0")
    assert r.returncode == 0 and r.stdout.strip() == "'' ''" and not r.stderr


def _other_site(tmp_path):
    """A stand-in for the lab recipe's overlay: its own sitecustomize, which ours would shadow."""
    d = tmp_path / "overlay"
    d.mkdir(exist_ok=True)
    (d / "sitecustomize.py").write_text("import sys; sys.stderr.write('overlay sitecustomize ran\\n')\n")
    return d


def test_first_on_the_path_it_arms_the_hook_and_still_runs_the_overlays_sitecustomize(tmp_path):
    fake, overlay = _fake_vllm(tmp_path), _other_site(tmp_path)
    r = subprocess.run([sys.executable, "-c", KEY], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{SITE}:{overlay}:{fake}"})
    assert r.returncode == 0 and r.stdout.strip() == "'GPU' ''", r.stderr
    assert "overlay sitecustomize ran" in r.stderr and LAB_RAY_CPU_MARKER in r.stderr


CLI = REPO_ROOT / "runbook" / "lab" / "vllm_cli.py"
DRIVER = ("import os, runpy; runpy.run_path({cli!r}, run_name='lab'); "
          "print(os.environ.get('RAY_RUNTIME_ENV_HOOK')); " + KEY)


def test_shadowed_by_the_overlay_vllm_cli_arms_it_in_the_serve_and_hands_ray_the_runtime_env_hook(tmp_path):
    """The lab recipe's start.sh puts its overlay first: its sitecustomize runs, ours does not; vllm_cli.py (the
    serve's __main__) arms the hook and sets RAY_RUNTIME_ENV_HOOK, whose job runtime_env puts the dir first on
    every Ray worker's PYTHONPATH."""
    fake, overlay = _fake_vllm(tmp_path), _other_site(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{overlay}:{fake}:{SITE}"}
    r = subprocess.run([sys.executable, "-c", DRIVER.format(cli=str(CLI))], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["spark_runbook_lab_ray_cpu.runtime_env_hook", "'GPU'", "''"]
    assert "overlay sitecustomize ran" in r.stderr and LAB_RAY_CPU_MARKER in r.stderr
    hook = subprocess.run([sys.executable, "-c", "import spark_runbook_lab_ray_cpu as m; "
                           "print(m.runtime_env_hook({'env_vars': {'A': '1'}, 'pip': ['x']}))"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert eval(hook.stdout) == {"env_vars": {"A": "1", "PYTHONPATH": f"{SITE}:{overlay}:{fake}"}, "pip": ["x"]}


def test_vllm_cli_does_nothing_without_the_dir_on_the_path(tmp_path):
    fake = _fake_vllm(tmp_path)
    r = subprocess.run([sys.executable, "-c", DRIVER.format(cli=str(CLI))], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake)})
    assert r.returncode == 0 and r.stdout.split() == ["None", "''", "''"] and not r.stderr


def test_the_marker_the_launch_looks_for_is_the_one_the_hook_writes():
    text = (SITE / "spark_runbook_lab_ray_cpu.py").read_text()
    marker = text.split('MARKER = "', 1)[1].split('"', 1)[0]
    assert marker.startswith(LAB_RAY_CPU_MARKER) and "LAB ONLY" in text.splitlines()[0]


# ----------------------------------------------------------------------------- step 04's row

def _plan(name="lab", **ov):
    p = load_profile(ENV / f"{name}.env", {"EXECUTOR": "ray", **ov})
    return p, render(p, {n.name: NodeFacts(home="/root") for n in p.nodes})


LOG = (f"{LAB_RAY_CPU_MARKER} = 'GPU' (pid 11; runbook/lab/ray_cpu_site/sitecustomize.py)\n"
       "(EngineCore pid=12) INFO placement group\n"
       f"(pid=25261) {LAB_RAY_CPU_MARKER} = 'GPU' (pid 25261; …)\n"
       f"(pid=25302, ip=169.254.77.2) {LAB_RAY_CPU_MARKER} = 'GPU' (pid 25302; …)\n")


def test_step_04_row_names_the_substitution_on_every_node_that_ran_it():
    p, plan = _plan()
    row = ray_cluster.substitution_check(p, plan, LOG)
    assert row.name == ray_cluster.SUBSTITUTION_ROW and row.status == Status.PASS
    assert "ran on head, worker (3 process(es) patched)" in row.observed and "ray_device_key" in row.observed
    assert row.data["nodes"] == {"head": True, "worker": True}


def test_step_04_row_warns_naming_a_node_whose_actor_never_reported_it():
    p, plan = _plan()
    row = ray_cluster.substitution_check(p, plan, "\n".join(LOG.splitlines()[:3]), reused=True)
    assert row.status == Status.WARN and "not seen for worker" in row.observed and "rotated out" in row.observed
    assert "PYTHONPATH" in row.fix


def test_no_row_off_the_lab_or_under_mp():
    p, plan = _plan("dspark-v4")
    assert ray_cluster.substitution_check(p, plan, LOG) is None
    p = load_profile(ENV / "lab.env")
    assert ray_cluster.substitution_check(p, render(p, {n.name: NodeFacts(home="/r") for n in p.nodes}), LOG) is None


# ----------------------------------------------------------------------------- a rehearsal lists it

@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_a_ray_rehearsal_lists_the_substitution_as_hardware_with_its_reason_and_keeps_executor(executor):
    p = load_profile(ENV / "dspark-v4.env", {"EXECUTOR": executor})
    subs = [s for s in rehearsal.substitutions(p) if s.key == "EXECUTOR"]
    if executor == "mp":
        assert subs == []
        return
    s, = subs
    assert (s.kind, s.group, s.part, s.override) == ("hardware", "engine", rehearsal.RAY_DEVICE_PART, "ray")
    assert "LAB ONLY" in s.lab and LAB_RAY_CPU_SITE in s.lab and "current platform cpu does not support ray" in s.why
    assert rehearsal.rehearsal_overrides(rehearsal.substitutions(p))["EXECUTOR"] == "ray"
    assert s.to_dict()["kind"] == "hardware"
