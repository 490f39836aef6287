"""A Ray cluster as the launch sees it (``EXECUTOR=ray``): where each node's Ray keeps its pid, log and session
files, the ``ray status`` command, and a pure parser of its output.

Each node's ``ray start`` declares one custom resource named after the node (``spark_runbook_head``,
``spark_runbook_worker`` …): ``ray status`` lists node IDs only, but its resource totals list every custom
resource, so the parser tells which of the profile's nodes joined and which never did.

Sample (``ray status`` of Ray 2.60.0, two lab nodes with ``--num-gpus 1``; tests/unit/data/ray/)::

    ======== Autoscaler status: 2026-12-05 12:14:24.547761 ========
    Node status
    ---------------------------------------------------------------
    Active:
     1 node_a4070489154571865cf811902eb7ade1b6950ab0472a038454a81a73
     1 node_7025bd2cba3e08aca90c48f94302860b5c1c834944f6f2202657bad9
    Pending:
     (no pending nodes)
    Recent failures:
     (no failures)

    Resources
    ---------------------------------------------------------------
    Total Usage:
     0.0/2.0 CPU
     0.0/2.0 GPU
     0B/42.97GiB memory
     0B/200.00MiB object_store_memory
     0.0/1.0 spark_runbook_head
     0.0/1.0 spark_runbook_worker
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

RAY_PORT = 6379                 # the head's GCS port: vLLM's run_cluster.sh and NVIDIA's playbook use 6379
NODE_RESOURCE = "spark_runbook_{node}"    # the custom resource each node declares (names the node in ray status)

_SECTION = re.compile(r"^(Active|Pending|Recent failures):\s*$")
_NODE_LINE = re.compile(r"^\s*(\d+)\s+(node_[0-9a-f]+|\S+)\s*$")
_USAGE = re.compile(r"^\s*([\d.]+[KMGT]?i?B?)/([\d.]+)([KMGT]?i?B)?\s+(\S+)(?:\s+\(.*\))?\s*$")


@dataclass
class RayStatus:
    """What ``ray status`` says: active and pending node lines, failures, resource totals."""
    active: list[str] = field(default_factory=list)       # node ids (one per line; "N node_x" counts N)
    pending: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)   # resource -> total (CPU, GPU, spark_runbook_head …)

    @property
    def gpus(self) -> float:
        return self.totals.get("GPU", 0.0)

    def joined(self, nodes: list[str]) -> list[str]:
        """The profile's nodes whose resource is in the cluster's totals, in the order given."""
        return [n for n in nodes if self.totals.get(NODE_RESOURCE.format(node=n), 0.0) > 0]

    def missing(self, nodes: list[str]) -> list[str]:
        got = set(self.joined(nodes))
        return [n for n in nodes if n not in got]

    def complete(self, nodes: list[str], gpus_per_node: int = 1) -> bool:
        """Every node active, each with its GPU(s): what must hold before ``vllm serve`` starts on the head."""
        return (len(self.active) == len(nodes) and not self.missing(nodes)
                and self.gpus >= len(nodes) * gpus_per_node)

    def describe(self, nodes: list[str]) -> str:
        joined = self.joined(nodes)
        text = (f"{len(self.active)} active node(s), {self.gpus:g} GPU; joined: {', '.join(joined) or 'none'}")
        if missing := self.missing(nodes):
            text += f"; never joined: {', '.join(missing)}"
        if self.failures:
            text += f"; recent failures: {'; '.join(self.failures[:3])}"
        return text


def parse_status(text: str) -> RayStatus:
    """Parse ``ray status`` output (any Ray 2.x: the "Node status" and "Resources" blocks). Pure."""
    st = RayStatus()
    section = ""
    in_usage = False
    for line in text.splitlines():
        m = _SECTION.match(line.strip())
        if m:
            section, in_usage = m.group(1), False
            continue
        if line.strip() in ("Total Usage:", "Usage:"):
            section, in_usage = "", line.strip() == "Total Usage:"
            continue
        if not line.startswith(" ") or not line.strip():
            if line.strip():
                section, in_usage = "", False
            continue
        body = line.strip()
        if body.startswith("("):            # "(no pending nodes)", "(no failures)"
            continue
        if section in ("Active", "Pending"):
            n = _NODE_LINE.match(line)
            if n:
                ids = [n.group(2)] * int(n.group(1))
                (st.active if section == "Active" else st.pending).extend(ids)
        elif section == "Recent failures":
            st.failures.append(body)
        elif in_usage:
            u = _USAGE.match(line)
            if u and not u.group(3):       # counted resources (CPU, GPU, custom); memory sizes carry a unit
                st.totals[u.group(4)] = float(u.group(2))
    return st


def temp_dir(node: str) -> str:
    """The node's Ray ``--temp-dir``: its own even where nodes share one /tmp (the lab's namespaces), and short
    (Ray's socket paths live under it and a Unix socket path is at most 107 bytes)."""
    return f"/tmp/spark-runbook-ray-{node}"


def logs_dir(node: str) -> str:
    """Where the node's Ray writes its session logs (raylet, gcs_server, the workers' stdout/stderr)."""
    return f"{temp_dir(node)}/session_latest/logs"


def pid_path(state_dir: str, node: str) -> str:
    """The pid of the node's ``ray start --block`` (process runtime; its process group holds every Ray daemon)."""
    return f"{state_dir}/{node}.ray.pid"


def log_path(state_dir: str, node: str) -> str:
    """What the node's ``ray start`` itself prints (process runtime; the container's log under docker)."""
    return f"{state_dir}/{node}.ray.log"


def status_command(ray_argv: list[str], address: str, env: dict[str, str] | None = None) -> str:
    """The read-only ``ray status`` against the head's GCS (``ray_argv``: the node's Ray CLI)."""
    prefix = ("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " ") if env else ""
    return prefix + " ".join(shlex.quote(a) for a in [*ray_argv, "status", "--address", address])


def logs_command(node: str, tail_lines: int = 100) -> str:
    """The tail of each of the node's Ray session logs (read-only)."""
    d = shlex.quote(logs_dir(node))
    return (f"for f in {d}/raylet.out {d}/raylet.err {d}/gcs_server.out {d}/gcs_server.err "
            f"{d}/worker-*.err; do [ -f \"$f\" ] || continue; echo \"==> $f <==\"; "
            f"tail -n {int(tail_lines)} \"$f\"; done 2>/dev/null; true")
