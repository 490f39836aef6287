"""The stop signals only what is ours: the pid file's process group while a vLLM process is in it, never the group a
stale pid file's number names after a reboot or a lab rebuild (an sshd session's, dockerd's)."""
from __future__ import annotations

import re

from support.doubles import FakeNode, rank_node

from runbook.facts import ranks
from runbook.launch import stop
from runbook.profile import REPO_ROOT, load_profile

# a lab node rebuilt after its nodes died: PID 1 sshd, an sshd session and dockerd, each its own group
NODE_PS = """    1     0 Ss   sshd: /usr/sbin/sshd -D -f /lab/nodes/head/sshd_config
   68    68 Ssl  dockerd --cgroup-parent /nl-head --insecure-registry 10.77.0.1:5077
   84    84 Ssl  containerd --config /var/run/docker/containerd/containerd.toml
  362   362 Ss   sshd: root@notty
  370   362 S    sleep 600
"""
RANK_PS = """ 3441  3441 Sl   /lab/vllm-venv/bin/python /repo/runbook/lab/vllm_cli.py serve /mnt/nvme/models/tiny --port 8000
 3480  3441 S    /lab/vllm-venv/bin/python -c from multiprocessing.resource_tracker import main;main(9)
 3513  3441 Sl   VLLM::EngineCore
"""


def test_a_group_without_a_vllm_process_is_not_counted_as_the_ranks():
    node = ranks.parse_ps(NODE_PS)
    assert ranks.vllm_procs(node) == []
    for stale in (68, 362):                       # dockerd's group, an sshd session's group
        assert ranks.vllm_procs(node, pgid=stale) == [], stale
    both = ranks.parse_ps(NODE_PS + RANK_PS)
    assert [p[0] for p in ranks.vllm_procs(both, pgid=3441)] == [3441, 3480, 3513]   # the tracker: in our group
    assert [p[0] for p in ranks.vllm_procs(both, pgid=68)] == [3441, 3513]           # by name only


def test_rank_state_keeps_the_running_ranks_whole_command_line_from_its_ps():
    """The set-aside of the lab's own server reads the rank's --nnodes from it (runner.lab_node_count): the whole
    line, not the 160 characters ``processes`` keeps."""
    serve = (" --served-model-name x" * 10) + " --tensor-parallel-size 2 --nnodes 2 --node-rank 0"
    ps = NODE_PS + RANK_PS.replace("--port 8000", "--port 8000" + serve)
    st = ranks.rank_state(rank_node("head", 0, pid=3441, fingerprint="f" * 64, ps=ps), _profile(), "/root")
    assert st.running and st.argv.endswith(serve) and len(st.argv) > 160, st.argv
    assert ranks.rank_state(rank_node("head", 0, pid=68, fingerprint="f" * 64, ps=NODE_PS), _profile(),
                            "/root").argv == ""                                   # nothing running: no line


def test_rank_state_does_not_take_a_stale_pid_for_a_running_rank():
    st = ranks.rank_state(rank_node("head", 0, pid=68, fingerprint="f" * 64, ps=NODE_PS), _profile(), "/root")
    assert not st.running and st.processes == [] and st.pid == 68


class Node(FakeNode):
    """A node whose process table shrinks as ``kill`` commands remove processes (group ``-- -N`` or pids)."""

    def __init__(self, name: str, pid: int, ps: str):
        self.procs = ranks.parse_ps(ps)
        self.killed: list[str] = []
        answer = lambda command: f"{pid}\n@@\n{'f' * 64}\n@@\n\n@@\n\n@@\n{self._ps()}"    # noqa: E731
        super().__init__(name, 0, rules=[
            (r'^printf %s "\$HOME"$', "/root"),
            (rf"^cat \S+/{name}\.pid 2>/dev/null; ", answer),
            (re.compile("^" + re.escape(ranks.PS_CMD) + "$"), lambda command: self._ps()),
            (r"^kill ", self._kill),
            (r"^rm -f ", ""),
            (r"^cat /proc/meminfo|MemAvailable", "MemAvailable: 1000 kB\n")])

    def _ps(self) -> str:
        return "".join(f"{p[0]} {p[1]} {p[2]} {p[3]}\n" for p in self.procs)

    def _kill(self, command: str) -> str:
        self.killed.append(command)
        groups = {int(g) for g in re.findall(r"-- -(\d+)", command)}
        pids = {int(x) for x in re.findall(r"(?<![-\d])(\d+)(?![\d])", re.sub(r"-- -\d+", "", command))}
        before = len(self.procs)
        self.procs = [p for p in self.procs if p[1] not in groups and p[0] not in pids]
        return "sent\n" if "echo sent" in command and len(self.procs) < before else ""


def _profile():
    return load_profile(REPO_ROOT / "env" / "lab.env")


def test_a_stale_pid_file_does_not_make_the_stop_signal_another_group():
    """The lab's nodes died and were rebuilt: the rank's pid file (its home is on disk) names 68, dockerd's group
    in the new node. The stop finds no rank, signals nothing and leaves dockerd and the sshd session alone."""
    for stale in (68, 362):
        node = Node("head", stale, NODE_PS)
        checks, info = stop._stop_node(node, _profile(), grace=0.1)
        assert node.killed == [], node.killed
        assert [p[0] for p in node.procs] == [1, 68, 84, 362, 370]
        assert checks[0].status.value == "PASS", checks[0].observed


def test_the_stop_signals_the_ranks_group_once_at_the_start():
    node = Node("head", 3441, NODE_PS + RANK_PS)
    checks, _ = stop._stop_node(node, _profile(), grace=0.1)
    assert node.killed and node.killed[0] == "kill -TERM -- -3441 2>/dev/null && echo sent; true"
    assert [p[0] for p in node.procs] == [1, 68, 84, 362, 370]          # the rank's group gone, nothing else
    assert checks[0].status.value == "PASS", checks[0].observed


def test_a_stop_keeps_counting_its_group_once_the_named_processes_are_gone():
    """make test: a worker rank killed mid-boot left a child spawned but not yet named VLLM::Worker; once the named
    processes died the group no longer looked like a rank's, the stop ended, and the child took the name later."""
    spawned = ranks.parse_ps(NODE_PS + " 3600  3441 Sl   /lab/vllm-venv/bin/python -c from multiprocessing.spawn "
                             "import spawn_main; spawn_main(tracker_fd=9, pipe_handle=11) --multiprocessing-fork\n")
    assert [p[0] for p in ranks.vllm_procs(spawned, pgid=3441, group_is_ours=True)] == [3600]   # a stop's look
    assert ranks.vllm_procs(ranks.parse_ps(NODE_PS), pgid=3441, group_is_ours=True) == []      # empty: done


def test_a_main_pid_killed_before_the_stop_leaves_a_group_the_stop_still_ends():
    """CI, make test (test_dead_worker_ends_the_wait...): the worker's main pid got kill -9 while its spawned child
    was still importing, unnamed. The stop's first look saw no vLLM-named process in the group, signalled nothing,
    and the child took the name VLLM::Worker after the stop had passed. A multiprocessing child in the pid file's
    group makes it the rank's; a foreign group (dockerd's, an sshd session's) still does not."""
    child = (" 3600  3441 Sl   /lab/vllm-venv/bin/python -c from multiprocessing.spawn import spawn_main; "
             "spawn_main(tracker_fd=9, pipe_handle=11) --multiprocessing-fork\n")
    tracker = " 3480  3441 S    /lab/vllm-venv/bin/python -c from multiprocessing.resource_tracker import main;main(9)\n"
    assert [p[0] for p in ranks.vllm_procs(ranks.parse_ps(NODE_PS + child), pgid=3441)] == [3600]
    assert [p[0] for p in ranks.vllm_procs(ranks.parse_ps(NODE_PS + tracker), pgid=3441)] == [3480]
    st = ranks.rank_state(rank_node("worker", 0, pid=3441, fingerprint="f" * 64, ps=NODE_PS + child), _profile(),
                          "/root")
    assert not st.running and [p.split()[0] for p in st.processes] == ["3600"]     # orphaned, listed
    node = Node("worker", 3441, NODE_PS + child)
    checks, _ = stop._stop_node(node, _profile(), grace=0.1)
    assert node.killed and node.killed[0] == "kill -TERM -- -3441 2>/dev/null && echo sent; true", node.killed
    assert [p[0] for p in node.procs] == [1, 68, 84, 362, 370]
    assert checks[0].status.value == "PASS", checks[0].observed
    for stale in (68, 362):                           # foreign groups: still nobody's rank
        assert ranks.vllm_procs(ranks.parse_ps(NODE_PS + child), pgid=stale) == [], stale
