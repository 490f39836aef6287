"""The cluster's nodes in rank order (head, worker[, worker2]), each a :class:`NodeSpec` derived from the
profile's per-node keys: what the remote layer connects to and which addresses a rank binds.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeSpec:
    """One node of the cluster, in rank order."""
    name: str                       # "head", "worker", "worker2"
    rank: int
    ssh: str
    fabric_ip: str
    fabric_if: str
    ib_devs: list[str] = field(default_factory=list)
    gid: str | int = "auto"
    bootstrap_ip: str = ""          # address on BOOTSTRAP_IF ("" = none: the fabric carries the bootstrap)
    bootstrap_if: str = ""          # BOOTSTRAP_IF ("" = fabric_if)

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def host_ip(self) -> str:
        """VLLM_HOST_IP of this rank: its BOOTSTRAP_IF address when set, else its fabric address."""
        return self.bootstrap_ip or self.fabric_ip

    @property
    def socket_if(self) -> str:
        """NCCL/GLOO/TP_SOCKET_IFNAME of this rank: BOOTSTRAP_IF when set, else its fabric netdev."""
        return self.bootstrap_if or self.fabric_if


def node_specs(p) -> list[NodeSpec]:
    """The nodes of the profile ``p`` ordered by rank: head, worker[, worker2]."""
    bif = p.bootstrap_if
    out = [
        NodeSpec("head", 0, p.head_ssh, p.head_ip, p.head_cx7_if, list(p.head_cx7_ib), p.head_gid,
                 p.head_bootstrap_ip if bif else "", bif),
        NodeSpec("worker", 1, p.worker_ssh, p.worker_ip, p.worker_cx7_if, list(p.worker_cx7_ib),
                 p.worker_gid, p.worker_bootstrap_ip if bif else "", bif),
    ]
    if p.worker2_ssh:
        out.append(NodeSpec("worker2", 2, p.worker2_ssh, p.worker2_ip, p.worker2_cx7_if,
                            list(p.worker2_cx7_ib), p.worker2_gid,
                            p.worker2_bootstrap_ip if bif else "", bif))
    return out


def rank_gid_index(profile, pinned, resolved: int | None) -> int | None:
    """The NCCL_IB_GID_INDEX a rank gets (None: unset): a pinned ``<NODE>_GID`` as is; ``auto`` is the index
    step 01 resolved from sysfs, except under seed B, whose ``NCCL_IB_GID_AUTO=1`` leaves the variable unset so
    NCCL picks the RoCE v2 GID per HCA. Step 01's nccl-tests use this same rule (what 01 proves is what the
    ranks run)."""
    if isinstance(pinned, int):
        return pinned
    return None if profile.recipe == "dspark-v4" else resolved


def ssh_user(p, spec: NodeSpec) -> str:
    """The user a node is logged in as, as far as the profile says: ``user@`` of its ``*_SSH``; root on the lab
    (its alias logs in as root, remote.ssh_argv); "" when an alias leaves it to the ssh config."""
    if "@" in spec.ssh:
        return spec.ssh.split("@", 1)[0]
    return "root" if p.is_lab else ""


def node_home(p, spec: NodeSpec) -> str:
    """The node's home as validation knows it: /root for root, /home/<user> for another user, "" when the user
    is unknown (an ssh alias). The steps expand ``~`` with the home the node itself reports (remote.expand_home)."""
    user = ssh_user(p, spec)
    return "/root" if user == "root" else f"/home/{user}" if user else ""


def resolve_on(path: str, home: str) -> str:
    """A normalised node path as it lands on a node with that home, for comparing two paths: ``~/x`` ->
    ``<home>/x``. With the home unknown, ``/home/<user>/x`` is taken as ``~/x`` (the home of the SSH user is
    where a profile means when it spells it out), so ``~/x`` and ``/home/spark/x`` still compare equal."""
    if not path:
        return ""
    if path == "~" or path.startswith("~/"):
        return home + path[1:] if home else path
    if not home:
        parts = path.split("/")
        if len(parts) >= 3 and parts[1] == "home" and parts[2]:
            return "~" + path[len("/home/" + parts[2]):]
    return path
