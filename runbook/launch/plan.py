"""The launch plan from the nodes: what render needs to know about each node (read-only) and every rank's
rendered command.

    plan = launch_plan(cluster, profile, run.read_record(NetworkRecord, missing_ok=True))   # step 04 and `start`
    gids = gid_indexes(cluster, profile, network)     # those step 01 resolved, else resolved now (read-only)
    facts = gather_facts(cluster, profile, gid_indexes=gids)          # home, GID index, packed Engram, lab mounts
    plan = render_plan(cluster, profile, gid_indexes=gids)            # facts + render.render; nothing runs
"""
from __future__ import annotations

from pathlib import Path

from . import render
from .render import LaunchPlan, NodeFacts
from ..facts import net as fnet, rdma as frdma
from ..records import NetworkRecord
from ..remote import Cluster, Node, quote
from ..site import SPARKS_SITE, Site

__all__ = [
    "gather_facts",
    "gid_indexes",
    "launch_plan",
    "render_plan",
]


def _lab_runtime_mounts(profile) -> tuple[str, ...]:
    """Lab docker runtime: the busybox image has no Python; bind the host interpreter, its venv and the
    repo read-only (lab-feasibility §7). Read from the local venv's pyvenv.cfg (the lab nodes share
    this filesystem)."""
    bin_parts = render.vllm_bin_parts(profile)
    mounts = ["/usr", "/lib", "/lib64", "/etc/ssl", str(profile.root)]
    py = Path(bin_parts[0])
    cfg = py.parent.parent / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            if line.startswith("home"):
                home = Path(line.split("=", 1)[1].strip())
                mounts.append(str(home.parent))          # <prefix>/bin -> <prefix>
    real = py.parent.parent.resolve()
    if not str(real).startswith(str(profile.root)):
        mounts.append(str(real))
    return tuple(dict.fromkeys(mounts))


def gid_indexes(cluster: Cluster, profile, network: NetworkRecord | None = None, *,
                site: Site = SPARKS_SITE) -> dict[str, int]:
    """The GID index of each node, for the ranks whose ``<NODE>_GID`` is ``auto``: the ones 01_network
    resolved (its record) when the run has one, else resolved now from each node's RoCE GID table with the same
    resolver (read-only), under the site's GID tables (a rehearsal's simulated ones). EXPECT_RDMA=0: none (01_network
    resolves none either)."""
    if network is not None:
        return dict(network.gid_index)
    if not profile.expect_rdma:
        return {}
    sysfs = site.sysfs                     # a rehearsal's simulated GID tables

    def read(node: Node) -> int | None:
        ifaces = fnet.parse_ip_addr(node.read(fnet.IP_ADDR_CMD, timeout=30).stdout)
        ports = frdma.parse_ibdev2netdev(node.read(frdma.IBDEV2NETDEV_CMD, timeout=30).stdout)
        gids = frdma.parse_gid_dump(node.read(frdma.gid_dump_cmd(sysfs), timeout=30).stdout, root=sysfs)
        return frdma.resolve_node_gid(node.name, gids, list(node.spec.ib_devs),
                                      {n: i.ipv4_addresses for n, i in ifaces.items()},
                                      {p.hca: p.netdev for p in ports}, match_ip=str(node.spec.fabric_ip)).index
    return {name: index for name, index in cluster.each(read).items() if isinstance(index, int)}


def gather_facts(cluster: Cluster, profile, *, gid_indexes: dict[str, int] | None = None) -> dict[str, NodeFacts]:
    """Per node: $HOME, whether this rank's packed Engram shard exists, and (lab docker) the host
    directories to bind-mount. ``gid_indexes`` are the GID indexes the network step resolved
    (:func:`gid_indexes`); they are used where the profile says ``auto`` (seed B's
    ``auto`` leaves NCCL_IB_GID_INDEX unset instead, so NCCL picks per HCA). Read-only."""
    gid_indexes = dict(gid_indexes or {})

    def read(node: Node) -> NodeFacts:
        home = node.read("printf %s \"$HOME\"").stdout.strip() or "/root"
        gid = gid_indexes.get(node.name) if profile.recipe != "dspark-v4" else None
        packed = False
        if profile.engram and profile.engram_packed_dir:
            d = render.expand_home(profile.engram_packed_dir, home)
            f = f"{d}/engram-l1-r{profile.tp_rank(node.spec.rank)}of{profile.tp}.bin"
            packed = node.read(f"test -s {quote(f)}").ok
        mounts = _lab_runtime_mounts(profile) if (profile.lab and profile.runtime == "docker") else ()
        return NodeFacts(home=home, gid_index=gid, packed_engram=packed, runtime_mounts=mounts)

    out = cluster.each(read)
    for value in out.values():
        if isinstance(value, Exception):
            raise value
    return out  # type: ignore[return-value]


def render_plan(cluster: Cluster, profile, *, secrets=None, node_overrides=None,
                gid_indexes: dict[str, int] | None = None) -> LaunchPlan:
    """Gather the node facts and render (nothing runs)."""
    if secrets is None:
        from ..secrets import load_secrets
        secrets = load_secrets()
    return render.render(profile, gather_facts(cluster, profile, gid_indexes=gid_indexes),
                         api_key_set=bool(secrets.api_key), node_overrides=node_overrides)


def launch_plan(cluster: Cluster, profile, network: NetworkRecord | None = None, *,
                site: Site = SPARKS_SITE) -> LaunchPlan:
    """The plan step 04 and ``python -m runbook start`` both start: rendered with :func:`gid_indexes`, so
    with ``<NODE>_GID=auto`` both compute one fingerprint. ``network``: step 01's record in this run, if it ran."""
    return render_plan(cluster, profile, gid_indexes=gid_indexes(cluster, profile, network, site=site))
