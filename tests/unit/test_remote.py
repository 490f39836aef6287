"""The remote layer without a network: dry-run recording, masking, env, error mapping."""
import json
import socket

import pytest

from runbook.errors import RemoteError
from runbook.profile import NodeSpec
from runbook.remote import CommandLog, Node, SshSettings, map_connect_error, quote
from runbook.secrets import Redactor


def _node(tmp_path, dry_run=True, redactor=None, ssh="spark-worker"):
    spec = NodeSpec(name="worker", rank=1, ssh=ssh, fabric_ip="169.254.77.2",
                    fabric_if="enp1s0f0np0", ib_devs=[], gid="auto")
    log = CommandLog(tmp_path / "commands.jsonl", redactor or Redactor())
    return Node(spec, SshSettings(), log=log, dry_run=dry_run)


def test_dry_run_records_actions_without_connecting(tmp_path):
    # nothing listens on port 1: any connection attempt would raise RemoteError instead of returning
    node = _node(tmp_path, redactor=Redactor(["s3cr3t-value"]), ssh="root@127.0.0.1:1")
    res = node.run("docker rm -f spark-runbook-worker", env={"VLLM_API_KEY": "s3cr3t-value"})
    node.put("/etc/hostname", "/tmp/x")
    assert res.dry_run and res.ok
    with pytest.raises(RemoteError):                # the premise: the same node not in dry-run does connect
        _node(tmp_path, dry_run=False, ssh="root@127.0.0.1:1").run("true", timeout=10)
    entries = [json.loads(l) for l in (tmp_path / "commands.jsonl").read_text().splitlines()]
    assert [e["dry_run"] for e in entries] == [True, True]
    assert "docker rm -f spark-runbook-worker" in entries[0]["command"]
    # the value is read from stdin on the node, never written into the command line (ps would show it)
    assert "s3cr3t-value" not in entries[0]["command"] and "read -r VLLM_API_KEY" in entries[0]["command"]
    assert entries[1]["command"] == "put /etc/hostname -> /tmp/x"


def test_quote_builds_shell_safe_commands():
    assert quote("ls", "a b", "$(rm -rf /)") == "ls 'a b' '$(rm -rf /)'"


def test_connect_errors_are_mapped_with_a_fix():
    from paramiko.ssh_exception import AuthenticationException, SSHException
    err = map_connect_error(SSHException("Server '10.77.0.12' not found in known_hosts"), "worker",
                            "spark-worker", "/lab/known_hosts")
    assert "not in /lab/known_hosts" in str(err) and "ssh-keyscan" in err.fix
    assert "ssh-copy-id" in map_connect_error(AuthenticationException("no"), "head", "h", None).fix
    refused = map_connect_error(ConnectionRefusedError(111, "Connection refused"), "head", "h", None)
    assert isinstance(refused, RemoteError) and "cannot connect" in refused.what
    assert "cannot connect" in map_connect_error(socket.timeout("timed out"), "head", "h", None).what


def test_missing_ssh_config_is_named(tmp_path):
    spec = NodeSpec(name="head", rank=0, ssh="spark-head", fabric_ip="", fabric_if="", ib_devs=[], gid="auto")
    node = Node(spec, SshSettings(ssh_config=tmp_path / "nope"), dry_run=False)
    with pytest.raises(RemoteError) as err:
        node.read("true")
    assert "nope" in str(err.value) and "make lab-up" in err.value.fix


def test_ssh_host_config_reads_aliases_wildcards_and_match(tmp_path):
    """The ssh config is read by paramiko's SSHConfig (what fabric connects with), not by a hand parser:
    a Host block with two aliases, a wildcard block, a Match block, and a host no block names."""
    from runbook.remote import ssh_host_config
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host spark1 s1\n  HostName 192.168.1.5\n  Port 2222\n  User alice\n  IdentityFile /keys/a\n"
                   "Host *.lan\n  HostName wild.example\n"
                   "Match host m1\n  HostName matched.example\n")
    for target in ("spark1", "alice@s1", "s1:22"):
        got = ssh_host_config(target, cfg)
        assert (got["hostname"], got["port"], got["user"], got["identityfile"]) == \
            ("192.168.1.5", "2222", "alice", ["/keys/a"]), target
    assert ssh_host_config("root@box.lan", cfg)["hostname"] == "wild.example"
    assert ssh_host_config("m1", cfg)["hostname"] == "matched.example"
    assert ssh_host_config("plain", cfg) == {"hostname": "plain"}
    assert ssh_host_config("root@10.1.2.3:2222", None) == {"hostname": "10.1.2.3"}


def test_a_cluster_is_a_dry_run_when_every_node_is():
    from support.doubles import FakeCluster, FakeNode
    assert FakeCluster([FakeNode("head", 0, dry_run=True), FakeNode("worker", 1, dry_run=True)]).dry_run
    assert not FakeCluster([FakeNode("head", 0, dry_run=True), FakeNode("worker", 1)]).dry_run
    assert not FakeCluster([]).dry_run
