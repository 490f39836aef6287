"""Rehearsal simulators of the hardware-only tools, and their installer.

    checks = install(cluster, profile)        # REHEARSAL=1 only: every lab node gets its simulated Spark

A rehearsal (``run --rehearse``) runs a recipe profile on the lab, whose nodes have no GPU, no ConnectX-7 and
no RDMA. The tools that need that hardware -- ``nvidia-smi``, ``ibdev2netdev``, ``ibv_devinfo``, perftest's
``ib_write_bw``/``ib_write_lat`` and nccl-tests' ``all_reduce_perf`` -- are stood in for by ``simtools.py``
(this folder), which checks every invocation against what the real tool needs on a DGX Spark and prints the
real output format. ``mpirun`` is not simulated: the lab has OpenMPI (``openmpi-bin``), which starts the
``all_reduce_perf`` ranks on their nodes over ssh, and the ranks meet through its libmpi. Each node gets,
under :data:`SIM_DIR` (node-private ``/mnt/nvme`` in the lab):

* ``bin/<tool>`` -> ``bin/simtools.py`` (first on PATH through ``runbook.remote.rehearsal_path_prefix``),
* ``nccl-tests/build/all_reduce_perf`` (where the network step looks for nccl-tests in a rehearsal),
* ``node.json``: this node's simulated Spark -- the four Spark HCAs, each on its own CX-7 port's lab netdev and Up
  when that port is cabled (:func:`hca_netdev`); the node's interfaces as ``ip -j addr`` read them at install
  time; the GB10; the published figures the tools print,
* ``sys/class/infiniband/<hca>/ports/1/...``: a sysfs-shaped GID table per HCA with the RoCE v2
  IPv4-mapped GID of the netdev's address at the profile's ``<NODE>_GID`` (3, as on a Spark, for ``auto``),
* ``manifest.json``: what was installed, from which profile, and where every printed number comes from.

A profile HCA that is not a Spark HCA name is not simulated (the step then names it missing, as on a Spark).
"""
from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import posixpath
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ...checks import Check, Status, check
from ...errors import LabError
from ...facts import net as fnet
from ...remote import REHEARSAL_SIM_DIR
from ..control import lab_root

SIM_DIR = REHEARSAL_SIM_DIR
SYSFS_ROOT = f"{SIM_DIR}/sys"
NCCL_TESTS_DIR = f"{SIM_DIR}/nccl-tests/build"
MANIFEST = f"{SIM_DIR}/manifest.json"
SIMTOOLS = Path(__file__).with_name("simtools.py")
TOOLS = ("nvidia-smi", "ibdev2netdev", "ibv_devinfo", "ib_write_bw", "ib_write_lat")
LAB_MARK_CMD = "cat /mnt/nvme/WHOAMI 2>/dev/null"     # written by runbook.lab.netlab on every lab node

# A DGX Spark's four RoCE HCAs (two per QSFP port, one per PCIe Gen5 x4 controller): name -> (netdev, PCI).
SPARK_HCAS = {
    "rocep1s0f0": ("enp1s0f0np0", "0000:01:00.0"),
    "rocep1s0f1": ("enp1s0f1np1", "0000:01:00.1"),
    "roceP2p1s0f0": ("enP2p1s0f0np0", "0002:01:00.0"),
    "roceP2p1s0f1": ("enP2p1s0f1np1", "0002:01:00.1"),
}
GID_SLOTS = 8           # a real mlx5 table has 255; the dump fixtures keep 0-7 as well

# Every number a simulator prints, with where it comes from (copied into manifest.json and the rows' notes).
FIGURES: dict[str, Any] = {
    "rdma_gbps": {"rocep1s0f0": 92.57, "rocep1s0f1": 92.57, "roceP2p1s0f0": 97.28, "roceP2p1s0f1": 97.28},
    "lat_us": {"t_min": 1.42, "t_typical": 1.47, "p99": 1.57, "p999": 1.93, "t_max": 3.90, "t_avg": 1.49,
               "t_stdev": 0.05},
    "nccl_busbw_gbs": {"2": 23.74, "1": 12.25, "socket": 3.0},
    "nccl_version": "2.28.9+cuda13.0",
}
GPU = {"name": "NVIDIA GB10", "driver": "580.178.04", "cuda": "13.0", "cuda_driver": "13000",
       "compute_cap": "12.1", "bus_id": "0000000F:01:00.0", "nccl_bus": "000f:01:00"}
HCA_FW = "28.45.4028"
SOURCES = {
    "rdma_gbps": "ib_write_bw per twin 92.57 Gb/s (rocep1s0f*) and 97.28 Gb/s (roceP2p1s0f*): NVIDIA "
                 "dgx-spark-playbooks connect-two-sparks performance_benchmarking_guide, 'Dual Spark'",
    "lat_us": "ib_write_lat t_min 1.42, t_typical 1.47, p99 1.57, p99.9 1.93 us: eugr/spark-vllm-docker "
              "docs/NETWORKING.md; t_max 3.90, t_avg 1.49, t_stdev 0.05 are not published (the repository's "
              "constructed fixture tests/unit/facts/net/ib_write_lat_rail0.txt)",
    "nccl_busbw_gbs": "all_reduce busbw per size row = the published figure for the HCAs every rank uses: both "
                      "twins 23.74 GB/s (dgx-spark-playbooks PR #103, release NCCL 2.28.9-1, MTU 9000); one twin "
                      "12.25 GB/s (98 Gb/s, tonyd2wild two-Spark PR #35); NET/Socket 3.0 GB/s (dgx-spark-playbooks "
                      "#102, the ~3 GB/s of a misconfigured NCCL; no NET/Socket figure is published). Times are "
                      "derived (size / algbw)",
    "nccl_version": "NCCL v2.28.9-1, the version NVIDIA's 'NCCL for Two Sparks' playbook builds",
    "gpu": "NVIDIA GB10, driver 580.178.04, CX-7 firmware 28.45.4028: christopherowen/dgx-spark-networking "
           "docs/host-prerequisites.md",
}


def active_mtu(netdev_mtu: int) -> int:
    """RoCE active MTU from the netdev MTU (the kernel subtracts 96 B of RoCE headers and rounds down to an IB
    MTU): 9000 and 4200 -> 4096, 1500 -> 1024."""
    room = int(netdev_mtu or 0) - 96
    return next((m for m in (4096, 2048, 1024, 512, 256) if m <= room), 256)


def _link_local(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")] if mac and mac.count(":") == 5 else [0, 0, 0, 0, 0, 0]
    eui = [b[0] ^ 2, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    return "fe80:0000:0000:0000:" + ":".join(f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2))


def _mapped(ipv4: str) -> str:
    packed = ipaddress.IPv6Address(f"::ffff:{ipv4}").packed
    return ":".join(packed[i:i + 2].hex() for i in range(0, 16, 2))


def _ipv4_base(pin: Any) -> int:
    """First slot of the IPv4 (RoCE v1, RoCE v2) pair: the v2 GID lands on the pinned index (3 for auto)."""
    idx = int(pin) if str(pin).strip().isdigit() else 3
    if idx < 2:
        return 2
    return idx - 1 if idx % 2 else idx


def hca_netdev(hca: str, spark_netdev: str, ifaces: dict, spec) -> tuple[str, bool]:
    """The netdev a simulated HCA sits on and whether its port is Up (ACTIVE). The lab's nodes have a Spark's two
    CX-7 ports under their names, cabled point to point: an HCA is on its own port's netdev, Up when that netdev is
    up (listed in the profile or not, as ibdev2netdev shows a cabled port). The lab has one netdev per port: a twin
    (roceP2p1s0f*) the profile lists rides its port's netdev (rocep1s0f0's twin on enp1s0f0np0), which gives the
    node no second path; a listed HCA whose port the node lacks rides the profile's fabric netdev (a lab with one
    port per node); an HCA on no netdev of the node is Down."""
    if spark_netdev in ifaces:
        return spark_netdev, ifaces[spark_netdev].up
    listed = hca in spec.ib_devs
    port = SPARK_HCAS.get(f"rocep1s0f{hca[-1]}", ("", ""))[0]
    if listed and port in ifaces:
        return port, ifaces[port].up
    fabric = (str(spec.fabric_if).split(",")[0]).strip()
    if listed and fabric in ifaces:
        return fabric, ifaces[fabric].up
    return spark_netdev, False


def node_config(profile, spec, ip_addr_json: str, *, hostname: str, root: str = SIM_DIR) -> dict[str, Any]:
    """This node's simulated Spark (what ``node.json`` holds), from the profile's node, ``ip -j addr`` and
    ``hostname`` read on the node."""
    ifaces = fnet.parse_ip_addr(ip_addr_json)
    if not ifaces:
        raise LabError(f"cannot read {spec.name}'s interfaces for its simulated Spark",
                       node=spec.name, observed=ip_addr_json[:200], expected="`ip -j addr show` JSON",
                       fix="check the lab node answers `ip -j addr show` (make lab-up)")
    hcas = []
    for name, (netdev, pci) in SPARK_HCAS.items():
        netdev, up = hca_netdev(name, netdev, ifaces, spec)
        guid = hashlib.sha256(f"{spec.name}/{name}".encode()).hexdigest()
        mtu = ifaces[netdev].mtu if netdev in ifaces else 0
        hcas.append({"name": name, "port": 1, "netdev": netdev, "up": up, "pci": pci, "fw": HCA_FW,
                     "board_id": "NVD0000000033", "active_mtu": active_mtu(mtu) if up else 1024,
                     "node_guid": ":".join(guid[i:i + 4] for i in range(0, 16, 4))})
    uuid = hashlib.sha256(f"gb10/{spec.name}".encode()).hexdigest()
    return {
        "node": spec.name, "rank": spec.rank, "hostname": hostname, "root": root, "sysfs": f"{root}/sys",
        "interfaces": {n: {"ipv4": list(i.ipv4), "mtu": i.mtu, "up": i.up, "mac": i.mac} for n, i in ifaces.items()},
        "hcas": hcas, "gid_pin": str(spec.gid),
        "gpu": {**GPU, "uuid": f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:32]}"},
        "figures": FIGURES,
    }


def node_files(config: dict[str, Any], profile_source: str = "") -> dict[str, bytes | str]:
    """Relative path -> file bytes (or ``str``: a symlink target) of one node's simulator tree."""
    files: dict[str, bytes | str] = {"bin/simtools.py": SIMTOOLS.read_bytes()}
    for tool in TOOLS:
        files[f"bin/{tool}"] = "simtools.py"
    files["nccl-tests/build/all_reduce_perf"] = "../../bin/simtools.py"
    files["node.json"] = (json.dumps(config, indent=1, sort_keys=True) + "\n").encode()
    base = _ipv4_base(config["gid_pin"])
    for h in config["hcas"]:
        port = f"sys/class/infiniband/{h['name']}/ports/1"
        files[f"{port}/state"] = b"4: ACTIVE\n" if h["up"] else b"1: DOWN\n"
        files[f"{port}/link_layer"] = b"Ethernet\n"
        slots: dict[int, tuple[str, str]] = {}
        iface = config["interfaces"].get(h["netdev"], {})
        if h["up"]:
            ll = _link_local(iface.get("mac", ""))
            slots[0], slots[1] = (ll, "IB/RoCE v1"), (ll, "RoCE v2")
            for k, addr in enumerate(iface.get("ipv4", [])):
                ip = str(ipaddress.ip_interface(addr).ip)
                slots[base + 2 * k], slots[base + 2 * k + 1] = (_mapped(ip), "IB/RoCE v1"), (_mapped(ip), "RoCE v2")
        for idx in range(max([GID_SLOTS - 1, *slots]) + 1):
            gid, typ = slots.get(idx, ("0000:0000:0000:0000:0000:0000:0000:0000", ""))
            files[f"{port}/gids/{idx}"] = (gid + "\n").encode()
            if typ:                     # unused slots: reading types/ndevs fails with EINVAL on a real node
                files[f"{port}/gid_attrs/types/{idx}"] = (typ + "\n").encode()
                files[f"{port}/gid_attrs/ndevs/{idx}"] = (h["netdev"] + "\n").encode()
    digest = hashlib.sha256()
    for path in sorted(files):
        content = files[path]
        digest.update(path.encode() + b"\0" + (content.encode() if isinstance(content, str) else content))
    manifest = {"installed_by": "runbook.lab.sim", "node": config["node"], "profile": profile_source,
                "digest": digest.hexdigest(), "tools": [*TOOLS, "all_reduce_perf (nccl-tests)"],
                "sim_dir": config["root"], "figures": FIGURES, "gpu": config["gpu"], "sources": SOURCES,
                "hcas": [{k: h[k] for k in ("name", "netdev", "up", "active_mtu")} for h in config["hcas"]],
                "gid_index": base + 1, "note": "simulators: every figure above is a published DGX Spark figure "
                "(see sources), printed when the invocation is valid; nothing here measures this machine"}
    files["manifest.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
    return files


def write_tree(root: str | Path, files: dict[str, bytes | str]) -> None:
    """Write a node tree locally (unit tests run the simulators from such a tree)."""
    root = Path(root)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            if path.is_symlink() or path.exists():
                path.unlink()
            path.symlink_to(content)
        else:
            path.write_bytes(content)
            if rel == "bin/simtools.py":
                path.chmod(0o755)


def _tarball(files: dict[str, bytes | str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in sorted(files):
            content = files[rel]
            info = tarfile.TarInfo(rel)
            info.mtime = 0
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o755 if rel == "bin/simtools.py" else 0o644
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def manifest_digest(text: str) -> str:
    try:
        return str(json.loads(text).get("digest", ""))
    except (ValueError, AttributeError):
        return ""


def install(cluster, profile) -> list[Check]:
    """Put each node's simulated Spark on every lab node (REHEARSAL=1 only). One row per node: PASS when
    installed, NO-OP when the same tree is already there. Refuses a node that is not a lab node."""
    if not profile.rehearsal:
        raise LabError("hardware simulators are installed only in a rehearsal",
                       observed="REHEARSAL=0",
                       expected="REHEARSAL=1 (python -m runbook run --rehearse)",
                       fix="run the recipe profile with --rehearse; real nodes use the real tools")
    source = str(profile.source)

    def one(node) -> Check:
        mark = node.read(LAB_MARK_CMD, timeout=20)
        if "(lab)" not in (mark.stdout or ""):
            return check("rehearsal simulators", False, node=node.name,
                         observed=f"/mnt/nvme/WHOAMI: {(mark.stdout or '').strip()[:80] or 'absent'}",
                         expected="a lab node (runbook.lab.netlab marks its /mnt/nvme)",
                         fix="rehearse only on the embedded lab (make lab-up); simulators never go on a real node")
        addr = node.read(fnet.IP_ADDR_CMD, timeout=20)
        host = (node.read("hostname", timeout=20).stdout or "").strip() or node.name
        files = node_files(node_config(profile, node.spec, addr.stdout, hostname=host), source)
        want = manifest_digest(files["manifest.json"].decode())
        have = manifest_digest(node.read(f"cat {MANIFEST} 2>/dev/null", timeout=20).stdout or "")
        where = f"{SIM_DIR} ({', '.join(TOOLS)}, nccl-tests/build/all_reduce_perf; manifest.json)"
        if have == want:
            return Check("rehearsal simulators", node=node.name, status=Status.NOOP,
                         observed=f"already installed at {where}, digest {want[:12]}",
                         expected="the simulated Spark of this profile's node")
        if node.dry_run:
            return Check("rehearsal simulators", node=node.name, status=Status.NOOP,
                         observed=f"dry run: would install at {where}, digest {want[:12]} (installed has "
                                  f"{have[:12] or 'none'})", expected="the simulated Spark of this profile's node")
        tar_path = posixpath.join(posixpath.dirname(SIM_DIR), "sim-install.tar.gz")
        # the simulated hardware is the lab's, installed as root whoever the rehearsal logs in as (/mnt/nvme is root's)
        with lab_root(node) as root, tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
            tmp.write(_tarball(files))
            tmp.flush()
            root.run(f"mkdir -p {posixpath.dirname(SIM_DIR)}", timeout=20)
            root.put(tmp.name, tar_path)
            root.run(f"set -e; rm -rf {SIM_DIR}.new; mkdir {SIM_DIR}.new; tar -xzf {tar_path} -C {SIM_DIR}.new; "
                     f"chmod -R a+rX {SIM_DIR}.new; rm -rf {SIM_DIR}; mv {SIM_DIR}.new {SIM_DIR}; rm -f {tar_path}",
                     timeout=60)
        return check("rehearsal simulators", True, node=node.name,
                     observed=f"installed at {where}, digest {want[:12]}",
                     expected="the simulated Spark of this profile's node")

    out = []
    for name, value in cluster.each(one).items():
        out.append(value if isinstance(value, Check) else
                   check("rehearsal simulators", False, node=name, observed=str(value).splitlines()[0][:300],
                         expected="simulators installed", fix="check the lab node is up (make lab-up)"))
    return out
