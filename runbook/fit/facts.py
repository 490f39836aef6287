"""Facts for the fit planner: what to read on a node, the pure parsers, and the three origins of
node facts (measured by preflight, cached in a preflight sidecar, nominal for a GB10).

Read-only: every command here only reads (``df``, ``du``, ``cat``), like ``runbook.facts``.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from ..errors import RunbookError
from ..records import PREFLIGHT, PreflightRecord, record_from_sidecar
from ..facts import system
from .budget import FsFacts, NodeCapacity, hf_cache_repo_dir
from .figures import (DOCKER_ROOT, GB10_DISK, GB10_INODES, GB10_MEM_AVAILABLE, GB10_MEM_TOTAL, MEASURED,
                      Figure)

READ_TIMEOUT = 30          # df/du/cat on a node; du over a 157 GiB HF cache (335 files) is well under it
BOOT_ID_CMD = "cat /proc/sys/kernel/random/boot_id"
HOME_CMD = 'printf %s "$HOME"'


# ------------------------------------------------------------------------------------------------
# pure parsers
# ------------------------------------------------------------------------------------------------
INDEX_NAME = "model.safetensors.index.json"


def checkpoint_size_cmd(model_dir: str) -> str:
    """Size of the checkpoint in ``model_dir``: its index (``metadata.total_size``) when there is one,
    else the sizes of its ``*.safetensors`` files (a single-file model such as the lab's tiny one)."""
    d = system.shell_path(model_dir)
    return (f"cd {d} 2>/dev/null || exit 0; if [ -f {INDEX_NAME} ]; then echo index; cat {INDEX_NAME}; "
            f"else echo files; for f in *.safetensors; do [ -f \"$f\" ] && stat -L -c '%s %n' \"$f\"; done; fi")


def parse_checkpoint_size(text: str) -> int | None:
    """Output of ``checkpoint_size_cmd`` -> bytes, or None when there is no checkpoint::

        index
        {"metadata": {"total_size": 210664148992}, "weight_map": {...}}

    or::

        files
        5423104 model.safetensors
    """
    kind, _, body = text.strip().partition("\n")
    if kind == "index":
        return index_total_size(body)
    if kind == "files":
        sizes = [int(line.split(None, 1)[0]) for line in body.splitlines() if line.strip()]
        return sum(sizes) if sizes else None
    return None


def index_total_size(text: str, source: str = INDEX_NAME) -> int:
    """``metadata.total_size`` of a ``model.safetensors.index.json`` (bytes of every tensor)."""
    try:
        total = json.loads(text)["metadata"]["total_size"]
    except (ValueError, KeyError, TypeError) as exc:
        raise RunbookError(f"{source}: no metadata.total_size ({exc.__class__.__name__}: {exc})",
                           fix=f"pass the checkpoint's own {INDEX_NAME} (huggingface_hub writes metadata.total_size)")
    if not isinstance(total, int) or total <= 0:
        raise RunbookError(f"{source}: metadata.total_size is {total!r}, not a positive integer",
                           fix=f"pass the checkpoint's own {INDEX_NAME}")
    return total


def used_bytes_cmd(path: str) -> str:
    """Bytes already under ``path`` (0 when it does not exist)."""
    p = system.shell_path(path)
    return f"if [ -e {p} ]; then du -sb {p} 2>/dev/null | cut -f1; else echo 0; fi"


def parse_used_bytes(text: str) -> int:
    """``du -sb`` -> bytes::

        210664148992
    """
    line = text.strip().splitlines()[-1] if text.strip() else ""
    if not line.isdigit():
        raise ValueError(f"unexpected du output: {text!r}")
    return int(line)


# ------------------------------------------------------------------------------------------------
# what to read on a node
# ------------------------------------------------------------------------------------------------
def probe_paths(profile, node: str) -> dict[str, str]:
    """label -> path of everything the plan places on ``node``'s disks."""
    paths = {"weights": hf_cache_repo_dir(profile, profile.weights_dir_on(node)),
             "engram_src": profile.engram_src_dir if profile.engram else "",
             "engram_packed": profile.engram_packed_dir if profile.engram else "",
             "image": DOCKER_ROOT if profile.runtime == "docker" else "",
             "cache": profile.cache_dir}
    return {label: path for label, path in paths.items() if path}


class Reader(Protocol):
    """What gather_node needs of a node: ``runbook.remote.Node`` (or :class:`LocalHost`)."""
    name: str

    def read(self, command: str, *, timeout: float = ...) -> Any: ...


def _expand(path: str, home: str) -> str:
    if home and (path == "~" or path.startswith("~/")):
        return home + path[1:]
    return path


def gather_node(node: Reader, profile) -> dict[str, Any]:
    """Read the fit facts of one node (read-only): per probed path its filesystem (bytes, inodes,
    device) and the bytes already there, plus the kernel's boot id (same id = same host: the lab).
    Errors are kept as text per path, never raised: the plan shows that path as not placed.
    Each read has a timeout (READ_TIMEOUT)."""
    home = node.read(HOME_CMD, timeout=READ_TIMEOUT).stdout.strip()
    out: dict[str, Any] = {"boot_id": node.read(BOOT_ID_CMD, timeout=READ_TIMEOUT).stdout.strip(), "paths": {}}
    for label, path in probe_paths(profile, node.name).items():
        if path in out["paths"]:
            continue
        real = _expand(path, home)
        entry: dict[str, Any] = {}
        probes = [("df", system.disk_free_cmd, system.parse_disk_free),
                  ("inodes", system.disk_inodes_cmd, system.parse_disk_inodes)]
        if label != "image":       # docker's data-root holds every image (and needs root): presence is the image fact
            probes.append(("used", used_bytes_cmd, parse_used_bytes))
        for key, cmd, parse in probes:
            res = node.read(cmd(real), timeout=READ_TIMEOUT)
            try:
                entry[key] = parse(res.stdout) if res.ok else (res.stderr.strip() or f"exit {res.exit_code}")
            except ValueError as exc:
                entry[key] = str(exc)
        out["paths"][path] = entry
    return out


@dataclass
class LocalResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class LocalHost:
    """This machine as a read-only node (the lab's nodes run on it). Commands run with a timeout."""

    def __init__(self, name: str = "local"):
        self.name = name

    def read(self, command: str, *, timeout: float = READ_TIMEOUT) -> LocalResult:
        try:
            res = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout,
                                 cwd=os.path.expanduser("~"))
        except subprocess.TimeoutExpired as exc:
            return LocalResult(124, exc.stdout or "", f"timed out after {timeout:.0f} s")
        return LocalResult(res.returncode, res.stdout, res.stderr)


# ------------------------------------------------------------------------------------------------
# node facts: measured (preflight), cached (sidecar), nominal (GB10)
# ------------------------------------------------------------------------------------------------
def _fs_from_entry(entry: Mapping[str, Any], source: str, note: str) -> FsFacts | None:
    df = entry.get("df")
    if not isinstance(df, system.DiskFree):
        return None
    ino = entry.get("inodes")
    ino = ino if isinstance(ino, system.DiskInodes) else None
    return FsFacts(df.mount, Figure(df.avail_bytes, source, note), Figure(df.size_bytes, source, note),
                   Figure(ino.avail_inodes, source, note) if ino else None,
                   Figure(ino.total_inodes, source, note) if ino else None,
                   ino.device if ino else "")


def node_facts_from_gather(profile, gathered: Mapping[str, Mapping[str, Any]], *,
                           where: str = "preflight on {node}") -> dict[str, NodeCapacity]:
    """Preflight's facts (``runbook.preflight.gather`` per node, with ``gather_node``'s dict under
    ``"fit"``) -> NodeCapacity. Without ``"fit"`` the preflight's own ``"disk"`` labels are used (no
    inodes, no device: paths group by mount point). MemTotal falls back to the nominal GB10 figure."""
    out: dict[str, NodeCapacity] = {}
    for n in profile.nodes:
        f = gathered.get(n.name)
        if not isinstance(f, Mapping):
            continue
        mem = f.get("mem") or {}
        note = where.format(node=n.name)
        total = (Figure(mem["MemTotal"], MEASURED, f"MemTotal, {note}") if mem.get("MemTotal") else GB10_MEM_TOTAL)
        avail = (Figure(mem["MemAvailable"], MEASURED, f"MemAvailable, {note}") if "MemAvailable" in mem
                 else GB10_MEM_AVAILABLE)
        paths: dict[str, FsFacts] = {}
        used: dict[str, Figure] = {}
        fit = f.get("fit") or {}
        for path, entry in (fit.get("paths") or {}).items():
            fs = _fs_from_entry(entry, MEASURED, note)
            if fs:
                paths[path] = fs
            if isinstance(entry.get("used"), int):
                used[path] = Figure(entry["used"], MEASURED, f"du -sb, {note}")
        if not fit:
            legacy = {"weights": "weights", "cache": "cache", "engram": "engram_packed"}
            probes = probe_paths(profile, n.name)
            for label, info in (f.get("disk") or {}).items():
                path = probes.get(legacy.get(label, label))
                fs = _fs_from_entry({"df": info}, MEASURED, note) if path else None
                if fs:
                    paths[path] = fs
        image_present = None
        if f.get("docker") is not None:
            image_present = f.get("image") is not None
        out[n.name] = NodeCapacity(n.name, total, avail, paths, used, image_present, str(fit.get("boot_id", "")))
    return out


def nominal_facts(profile) -> dict[str, NodeCapacity]:
    """Every node a GB10 nobody has measured: nominal MemTotal, published MemAvailable before launch,
    one empty 4 TB root filesystem holding every path."""
    root = FsFacts("/", GB10_DISK, GB10_DISK, GB10_INODES, GB10_INODES, device="nominal-nvme")
    return {n.name: NodeCapacity(n.name, GB10_MEM_TOTAL, GB10_MEM_AVAILABLE, default_fs=root) for n in profile.nodes}


def local_facts(profile, host: LocalHost | None = None) -> dict[str, NodeCapacity]:
    """The lab's nodes measured on this machine (they share its kernel, memory and filesystems)."""
    host = host or LocalHost()
    mem = system.parse_meminfo(host.read(system.MEMINFO_CMD).stdout)
    if "MemAvailable" not in mem:
        raise RunbookError("cannot read /proc/meminfo on this host", fix="run plan on Linux, or pass --facts")
    gathered = {}
    for n in profile.nodes:
        host.name = n.name
        gathered[n.name] = {"mem": mem, "fit": gather_node(host, profile)}
    facts = node_facts_from_gather(profile, gathered, where="this host (runs lab node {node})")
    for f in facts.values():
        f.host = "this host"
    return facts


def node_facts_from_sidecar(profile, sidecar: Mapping[str, Any], where: str) -> dict[str, NodeCapacity]:
    """Node facts from a preflight sidecar (``steps/00_preflight.json``), read through its
    :class:`~runbook.records.PreflightRecord` (a sidecar without one is a ``RecordError`` naming 00_preflight).

    A record written with the fit planner holds them whole (``capacity``). Without a plan (a server of the
    runbook's held the memory) it holds MemAvailable/MemTotal and the free bytes of each probed path per node;
    inodes then stay nominal."""
    rec = record_from_sidecar(dict(sidecar), PreflightRecord, where)
    if rec.capacity:
        return {name: NodeCapacity.from_dict(d) for name, d in rec.capacity.items()}
    if not rec.nodes:
        raise RunbookError(f"{where}: no node facts (the preflight record names no node: it did not reach them)",
                           fix="run the preflight step again (python -m runbook run --only 00_preflight), "
                               "or plan without --facts")
    gathered = {}
    for name, node in rec.nodes.items():
        mem = {k: v for k, v in (("MemAvailable", node.mem_available), ("MemTotal", node.mem_total)) if v is not None}
        disk = {label: system.DiskFree("", d.free_bytes, 0, d.mount) for label, d in node.disk_free.items()}
        gathered[name] = {"mem": mem, "disk": disk, "docker": node.docker, "image": node.image_id or None}
    facts = node_facts_from_gather(profile, gathered, where=f"cached preflight of {{node}} ({where})")
    for f in facts.values():
        for fs in f.paths.values():
            fs.size_bytes = None       # the record keeps free bytes only
    return facts


def find_preflight(profile, facts_arg: str, results_root: Path) -> Path:
    """``--facts``: a sidecar file, a run folder, or ``latest`` (newest run of this profile)."""
    if facts_arg != "latest":
        p = Path(facts_arg)
        if p.is_dir():
            p = p / "steps" / f"{PREFLIGHT.id}.json"
        if not p.is_file():
            raise RunbookError(f"--facts {facts_arg}: no preflight sidecar at {p}",
                               fix="pass results/<run-id>/steps/00_preflight.json, a run folder, or 'latest'")
        return p
    runs = []
    for side in results_root.glob(f"*/steps/{PREFLIGHT.id}.json"):
        try:
            man = json.loads((side.parent.parent / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        if man.get("profile") == profile.name:
            runs.append((str(man.get("created") or ""), side.parent.parent.name, side))
    if not runs:
        raise RunbookError(f"--facts latest: no run of profile {profile.name} with a preflight sidecar under "
                           f"{results_root}",
                           fix="run preflight first (python -m runbook run --profile <profile> --only 00_preflight) "
                               "or plan without --facts (nominal GB10 figures)")
    return max(runs)[2]


def load_sidecar(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise RunbookError(f"{path}: not JSON ({exc})", fix="pass the run's steps/00_preflight.json")
    if not isinstance(data, dict) or data.get("step") != PREFLIGHT.id:
        raise RunbookError(f"{path}: not a preflight sidecar (step is {data.get('step') if isinstance(data, dict) else None!r})",
                           fix="pass results/<run-id>/steps/00_preflight.json")
    return data
