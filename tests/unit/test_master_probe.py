"""The master-port probe of the launch's readiness wait, with real sockets on loopback and real bash/ss:
a head that listens but that a worker cannot reach is named within a few polls (a firewall drop would
otherwise wait ~30 min for vLLM's "clients joined" timeout)."""
from __future__ import annotations

import socket
from dataclasses import dataclass

from runbook.launch.readiness import MASTER_BLOCKED_POLLS, MasterProbe, master_port_of
from support.doubles import FakeCluster, local_pair


@dataclass
class Rank:
    node: str
    serve_argv: list


class Plan:
    """The two things the probe reads of a LaunchPlan (anything else is an AttributeError)."""
    def __init__(self, addr: str, port: int):
        self.ranks = [Rank("head", ["vllm", "serve", "--master-addr", addr, "--master-port", str(port)]),
                      Rank("worker", ["vllm", "serve", "--headless"])]

    @property
    def workers(self):
        return self.ranks[1:]

    def rank(self, node: str) -> Rank:
        return next(r for r in self.ranks if r.node == node)


def _listener() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def test_reachable_master_port_ends_the_probe(tmp_path):
    head, worker = local_pair(tmp_path)
    with _listener() as s:
        plan = Plan("127.0.0.1", s.getsockname()[1])
        assert master_port_of(plan) == ("127.0.0.1", s.getsockname()[1])
        probe = MasterProbe()
        probe.poll(FakeCluster([head, worker]), plan)
    assert not probe.pending and probe.blocked == [] and probe.blocked_polls == 0


def test_a_listening_head_the_worker_cannot_reach_is_named(tmp_path):
    head, worker = local_pair(tmp_path)
    with _listener() as s:
        port = s.getsockname()[1]
        plan = Plan("127.0.0.2", port)          # listens on 127.0.0.1 only: the worker's connect is refused
        probe = MasterProbe()
        cluster = FakeCluster([head, worker])
        for _ in range(MASTER_BLOCKED_POLLS):
            probe.poll(cluster, plan)
    assert probe.pending and probe.blocked == ["worker"] and probe.blocked_polls == MASTER_BLOCKED_POLLS
    assert f"127.0.0.2:{port}" in probe.observed and "while the head listens" in probe.observed


def test_nothing_is_probed_before_the_head_listens(tmp_path):
    head, worker = local_pair(tmp_path)
    with _listener() as s:
        port = s.getsockname()[1]
    probe = MasterProbe()                         # the port is closed again: not listening
    probe.poll(FakeCluster([head, worker]), Plan("127.0.0.1", port))
    assert probe.pending and probe.blocked_polls == 0
