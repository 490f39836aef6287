"""The run directory ``results/<run-id>/``: manifest, provenance, sidecars, raw files, scrubbing.

Everything written here goes through ``atomic_write`` (temp file + rename, so nothing
half-written ever sits under a final name) and through the redactor (secrets become ``***``).
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from .errors import BusyError
from .records import (LAUNCH, SERVED_STEPS, LaunchRecord, Record, RecordError, record_from_sidecar,
                      record_to_sidecar, step_info)
from .secrets import Redactor, default_redactor

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_ROOT = REPO_ROOT / "results"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
MANIFEST_VERSION = 1
TRACKED_PACKAGES = ("spark-runbook", "papermill", "fabric", "paramiko", "huggingface_hub", "openai",
                    "pandas", "pydantic", "jupyterlab", "nbmake", "ipykernel")


def atomic_write(path: Path, data: bytes | str, *, replace: bool = True, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` so that ``path`` is either absent/old or complete, never half-written:
    a fsynced temporary beside it, then a rename. ``replace=False`` never clobbers a file that is there
    (or appears meanwhile): FileExistsError. ``mode``: permissions (mkstemp makes 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)          # fails if the file exists: never clobbers
            os.unlink(tmp)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (best effort: not every filesystem allows it)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def new_run_id(profile_name: str, now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", profile_name or "run").strip("-") or "run"
    return f"{now:%Y%m%d-%H%M%S}-{safe}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_redacted(path: Path, text: str, redactor: Redactor | None = None) -> Path:
    """The one writer of evidence text outside :class:`RunDir` (network raw files, bench outputs): every secret
    masked (``redactor``, else the process-wide one), then :func:`atomic_write`."""
    return atomic_write(Path(path), (redactor or default_redactor()).redact(text))


class RunDir:
    """One run's evidence folder."""

    def __init__(self, path: Path, redactor: Redactor | None = None):
        self.path = Path(path)
        self.redactor = redactor or default_redactor()

    @classmethod
    def create(cls, profile_name: str, root: Path | None = None,
               redactor: Redactor | None = None) -> "RunDir":
        root = Path(root) if root else RESULTS_ROOT
        root.mkdir(parents=True, exist_ok=True)
        run_id = new_run_id(profile_name)
        path, n = root / run_id, 1
        while True:                   # two runs in the same second: mkdir decides, atomically
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = root / f"{run_id}-{n}"
        run = cls(path, redactor)
        run._write_manifest({"version": MANIFEST_VERSION, "run_id": path.name, "profile": profile_name,
                             "created": _now(), "status": "running", "steps": {}})
        return run

    @property
    def run_id(self) -> str:
        return self.path.name

    def hold(self, command: str = "run") -> "RunDir":
        """Hold the run folder for this process (``flock`` on ``.run.lock``: released by the kernel when the process
        ends, also when it is killed). A second holder gets :class:`BusyError` naming the first."""
        if getattr(self, "_held", None) is not None:
            return self
        fd = os.open(self.path / ".run.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 400, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise BusyError(f"run {self.run_id} is in use by another process", observed=holder or "a holder",
                            expected="one process per run folder",
                            fix="wait for that run to end (or stop it), then resume") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {command}\n".encode(), 0)
        self._held = fd
        return self

    def release(self) -> None:
        fd = getattr(self, "_held", None)
        if fd is not None:
            self._held = None
            os.close(fd)                  # closing the descriptor drops the flock

    # -- generic writers ----------------------------------------------------------------------
    def write_text(self, rel: str, text: str) -> Path:
        return atomic_write(self.path / rel, self.redactor.redact(text))

    def write_json(self, rel: str, obj: Any) -> Path:
        return self.write_text(rel, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")

    def raw_path(self, step: str, name: str) -> Path:
        return self.path / "raw" / step / name

    def write_raw(self, step: str, name: str, text: str) -> str:
        """Store a raw tool output; returns its path relative to the run dir."""
        path = self.raw_path(step, name)
        self.write_text(str(path.relative_to(self.path)), text)
        return str(path.relative_to(self.path))

    # -- manifest -----------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    def manifest(self) -> dict[str, Any]:
        return json.loads(self.manifest_path.read_text())

    @contextmanager
    def _manifest_lock(self) -> Iterator[None]:
        # runner and notebook kernels are separate processes updating the same manifest
        lock_path = self.path / ".manifest.lock"
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        self.write_json("manifest.json", manifest)

    def update_manifest(self, **fields: Any) -> dict[str, Any]:
        with self._manifest_lock():
            manifest = self.manifest()
            manifest.update(fields)
            self._write_manifest(manifest)
            return manifest

    def record_step(self, step: str, **fields: Any) -> dict[str, Any]:
        with self._manifest_lock():
            manifest = self.manifest()
            entry = manifest.setdefault("steps", {}).setdefault(step, {})
            entry.update(fields)
            self._write_manifest(manifest)
            return entry

    # -- step sidecars ------------------------------------------------------------------------
    def sidecar_rel(self, step: str) -> str:
        return f"steps/{step}.json"

    def write_sidecar(self, step: str, checks: list[dict[str, Any]], data: dict[str, Any],
                      status: str, record: Record | None = None) -> Path:
        """``record``: the step's typed facts for the later steps (``runbook.records``), of its table's type."""
        side = {"step": step, "status": status, "written": _now(), "checks": checks, "data": data}
        if record is not None:
            side["record"] = record_to_sidecar(step, record)
        return self.write_json(self.sidecar_rel(step), side)

    def read_sidecar(self, step: str) -> dict[str, Any] | None:
        path = self.path / self.sidecar_rel(step)
        return json.loads(path.read_text()) if path.exists() else None

    def read_record(self, cls: type[Record], *, missing_ok: bool = False):
        """The record of type ``cls`` its step wrote into this run (``records.record_from_sidecar``: an error naming
        the step to re-run when it is absent or of another format). ``missing_ok``: None when that step wrote no
        sidecar here at all (a reader that also runs without it, e.g. ``python -m runbook start``)."""
        step = step_info(cls).id
        sidecar = self.read_sidecar(step)
        if sidecar is None and missing_ok:
            return None
        return record_from_sidecar(sidecar, cls, str(self.path / self.sidecar_rel(step)))

    def evidence_of_other_servers(self) -> dict[str, str]:
        """The server steps (05-07) whose evidence was measured on another start of the server than the one this
        run's 04 record names (a restart in between: same configuration, other process): step id -> one sentence,
        in step order. A step
        or a 04 that recorded no server identity (dry run, base_url, an older runbook) is not judged."""
        try:
            final = self.read_record(LaunchRecord, missing_ok=True)
        except RecordError:
            return {}
        if final is None or not final.server_id:
            return {}
        out = {}
        for step in SERVED_STEPS:
            try:
                rec = self.read_record(step.record, missing_ok=True)
                measured = rec.server_id if rec is not None else ""
            except RecordError:          # a run made before records (or a step that ended first): its data
                measured = (((self.read_sidecar(step.id) or {}).get("data") or {}).get("server") or {}).get("server_id")
            if measured and measured != final.server_id:
                out[step.id] = (f"{step.id} was measured on server start {measured}, the run ends with "
                                f"{final.server_id} ({LAUNCH.id} started it again after): re-run {step.id}")
        return out

    # -- scrubbing ----------------------------------------------------------------------------
    def scrub(self) -> list[str]:
        return scrub_tree(self.path, self.redactor)


def scrub_tree(root: Path, redactor: Redactor) -> list[str]:
    """Rewrite every text file under ``root`` with secrets masked. Returns the files changed."""
    changed = []
    for path in sorted(Path(root).rglob("*")):
        if not path.is_file() or path.name.endswith(".lock"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        clean = redactor.redact(text)
        if clean != text:
            atomic_write(path, clean)
            changed.append(str(path.relative_to(root)))
    return changed


def provenance(profile) -> dict[str, Any]:
    """Where and with what this run was made: git state, packages, interpreter, local host."""
    packages = {}
    for name in TRACKED_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "written": _now(),
        "git": git_state(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "packages": packages,
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "machine": platform.machine()},
        "profile_source": str(profile.source or ""),
    }


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    sha = git("rev-parse", "HEAD")
    return {"sha": sha or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def discover_steps(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """Step names in run order: ``notebooks/NN_name.ipynb`` sorted by NN."""
    return sorted(p.stem for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb"))


def _manifest_of(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def previous_good_run(run_dir: str | Path, results_root: str | Path | None = None, *, step: str = "") -> Path | None:
    """The one "previous good run": the latest run under ``results_root`` (default: the run folder's
    parent) created before ``run_dir``, of the same profile, whose manifest status is ``passed``.
    The bench's "previous" column and the report's drift both use it, so they name the same run.
    With ``step``: the latest such run whose manifest entry of that step is ``passed`` (the run itself may have
    failed later): the launch a ``run --only smoke`` reuses (``runner.reuse_launch``)."""
    run = Path(run_dir).resolve()
    root = Path(results_root).resolve() if results_root else run.parent
    mine = _manifest_of(run)
    order = (str(mine.get("created") or ""), run.name)
    best: tuple[tuple[str, str], Path] | None = None
    for manifest in root.glob("*/manifest.json"):
        candidate = manifest.parent.resolve()
        if candidate == run:
            continue
        meta = _manifest_of(candidate)
        passed = (((meta.get("steps") or {}).get(step) or {}).get("status") if step else meta.get("status"))
        if meta.get("profile") != mine.get("profile") or passed != "passed":
            continue
        key = (str(meta.get("created") or ""), candidate.name)
        if key < order and (best is None or key > best[0]):
            best = (key, candidate)
    return best[1] if best else None

