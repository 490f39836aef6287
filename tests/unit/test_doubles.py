"""The shared test doubles (tests/support/doubles.py) keep the contracts the real remote layer has,
and refuse what they do not know, so a test built on them can fail."""
import re

import pytest

from runbook.errors import RemoteError
from support.doubles import FakeCluster, FakeNode, LocalNode, exact, res


def test_fake_node_refuses_unknown_commands_and_names_them():
    node = FakeNode("worker", 1, rules=[(exact("hostname"), "spark-worker\n")])
    assert node.read("hostname").stdout == "spark-worker\n"
    with pytest.raises(AssertionError, match=r"FakeNode\('worker'\) refused .*hostname -f"):
        node.read("hostname -f")                 # exact() is the whole command, not a prefix
    assert node.reads() == ["hostname", "hostname -f"]


def test_fake_node_answers_like_node_read_never_raises_run_does_unless_warn():
    node = FakeNode(rules=[(r"^false", res(1, "", "boom")), (r"^lost", RemoteError("connection lost", node="head")),
                           (r"^echo ", lambda cmd: res(0, cmd[5:] + "\n"))])
    assert node.read("false").exit_code == 1 and node.read("false").node == "head"
    with pytest.raises(RemoteError, match="exit code 1"):
        node.run("false")
    assert node.run("false", warn=True).stderr == "boom"
    with pytest.raises(RemoteError, match="connection lost"):
        node.read("lost")
    assert node.read("echo hi").stdout == "hi\n" and node.read("echo hi").command == "echo hi"
    with pytest.raises(AssertionError, match="timeout"):
        node.read("echo hi", timeout=0)


def test_read_only_and_dry_run():
    ro = FakeNode(rules=[(r"", "")], read_only=True)
    with pytest.raises(AssertionError, match="read-only"):
        ro.run("rm -rf /tmp/x")
    dry = FakeNode(dry_run=True)                 # no rules: a dry run executes nothing
    assert dry.run("rm -rf /tmp/x").dry_run and dry.runs() == ["rm -rf /tmp/x"]


def test_fake_cluster_is_the_real_cluster_with_a_failure_per_node():
    head = FakeNode("head", 0, rules=[(r"^uname", "Linux\n")])
    worker = FakeNode("worker", 1)               # knows nothing: its answer is the refusal
    cluster = FakeCluster([worker, head])        # ordered by rank like Cluster
    assert cluster.head is head and cluster.worker is worker and cluster["worker"] is worker
    assert cluster.workers == [worker] and list(cluster) == [head, worker]
    out = cluster.each(lambda n: n.read("uname").stdout)
    assert out["head"] == "Linux\n" and isinstance(out["worker"], AssertionError)
    assert "refused" in str(out["worker"])
    with pytest.raises(KeyError):
        cluster["worker2"]


def test_local_node_runs_for_real_in_its_home_with_node_paths_mapped(tmp_path):
    node = LocalNode("head", 0, home=tmp_path / "home", rewrite={"/mnt/nvme": str(tmp_path / "nvme")},
                     rules=[(exact("hostname"), "spark-head\n")])
    (tmp_path / "nvme").mkdir()
    assert node.read("hostname").stdout == "spark-head\n"          # canned rules first
    assert node.read('printf %s "$HOME"').stdout == str(tmp_path / "home")
    node.run("echo data > /mnt/nvme/f && pwd")
    assert (tmp_path / "nvme" / "f").read_text() == "data\n"
    assert node.read("ls /mnt/nvme/f").stdout == "/mnt/nvme/f\n"    # output speaks node paths
    assert node.read("printf %s \"$K\"", env={"K": "v"}).stdout == "v"
    with pytest.raises(RemoteError, match="exit code 3"):
        node.run("exit 3")
    src = tmp_path / "src.txt"
    src.write_text("x")
    node.put(src, "/mnt/nvme/copied")
    assert (tmp_path / "nvme" / "copied").read_text() == "x"
    assert node.runs()[-1] == f"put {src} -> /mnt/nvme/copied"
    with pytest.raises(RemoteError, match="timed out"):
        node.run("sleep 5", timeout=0.2)
    assert re.search("exit 3", " ".join(node.runs()))
