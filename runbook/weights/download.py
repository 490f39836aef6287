"""Hub metadata, free-space check, pinned download (local side).

Layouts (``node_download.LAYOUTS``): ``local_dir`` — the files land as a plain tree in the
destination (what ``vllm serve /model`` loads, where ``.runbook-manifest.json`` sits); the
partials of cut files sit in ``<dest>/.cache/runbook/partial/``. ``hub_cache`` — the destination is an HF hub cache
(``models--org--name/{blobs,snapshots/<rev>,refs/main}``); the tree that is verified and holds the
manifest is ``snapshots/<rev>``. ``runbook.weights_tools.layout`` picks one from the profile.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import Check, check
from ..errors import ActionError, RunbookError
from ..profile.rules import hf_endpoint_is_foreign
from ..secrets import load_secrets
from ..weights_tools import node_download, verify_manifest

SHA40 = re.compile(r"^[0-9a-f]{40}$")
GIB = 1 << 30


def hf_token(env: Mapping[str, str] | None = None) -> str | None:
    """The HF token: the environment (``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN``), else the secrets file (never a
    profile, never printed). A secrets file that is not 0600 and yours raises :class:`SecretsError` (exit 2)."""
    return load_secrets(os.environ if env is None else env).hf_token or None


def hf_token_for(profile, env: Mapping[str, str] | None = None) -> str | None:
    """The token the profile's downloads and metadata reads send: :func:`hf_token`, except to a foreign
    ``HF_ENDPOINT`` (not huggingface.co, not the lab's hub) unless the profile sets ``HF_ENDPOINT_TRUSTED=1``."""
    if hf_endpoint_is_foreign(profile) and not profile.hf_endpoint_trusted:
        return None
    return hf_token(env)


def require_pinned(revision: str, key: str = "HF_REVISION") -> str:
    if not SHA40.match(revision or ""):
        raise RunbookError(f"{key} is not a pinned commit", observed=repr(revision),
                           expected="a 40-hex commit sha", fix=f"set {key} to the commit sha "
                           "shown on the repo's 'Files and versions' page (or HfApi().model_info(repo).sha)")
    return revision


@dataclass
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None        # LFS files: the Hub's lfs.sha256
    git_sha1: str | None = None      # plain files: the git blob id

    def expected(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size}
        if self.sha256:
            out["sha256"] = self.sha256
        elif self.git_sha1:
            out["git_sha1"] = self.git_sha1
        return out


@dataclass
class RepoSnapshot:
    """What the Hub says a pinned revision contains (``model_info(files_metadata=True)``)."""
    repo: str
    revision: str
    files: list[RemoteFile] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def select(self, allow_patterns: Iterable[str] | None = None,
               ignore_patterns: Iterable[str] | None = None) -> RepoSnapshot:
        """The subset the download fetches for these patterns (the same matcher: ``node_download.select``)."""
        keep = set(node_download.select([f.path for f in self.files], allow_patterns, ignore_patterns))
        return RepoSnapshot(self.repo, self.revision, [f for f in self.files if f.path in keep])

    def expected(self) -> dict[str, Any]:
        """The expected-file document ``verify_manifest`` checks against."""
        return {"repo": self.repo, "revision": self.revision,
                "files": [f.expected() for f in sorted(self.files, key=lambda f: f.path)]}


def fetch_metadata(repo: str, revision: str, *, endpoint: str | None = None,
                   token: str | None = None, timeout: float = 30) -> RepoSnapshot:
    """Sizes and hashes of every file of ``repo`` at the pinned ``revision``."""
    from huggingface_hub import HfApi
    require_pinned(revision)
    api = HfApi(endpoint=endpoint, token=token if token else False)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True, timeout=timeout)
    except Exception as err:  # noqa: BLE001 - one readable message for the notebook
        raise RunbookError(f"cannot read Hub metadata for {repo}@{revision[:12]}",
                           observed=f"{type(err).__name__}: {_mask(str(err), token)}",
                           expected="model_info(files_metadata=True) answers",
                           fix="check HF_ENDPOINT / network / HF_TOKEN (gated repos) and the revision") from None
    if info.sha != revision:
        raise RunbookError("Hub answered a different revision", observed=str(info.sha), expected=revision)
    files = []
    for s in info.siblings or []:
        if s.size is None:
            raise RunbookError("Hub metadata lacks file sizes", observed=s.rfilename,
                               expected="siblings with size (files_metadata=True)")
        files.append(RemoteFile(s.rfilename, int(s.size), sha256=s.lfs.sha256 if s.lfs else None,
                                git_sha1=None if s.lfs else s.blob_id))
    return RepoSnapshot(repo, revision, files)


def _free_bytes(path: str | os.PathLike) -> int:
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def bytes_still_needed(dest: str | os.PathLike, snap: RepoSnapshot, layout: str = node_download.LAYOUT) -> int:
    """Bytes to download: files absent or of the wrong size under ``dest`` (in ``layout``), less what
    an interrupted run already left in their partials (those bytes are on the disk and will be
    continued)."""
    tree = node_download.tree_dir(layout, str(dest), snap.repo, snap.revision)
    base = node_download.store_dir(layout, str(dest), snap.repo)
    need = 0
    for f in snap.files:
        try:
            if os.stat(os.path.join(tree, f.path)).st_size == f.size:
                continue
        except OSError:
            pass
        kept = node_download.partial_bytes(base, f.sha256) if f.sha256 else 0
        need += f.size - kept if 0 < kept <= f.size else f.size
    return need


def free_space_check(dest: str | os.PathLike, snap: RepoSnapshot, *, margin_bytes: int = 2 * GIB,
                     free_fn: Callable[[str], int] | None = None, node: str = "",
                     layout: str = node_download.LAYOUT) -> Check:
    """PASS if ``dest``'s filesystem has room for what is still to be downloaded (+ margin)."""
    need = bytes_still_needed(dest, snap, layout)
    free = (free_fn or _free_bytes)(str(dest))
    ok = free >= need + margin_bytes
    return check("weights.free_space", ok, node=node,
                 observed=f"{free / GIB:.2f} GiB free at {dest} ({free} B)",
                 expected=f">= {(need + margin_bytes) / GIB:.2f} GiB ({need} B to download of "
                          f"{snap.total_bytes} B total + {margin_bytes} B margin)",
                 fix="free space or point WEIGHTS_DIR at a bigger filesystem",
                 data={"free_bytes": free, "need_bytes": need, "total_bytes": snap.total_bytes,
                       "margin_bytes": margin_bytes})


@dataclass
class DownloadResult:
    path: str                        # the verified tree (hub_cache: the snapshot folder)
    repo: str
    revision: str
    layout: str
    total_bytes: int
    needed_bytes: int
    seconds: float
    verify: dict[str, Any]
    checks: list[Check]
    fetched: list[dict[str, Any]] = field(default_factory=list)   # LFS files fetched resumably this run

    @property
    def ok(self) -> bool:
        return bool(self.verify.get("ok"))


def download(repo: str, revision: str, dest: str | os.PathLike, *, endpoint: str | None = None,
             allow_patterns: Iterable[str] | None = None, ignore_patterns: Iterable[str] | None = None,
             max_workers: int = 8, download_timeout: int = 120, etag_timeout: int = 30,
             margin_bytes: int = 2 * GIB, free_fn: Callable[[str], int] | None = None,
             verify_workers: int = 4, repair: bool = True, progress: bool = True,
             snapshot: RepoSnapshot | None = None, token: str | None = None,
             node: str = "", layout: str = node_download.LAYOUT) -> DownloadResult:
    """Pinned download into ``dest`` (in ``layout``) then verification against Hub metadata.

    Order: pinned-revision check → Hub metadata → free-space check (refuses before any byte is
    downloaded, numbers in the message) → ``node_download.snapshot`` (standard library; bounded ``max_workers``,
    a read timeout of ``download_timeout`` s, cut files continued with Range) → verify (manifest).
    With ``repair``, files that fail verification are deleted and fetched once more (the download
    trusts an existing file of a pinned revision and would not re-fetch it by itself).
    ``token=None`` reads the HF token (:func:`hf_token`: environment, else the secrets file), ``""`` sends none;
    it is registered with the redactor and
    never printed or written.
    """
    require_pinned(revision)
    token = hf_token() if token is None else (token or None)
    if token:
        from ..secrets import register_secret
        register_secret(token)
    snap = snapshot or fetch_metadata(repo, revision, endpoint=endpoint, token=token)
    snap = snap.select(allow_patterns, ignore_patterns)
    checks: list[Check] = []
    space = free_space_check(dest, snap, margin_bytes=margin_bytes, free_fn=free_fn, node=node, layout=layout)
    checks.append(space)
    if space.failed:
        raise ActionError(f"not enough disk space for {repo}@{revision[:12]}", node=node,
                          observed=space.observed, expected=space.expected, fix=space.fix)
    needed = space.data["need_bytes"]
    Path(dest).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    fetched: list[dict[str, Any]] = []
    # the Hub metadata read above, so the fetch does not ask for it again
    files = [f.expected() for f in snap.files]
    tree = node_download.tree_dir(layout, str(dest), repo, revision)
    fetch_args = (repo, revision, dest, endpoint, allow_patterns, ignore_patterns, max_workers,
                  download_timeout, etag_timeout, token, progress, fetched, files, layout)
    _fetch(*fetch_args)
    report = verify_manifest.verify(tree, snap.expected(), workers=verify_workers)
    if not report["ok"] and repair:
        for rel in report["failed"]:
            _forget(dest, rel, layout, repo, revision)
        _fetch(*fetch_args)
        report = verify_manifest.verify(tree, snap.expected(), workers=verify_workers)
    seconds = time.monotonic() - t0
    if fetched:
        checks.append(fetched_check(fetched, node=node))
    checks.extend(verify_checks(report, node=node))
    return DownloadResult(tree, repo, revision, layout, snap.total_bytes, needed,
                          round(seconds, 3), report, checks, fetched)


def fetched_check(fetched: list[dict[str, Any]], *, node: str = "") -> Check:
    """What the resumable fetch did: files fetched, and those continued from an earlier, cut run."""
    resumed = [f for f in fetched if f.get("resumed_from")]
    kept = sum(int(f["resumed_from"]) for f in resumed)
    return check("weights.fetched", True, node=node,
                 observed=(f"{len(fetched)} LFS file(s) fetched; {len(resumed)} continued from an earlier run "
                           f"({kept} B kept)" + "".join(f"; {f['path']} from byte {f['resumed_from']}"
                                                         for f in resumed[:5])),
                 expected="cut transfers continue from their partial (.cache/runbook/partial)",
                 data={"files": len(fetched), "resumed": resumed, "bytes_kept": kept})


def _fetch(repo, revision, dest, endpoint, allow, ignore, max_workers, timeout, etag_timeout,
           token, progress, fetched, files, layout) -> None:
    try:
        node_download.snapshot(repo, revision, str(dest), endpoint=endpoint,
                               allow_patterns=list(allow) if allow else None,
                               ignore_patterns=list(ignore) if ignore else None,
                               max_workers=max_workers, download_timeout=timeout,
                               etag_timeout=etag_timeout, token=token, progress=progress,
                               fetched=fetched, files=files, layout=layout)
    except Exception as err:  # noqa: BLE001
        raise ActionError(f"download of {repo}@{revision[:12]} failed",
                          observed=f"{type(err).__name__}: {_mask(str(err), token)}",
                          expected="the pinned download completes",
                          fix="re-run: finished files are kept and a cut file continues from its partial "
                              "(.cache/runbook/partial in the download dir, or in its models--org--name folder for a hub "
                              "cache); check HF_ENDPOINT, HF_TOKEN, disk") from None


def _forget(dest: str | os.PathLike, rel: str, layout: str = node_download.LAYOUT, repo: str = "",
            revision: str = "") -> None:
    """Delete a bad file and huggingface_hub's record of it so the next run fetches it again
    (hub_cache: the snapshot's link and the blob it points to)."""
    if layout == "local_dir":
        paths = [Path(dest) / rel, Path(dest) / ".cache" / "huggingface" / "download" / f"{rel}.metadata"]
    else:
        link = Path(node_download.tree_dir(layout, str(dest), repo, revision)) / rel
        paths = [link.resolve(), link] if link.is_symlink() else [link]
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def verify_checks(report: dict[str, Any], *, node: str = "") -> list[Check]:
    """Turn a ``verify_manifest`` report into checks: one per failed file, one summary."""
    out = []
    for r in report.get("files", []):
        if r["status"] != "ok":
            out.append(check(f"weights.file:{r['path']}", False, node=node,
                             observed=f"{r['status']}: {r['observed']}", expected=r["expected"],
                             fix="re-run step 02 (python -m runbook run --profile <your profile> --from 02): the download fetches "
                                 "again every file whose bytes are not the pinned revision's"))
    n = len(report.get("files", []))
    out.append(check("weights.verified", bool(report.get("ok")), node=node,
                     observed=(f"{n - len(report.get('failed', []))}/{n} files ok; hashed "
                               f"{report.get('files_hashed', 0)} ({report.get('bytes_hashed', 0)} B) "
                               f"at {report.get('gbps', 0)} GB/s"),
                     expected=f"{n}/{n} files: exact size + sha256 (LFS) / git blob id",
                     fix="see the weights.file:* rows",
                     data={k: report.get(k) for k in ("bytes_hashed", "files_hashed", "seconds",
                                                       "gbps", "revision", "failed")}))
    return out


def _mask(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text
