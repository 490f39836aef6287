"""What the lab is: its names, addresses and image, the :class:`LabNode` / :class:`LabInfo` a caller
gets, and the state file ``up`` records in the lab dir."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from runbook.errors import LabError

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_LAB_DIR = REPO_ROOT / ".lab"
NODEINIT = Path(__file__).parent.parent / "nodeinit.sh"   # runbook/lab/nodeinit.sh

NODE_NAMES = ("head", "worker", "worker2")
BRIDGE = "nlbr0"
BRIDGE_IP = "10.77.0.1"
MGMT_PREFIX = "10.77.0"
FABRIC_BRIDGE = "nlfab0"
FABRIC_IF = "enp1s0f0np0"
FABRIC_PREFIX = "169.254.77"
FABRIC_MTU = 9000
GUARD_ROUTES = ("10.77.0.0/16", "169.254.77.0/24")
IMAGE = "spark-runbook/lab-runtime:1"
# the lab's registry (Debian's docker-registry): on the management bridge's host address, plain HTTP, which the
# nodes' dockerd are told is an insecure registry; a rehearsal's IMAGE gets this host instead of the recipe's
REGISTRY_PORT = 5077
REGISTRY = f"{BRIDGE_IP}:{REGISTRY_PORT}"
REGISTRY_BINARY = "docker-registry"
STATE_FILE = "lab.json"
MARKER = Path("/run/spark-runbook-lab.json")   # which lab_dir owns the (machine-wide) nl-* names
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The lab's non-root operator on every node (a rehearsal logs in as it with `run --rehearse --ssh-user spark`):
# its own home, its SSH key authorised, the docker group, and exactly the sudoers drop-in the runbook prescribes.
OPERATOR = "spark"
OPERATOR_UID = 2626        # uid = gid; above the host's system and login ranges, files in the lab dir show it
# host paths each node binds its own copy over (files.py writes them, nodeinit.sh binds them): the users and
# groups (the operator exists only inside the nodes), its home, its sudo rules and the kernel NFS export files
NODE_PRIVATE = {"etc/passwd": "/etc/passwd", "etc/group": "/etc/group", "etc/sudoers.d": "/etc/sudoers.d",
                "etc/exports.d": "/etc/exports.d", "users": "/home", "nfs": "/var/lib/nfs"}

Log = Callable[[str], None]


@dataclass(frozen=True)
class LabNode:
    """One lab node: ``name`` is the runbook's node name, ``alias`` the ssh_config alias/hostname."""
    name: str          # head / worker / worker2
    alias: str         # spark-head / spark-worker / spark-worker2
    rank: int
    netns: str         # nl-head
    mgmt_ip: str       # 10.77.0.11
    fabric_if: str     # enp1s0f0np0
    fabric_ip: str     # 169.254.77.1
    mgmt_veth: str     # root-netns end of the management veth (nl-m-head)


@dataclass
class LabInfo:
    lab_dir: Path
    ssh_config: Path
    key: Path
    known_hosts: Path
    nodes: list[LabNode]
    timings: dict[str, float] = field(default_factory=dict)
    image: str = IMAGE
    image_ids: dict[str, str] = field(default_factory=dict)   # node name -> image ID
    reused: bool = False          # True: a healthy running lab was found and returned as is

    @property
    def image_id_identical(self) -> bool:
        ids = set(self.image_ids.values())
        return len(ids) == 1 and "" not in ids

    def node(self, name: str) -> LabNode:
        for n in self.nodes:
            if name in (n.name, n.alias, n.netns):
                return n
        raise KeyError(name)

    @property
    def head(self) -> LabNode:
        return self.nodes[0]

    def ssh_argv(self, target: str, command: str | None = None) -> list[str]:
        """argv for OpenSSH to a node alias (or a lab IP) using the lab's config."""
        argv = ["ssh", "-F", str(self.ssh_config), target]
        return argv + [command] if command is not None else argv

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("lab_dir", "ssh_config", "key", "known_hosts"):
            d[k] = str(d[k])
        d["image_id_identical"] = self.image_id_identical
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LabInfo":
        return cls(lab_dir=Path(d["lab_dir"]), ssh_config=Path(d["ssh_config"]), key=Path(d["key"]),
                   known_hosts=Path(d["known_hosts"]), nodes=[LabNode(**n) for n in d["nodes"]],
                   timings=dict(d.get("timings", {})), image=d.get("image", IMAGE),
                   image_ids=dict(d.get("image_ids", {})), reused=bool(d.get("reused", False)))


def node_specs(nodes: int = 2) -> list[LabNode]:
    if nodes not in (2, 3):
        raise LabError("the lab supports 2 or 3 nodes", observed=f"nodes={nodes}", expected="2 or 3",
                       fix="set LAB_NODES=2 (TP=2) or 3")
    return [LabNode(name=name, alias=f"spark-{name}", rank=i, netns=f"nl-{name}",
                    mgmt_ip=f"{MGMT_PREFIX}.{11 + i}", fabric_if=FABRIC_IF,
                    fabric_ip=f"{FABRIC_PREFIX}.{1 + i}", mgmt_veth=f"nl-m-{name}")
            for i, name in enumerate(NODE_NAMES[:nodes])]


def read_state(lab_dir: Path) -> dict | None:
    """What the last ``up`` recorded in ``<lab_dir>/lab.json`` (node count, PIDs, LabInfo), or None."""
    try:
        return json.loads((lab_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_state(lab_dir: Path, state: dict) -> None:
    tmp = lab_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(lab_dir / STATE_FILE)

