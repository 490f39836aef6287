"""Getting the verified weights onto the worker: ``rsync`` | ``download-both`` | ``nfs``, then parity.

Everything on a node goes through the remote layer (``node.read``/``node.run``/``node.put``); the
download and the verification on a node are ``node_download.py`` and ``verify_manifest.py`` (standard
library only, the same code that runs locally), shipped into the node's private tools dir
(``~/.cache/spark-runbook/tools``, 0700, owner checked) and run with the node's own ``python3``. JIT/compile caches stay node-local (``cache_dir_is_local``).
Every node path may be written ``~/…``: it is expanded with that node's own home
(``node_paths.on_node``) before it goes into a command, so commands only ever carry absolute paths.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import secrets
import shlex
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import progress
from ..checks import Check, Status, check, not_applicable
from ..errors import RemoteError
from ..remote import private_dir_command, tail
from ..weights_tools import node_download, stream_share, verify_manifest
from ..weights_tools.nfs import (SUDO_RULES, export_line, exports_file, render_nfs, sudo_argvs, sudo_check, sudo_probe_cmd,
                                 sudoers_fix)
from .download import fetched_check, hf_token, require_pinned, verify_checks
from ..facts.node_paths import node_user, on_node
from .verify import manifest_to_expected, parity
from ..weights_tools.verify_manifest import MANIFEST_NAME

GIB_B = 1 << 30
TOOLS_SUBDIR = ".cache/spark-runbook/tools"      # under the SSH user's home: private (0700), never /tmp


@dataclass
class ShareResult:
    mode: str
    checks: list[Check] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)


def _q(value: Any) -> str:
    return shlex.quote(str(value))


# -------------------------------------------------------------------------------------------
# shipping the verifier / downloader and reading manifests on a node

def tools_dir(node) -> str:
    """The node's private tools directory, ``~/.cache/spark-runbook/tools`` (that node's home)."""
    return posixpath.join(node_user(node).home, TOOLS_SUBDIR)


def ship_tools(node, remote_dir: str | None = None, *, extra: tuple = ()) -> dict[str, str]:
    """Copy the standard-library tools (``verify_manifest.py``, ``node_download.py``; ``extra`` modules too, e.g.
    ``stream_share`` for WEIGHT_TRANSPORT=stream) into the node's private tools dir (:func:`tools_dir`, made private
    by :func:`runbook.remote.private_dir_command`); they run with the node's ``python3`` and import no package of it. Returns remote paths (``dir``: the directory)."""
    remote_dir = remote_dir or tools_dir(node)
    node.run(private_dir_command(remote_dir), timeout=30)
    out = {"dir": remote_dir}
    for mod in (verify_manifest, node_download, *extra):
        name = Path(mod.__file__).name
        remote = posixpath.join(remote_dir, name)
        node.put(mod.__file__, remote)
        out[mod.__name__.rsplit(".", 1)[-1]] = remote
    return out


_SHIPPED_LOCK = threading.Lock()


def ship_tools_once(node) -> dict[str, str]:
    """:func:`ship_tools` (with ``stream_share``) for a node that several shares use at once (the head of a stream
    share to every worker): shipped by the first, under a lock, and not again while this node object lives, so no
    share overwrites a script another share's command is starting from."""
    with _SHIPPED_LOCK:
        shipped = getattr(node, "_runbook_shipped_tools", None)
        if shipped is None or node.dry_run:
            shipped = ship_tools(node, extra=(stream_share,))
            node._runbook_shipped_tools = shipped
        return shipped


def _json_name(prefix: str, node, data: Any) -> str:
    """A name for ``data`` shipped as JSON to ``node``: from the node and the content, so one run's commands are
    the same every time (the offline review compares them byte for byte) and two nodes sharing a filesystem (the
    lab) never share one."""
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]
    return f"{prefix}-{node.name}-{digest}"


def _put_json(node, data: dict[str, Any], remote: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(data, fh)
        local = fh.name
    try:
        node.put(local, remote)
    finally:
        os.unlink(local)


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def verify_on_node(node, directory: str, expected: dict[str, Any], *, python: str = "python3",
                   workers: int = 4, reuse: bool = True, write: bool = True,
                   remote_dir: str | None = None, timeout: float = 4 * 3600) -> dict[str, Any]:
    """Run ``verify_manifest.py`` on ``node`` against ``expected``; return its JSON report."""
    directory = on_node(node, directory)
    tools = ship_tools(node, remote_dir)
    exp_remote = posixpath.join(tools["dir"], _json_name("expected", node, expected) + ".json")
    _put_json(node, expected, exp_remote)
    cmd = (f"{python} {_q(tools['verify_manifest'])} --dir {_q(directory)} --expected {_q(exp_remote)}"
           f" --workers {int(workers)}" + ("" if reuse else " --no-reuse") + ("" if write else " --no-write"))
    try:
        res = node.run(cmd, timeout=timeout, warn=True)
    finally:
        node.run(f"rm -f {_q(exp_remote)}", timeout=30, warn=True)
    if res.dry_run:
        return {"ok": True, "dry_run": True, "files": [], "failed": [], "command": cmd}
    report = _last_json(res.stdout)
    if report is None or res.exit_code not in (0, 1) or "files" not in report:
        raise RemoteError("weights verification could not run", node=node.name,
                          observed=f"exit {res.exit_code}: {(res.stdout or '')[-300:]} {(res.stderr or '')[-300:]}",
                          expected="a JSON report (exit 0 or 1)",
                          fix=f"check {python} exists on the node and {directory} is readable")
    return report


def read_node_manifest(node, directory: str) -> dict[str, Any] | None:
    res = node.read(f"cat {_q(posixpath.join(on_node(node, directory), MANIFEST_NAME))}", timeout=30)
    if not res.ok:
        return None
    try:
        return json.loads(res.stdout)
    except ValueError:
        return None


# -------------------------------------------------------------------------------------------
# rsync

# a logged-in user's Hugging Face token files and netrc never leave the node they are on
CREDENTIAL_FILES = ("token", "stored_tokens", ".netrc", ".git-credentials")
# where rsync keeps a cut file, beside its final name (relative: rsync excludes it from the transfer itself)
PARTIAL_DIR = ".rsync-partial"
# rsync's ssh asks for AES-GCM first (the CPU's AES instructions) before ssh's own first choice, ChaCha20: the share
# is CPU-bound on the ssh and rsync processes, and AES-GCM cut the CPU per GiB by a fifth (docs/weights.md §4b)
RSYNC_SSH = ("ssh -o BatchMode=yes -o StrictHostKeyChecking=yes "
             "-c aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com")


def render_rsync(src_dir: str, dst_dir: str, target: str, *, ssh: str = RSYNC_SSH) -> str:
    """rsync head→worker over the fabric address: whole files (no delta CPU), symlinks as symlinks (a hub
    cache's ``snapshots/<rev>/*`` point into ``blobs/``). A file being written is rsync's hidden temp until it is
    complete, then renamed; a cut one is kept in ``PARTIAL_DIR`` beside it, never under its final name (``--partial``
    left the half file there, where a reader could take it for the weights). A re-run skips the finished files and
    sends the cut one again. Manifests are never copied (at any depth: a hub cache keeps its manifest in
    ``snapshots/<rev>``), so the worker must hash its own bytes. ``target`` is ``user@<WORKER_IP>`` (the fabric
    address, never the management one)."""
    credentials = " ".join(f"--exclude={_q(name)}" for name in CREDENTIAL_FILES)
    return (f"rsync -a --whole-file --partial-dir={PARTIAL_DIR} --info=progress2,stats1 --mkpath "
            f"--exclude=/.cache/ --exclude={_q(MANIFEST_NAME)} --exclude={_q('.' + MANIFEST_NAME + '.*')} "
            f"{credentials} -e {_q(ssh)} {_q(src_dir.rstrip('/') + '/')} {_q(target + ':' + dst_dir.rstrip('/') + '/')}")


def _copy_ends(head, worker, src_dir: str, dst_dir: str, tree: str, head_manifest: dict[str, Any] | None,
               result: ShareResult) -> tuple[str, str, str, str, dict[str, Any] | None]:
    """What a copy to a worker (rsync or stream) starts from: both directories and trees as each node sees them,
    and the head's manifest (read from the head when not given); without one, a FAIL row on ``result``."""
    src_dir, dst_dir = on_node(head, src_dir), on_node(worker, dst_dir)
    src_tree, dst_tree = posixpath.join(src_dir, tree), posixpath.join(dst_dir, tree)
    head_manifest = head_manifest or read_node_manifest(head, src_tree)
    if not head_manifest:
        result.checks.append(check("weights.head_manifest", False, node=head.name,
                                   observed=f"no {MANIFEST_NAME} in {src_tree}",
                                   expected="a verified head tree", fix="run the download/verify on the head first"))
    return src_dir, dst_dir, src_tree, dst_tree, head_manifest


def rsync_to_worker(head, worker, src_dir: str, dst_dir: str, *, target: str | None = None,
                    ssh: str = RSYNC_SSH, head_manifest: dict[str, Any] | None = None, python: str = "python3",
                    workers: int = 4, timeout: float = 6 * 3600, tree: str = "") -> ShareResult:
    """Copy the head's verified directory to the worker, verify there by the head manifest, check
    parity. ``tree``: where the verified files sit inside the copied directory (a hub cache:
    ``snapshots/<rev>``)."""
    result = ShareResult("rsync")
    src_dir, dst_dir, src_tree, dst_tree, head_manifest = _copy_ends(head, worker, src_dir, dst_dir, tree,
                                                                     head_manifest, result)
    if not head_manifest:
        return result
    # as the SSH user the runbook logs in with on the worker (root there only when the profile says so)
    target = target or f"{node_user(worker).name}@{worker.spec.fabric_ip}"
    cmd = render_rsync(src_dir, dst_dir, target, ssh=ssh)
    total = sum(f["size"] for f in head_manifest.get("files", []))
    t0 = time.monotonic()
    # its --info=progress2 lines count the bytes (runbook.progress); a file already there ends the count early
    with progress.from_tool(f"{worker.name} weights copy", total, progress.RSYNC_BYTES,
                            dry_run=head.dry_run) as (bar, lines):
        res = head.run(cmd, timeout=timeout, warn=True, lines=lines)
        if res.ok:
            bar.update(total)
    seconds = time.monotonic() - t0
    result.data.update(command=cmd, seconds=round(seconds, 2), bytes=total, src=src_dir, dst=dst_dir)
    rate = f"({total / max(seconds, 1e-9) / 1e9:.2f} GB/s incl. skipped files)"
    log = "" if res.ok else tail(res.stderr or res.stdout, 5)
    result.checks.append(check("weights.rsync", res.ok, node=worker.name,
                               observed=f"{head.name} -> {worker.name} ({target}): exit {res.exit_code} in "
                                        f"{seconds:.1f} s " + (rate if res.ok else f"; rsync said: {log}"),
                               expected="exit 0", fix="see the rsync output in commands.jsonl; a re-run sends only "
                                                     "the files not yet complete on the worker",
                               data=dict(result.data)))
    if not res.ok or res.dry_run:
        return result
    report = verify_on_node(worker, dst_tree, manifest_to_expected(head_manifest), python=python,
                            workers=workers)
    result.checks.extend(verify_checks(report, node=worker.name))
    result.checks.append(parity(head_manifest, read_node_manifest(worker, dst_tree), node=worker.name))
    result.data["verify"] = {k: report.get(k) for k in ("bytes_hashed", "seconds", "gbps", "failed")}
    return result


# -------------------------------------------------------------------------------------------
# stream (WEIGHT_TRANSPORT=stream): sendfile on the head, splice on the worker, plain TCP on the fabric

STREAM_STREAMS = 4          # TCP connections per worker
STREAM_TIMEOUT = 60.0       # seconds without progress on a connection, or without a connection, before giving up
STREAM_READY_S = 60.0       # for the receiver to listen and say which files it needs


def _put_private_text(node, remote: str, text: str) -> None:
    """``text`` into a new 0600 file on the node (created empty with umask 077 first, then filled by ``put``):
    never on a command line, never in the command log."""
    node.run(f"umask 077 && : > {_q(remote)} && chmod 600 {_q(remote)}", timeout=30)
    fd, local = tempfile.mkstemp()
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        node.put(local, remote)
    finally:
        os.unlink(local)


def render_stream_recv(tool: str, dst: str, expected: str, bind: str, *, token_file: str, state_file: str,
                       stop_file: str, python: str = "python3", timeout: float = STREAM_TIMEOUT,
                       deadline: float = 6 * 3600) -> str:
    return " ".join(_q(p) for p in [python, tool, "recv", "--dir", dst, "--expected", expected, "--bind", bind,
                                    "--port", 0, "--token-file", token_file, "--state-file", state_file,
                                    "--stop-file", stop_file, "--timeout", f"{timeout:g}", "--deadline",
                                    f"{deadline:g}"])


def render_stream_send(tool: str, src: str, files: str, host: str, port: int, *, token_file: str, bind: str = "",
                       python: str = "python3", streams: int = STREAM_STREAMS,
                       timeout: float = STREAM_TIMEOUT) -> str:
    """The head's sender. No ``--bind`` by default: the kernel picks the source address of the route to the worker's
    fabric address, as rsync's ssh does (on the TP=3 triangle each worker is reached over its own link)."""
    return " ".join(_q(p) for p in [python, tool, "send", "--src", src, "--files", files, "--host", host,
                                    "--port", int(port), *(["--bind", bind] if bind else []),
                                    "--token-file", token_file, "--streams", int(streams),
                                    "--timeout", f"{timeout:g}"])


def stream_to_worker(head, worker, src_dir: str, dst_dir: str, *, head_manifest: dict[str, Any] | None = None,
                     python: str = "python3", workers: int = 4, streams: int = STREAM_STREAMS,
                     timeout: float = STREAM_TIMEOUT, deadline: float = 6 * 3600, tree: str = "",
                     ready_s: float = STREAM_READY_S) -> ShareResult:
    """The head's verified files to the worker over plain TCP on the fabric (``stream_share.py``, shipped to both
    nodes): the worker's receiver listens on its fabric address (a free port), skips the files it already holds
    verified, and takes ``streams`` connections from the head's sender, which must present a one-time random token
    (a 0600 file on each node, never on a command line). Each file is sha256-verified on arrival before it gets its
    name; then the worker's directory is verified (the manifest) and compared with the head's (parity). Only the
    files of the head manifest cross (never a credential file or a cache). ``tree``: where the verified files sit
    inside the directory (only ``""``: a hub cache's symlinks need rsync, the profile refuses the pair)."""
    result = ShareResult("stream")
    src_dir, dst_dir, src_tree, dst_tree, head_manifest = _copy_ends(head, worker, src_dir, dst_dir, tree,
                                                                     head_manifest, result)
    if not head_manifest:
        return result
    expected = manifest_to_expected(head_manifest)
    total = sum(f["size"] for f in expected["files"])
    head_tools, worker_tools = ship_tools_once(head), ship_tools(worker, extra=(stream_share,))
    key = _json_name("stream", worker, expected)
    w = {k: posixpath.join(worker_tools["dir"], f"{key}.{k}") for k in ("expected", "token", "state", "stop")}
    h = {k: posixpath.join(head_tools["dir"], f"{key}.{k}") for k in ("files", "token")}
    token = secrets.token_hex(32)
    recv_cmd = render_stream_recv(worker_tools["stream_share"], dst_tree, w["expected"], worker.spec.fabric_ip,
                                  token_file=w["token"], state_file=w["state"], stop_file=w["stop"], python=python,
                                  timeout=timeout, deadline=deadline)
    result.data.update(src=src_dir, dst=dst_dir, bytes=total, streams=streams, receiver=recv_cmd)
    got: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        worker.run(f"rm -f {_q(w['state'])} {_q(w['stop'])}", timeout=30)
        _put_json(worker, expected, w["expected"])
        if not worker.dry_run:
            _put_private_text(worker, w["token"], token)
            _put_private_text(head, h["token"], token)
        receiver = threading.Thread(target=lambda: got.update(recv=worker.run(recv_cmd, timeout=deadline + 120,
                                                                              warn=True)), daemon=True)
        receiver.start()
        state = None
        until = time.monotonic() + ready_s
        while not worker.dry_run and time.monotonic() < until:
            alive = receiver.is_alive()              # read before the state: a receiver with nothing to take exits
            res = worker.read(f"cat {_q(w['state'])} 2>/dev/null", timeout=30)
            state = _last_json(res.stdout) if res.ok else None
            if state or not alive:
                break
            time.sleep(0.2)
        if not state and not worker.dry_run:
            # it never listened (exited, or still not up): its own words, e.g. the address is not the worker's
            worker.run(f"touch {_q(w['stop'])}", timeout=30, warn=True)
            receiver.join(timeout + 10)              # it sees the stop file within a second
            res = got.get("recv")
            said = (_last_json(res.stdout) or {}).get("error") if res else None
            said = said or (tail((res.stderr or res.stdout) if res else "", 3) or "no answer")
            result.checks.append(check("weights.stream", False, node=worker.name,
                                       observed=f"the receiver on {worker.name} did not listen within {ready_s:g} s: "
                                                f"{said}",
                                       expected=f"listening on {worker.spec.fabric_ip} (the fabric address)",
                                       fix=f"check {python} on {worker.name} (>= 3.8), that {worker.spec.fabric_ip} "
                                           f"is its address and that {dst_tree} can be written"))
            return result
        need = [f for f in expected["files"] if state and f["path"] in set(state.get("need", []))]
        if worker.dry_run:
            need = expected["files"]
        if need:
            _put_json(head, {"files": need}, h["files"])
            send_cmd = render_stream_send(head_tools["stream_share"], src_tree, h["files"], worker.spec.fabric_ip,
                                          (state or {}).get("port", 0), token_file=h["token"],
                                          python=python, streams=streams, timeout=timeout)
            result.data["command"] = send_cmd
            with progress.from_tool(f"{worker.name} weights stream", total, progress.RSYNC_BYTES,
                                    dry_run=head.dry_run) as (bar, _lines):
                sent = head.run(send_cmd, timeout=deadline, warn=True)
                if sent.ok:
                    bar.update(total)
            got["send"] = sent
            if not sent.ok:
                worker.run(f"touch {_q(w['stop'])}", timeout=30, warn=True)
        receiver.join(deadline + 180)
    finally:
        head.run(f"rm -f {_q(h['token'])} {_q(h['files'])}", timeout=30, warn=True)
        worker.run(f"rm -f {_q(w['token'])} {_q(w['expected'])} {_q(w['state'])} {_q(w['stop'])}",
                   timeout=30, warn=True)
    seconds = time.monotonic() - t0
    if worker.dry_run:
        result.checks.append(not_applicable("weights.stream", "dry run: the receiver's and the sender's commands are "
                                            "recorded, nothing is sent", node=worker.name,
                                            expected="every file of the head manifest on the worker, "
                                                     "sha256-verified on arrival"))
        return result
    recv = _last_json(got["recv"].stdout if got.get("recv") else "") or {}
    send = _last_json(got["send"].stdout) if got.get("send") else {"ok": True, "bytes": 0, "seconds": 0}
    send = send or {"ok": False, "errors": [tail(got["send"].stderr or got["send"].stdout, 3)]}
    moved = int(send.get("bytes") or 0)
    secs = float(send.get("seconds") or 0)
    result.data.update(seconds=round(seconds, 2), send_seconds=secs, sent_bytes=moved,
                       received=recv.get("received", []), skipped=recv.get("skipped", []),
                       gbit_s=round(moved * 8 / secs / 1e9, 3) if secs else None)
    ok = bool(recv.get("ok")) and bool(send.get("ok"))
    if ok:
        observed = (f"{head.name} -> {worker.name} ({worker.spec.fabric_ip}): {len(recv.get('received', []))} files, "
                    f"{moved / GIB_B:.2f} GiB in {secs:.1f} s"
                    + (f" ({moved * 8 / secs / 1e9:.2f} Gb/s, {send.get('streams')} streams)" if secs else "")
                    + (f"; {len(recv.get('skipped', []))} already verified there, kept" if recv.get("skipped") else ""))
    else:
        why = [f"{p}: {r}" for p, r in (recv.get("failed") or {}).items()][:4]
        why += (send.get("errors") or [])[:2] + (recv.get("errors") or [])[:2]
        if recv.get("stopped"):
            why.append(recv["stopped"])
        if not recv:
            res = got.get("recv")
            why.append(f"receiver exit {res.exit_code if res else '?'}: "
                       f"{tail((res.stderr or res.stdout) if res else '', 3)}")
        if recv.get("refused_connections"):
            why.append(f"{recv['refused_connections']} connection(s) with a wrong token refused")
        observed = f"{head.name} -> {worker.name}: " + "; ".join(str(x) for x in why)
    result.checks.append(check("weights.stream", ok, node=worker.name, observed=observed,
                               expected="every file of the head manifest on the worker, sha256-verified on arrival",
                               fix="a re-run sends only the files not yet verified on the worker; check that the "
                                   "head reaches the worker's fabric address on a TCP port above 1024 "
                                   "(WEIGHT_TRANSPORT=rsync uses ssh instead)",
                               data=dict(result.data)))
    if not ok:
        return result
    report = verify_on_node(worker, dst_tree, expected, python=python, workers=workers)
    result.checks.extend(verify_checks(report, node=worker.name))
    result.checks.append(parity(head_manifest, read_node_manifest(worker, dst_tree), node=worker.name))
    result.data["verify"] = {k: report.get(k) for k in ("bytes_hashed", "seconds", "gbps", "failed")}
    return result


# -------------------------------------------------------------------------------------------
# download-both

def render_node_download(tool: str, repo: str, revision: str, dest: str, *, python: str = "python3",
                         endpoint: str | None = None, allow: Iterable[str] = (), ignore: Iterable[str] = (),
                         max_workers: int = 8, timeout: int = 120, token_file: str = "", files: str = "",
                         layout: str = node_download.LAYOUT, label: str = "") -> str:
    parts = [python, tool, "--repo", repo, "--revision", require_pinned(revision), "--dest", dest,
             "--layout", layout, "--max-workers", int(max_workers), "--timeout", int(timeout), "--no-progress"]
    if label:                   # the bytes counted on stderr (runbook.progress's form), relayed by download_on_node
        parts += ["--label", label]
    if endpoint:
        parts += ["--endpoint", endpoint]
    if files:
        parts += ["--files", files]
    for p in allow:
        parts += ["--allow", p]
    for p in ignore:
        parts += ["--ignore", p]
    if token_file:
        parts += ["--token-file", token_file]
    return " ".join(_q(p) for p in parts)


def download_on_node(node, repo: str, revision: str, dest: str, *, expected: dict[str, Any],
                     endpoint: str | None = None, python: str = "python3", allow: Iterable[str] = (),
                     ignore: Iterable[str] = (), max_workers: int = 8, timeout: int = 120,
                     token: str | None = None, verify_workers: int = 4,
                     run_timeout: float = 12 * 3600, layout: str = node_download.LAYOUT,
                     label: str = "weights download") -> ShareResult:
    """The node downloads the pinned revision itself (from ``endpoint``) into ``dest`` in ``layout``
    and verifies it (``data["tree"]``: the verified directory on the node).

    ``python``: the node's ``python3`` (>= 3.8; the shipped downloader and verifier use the standard
    library only, so no ``huggingface_hub`` or other package is needed there). The files to fetch are
    ``expected`` (the Hub metadata read here), shipped as JSON next to the tools. The token, if any, goes
    to a 0600 file in the node's private tools dir (never on the command line) and is removed afterwards.
    The bytes are counted through ``runbook.progress`` as ``<node> <label>``.
    """
    result = ShareResult("download-both")
    dest = on_node(node, dest)
    tree = node_download.tree_dir(layout, dest, repo, revision)
    tools = ship_tools(node)
    files_name = _json_name("files", node, expected)
    files_remote = posixpath.join(tools["dir"], files_name + ".json")
    _put_json(node, expected, files_remote)
    token = hf_token() if token is None else (token or None)     # "": none (a foreign HF_ENDPOINT)
    token_file = ""
    if token:
        token_file = posixpath.join(tools["dir"], f".tok-{files_name}")
        node.run(f"umask 077 && : > {_q(token_file)} && chmod 600 {_q(token_file)}", timeout=30)
        fd, local = tempfile.mkstemp()
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(token)
            node.put(local, token_file)
        finally:
            os.unlink(local)
    cmd = render_node_download(tools["node_download"], repo, revision, dest, python=python,
                               endpoint=endpoint, allow=allow, ignore=ignore, max_workers=max_workers,
                               timeout=timeout, token_file=token_file, files=files_remote, layout=layout,
                               label=label)
    t0 = time.monotonic()
    try:
        with progress.relay(f"{node.name} ", quiet=True) as counted:      # its JSON line stays in the result
            res = node.run(cmd, timeout=run_timeout, warn=True, lines=counted)
    finally:
        node.run(f"rm -f {_q(files_remote)}" + (f" {_q(token_file)}" if token_file else ""), timeout=30, warn=True)
    seconds = time.monotonic() - t0
    out = _last_json(res.stdout) or {}
    result.data.update(command=cmd, seconds=round(seconds, 2), dest=dest, tree=tree, layout=layout)
    ok = res.ok and bool(out.get("ok")) or res.dry_run
    result.checks.append(check("weights.download", ok, node=node.name,
                               observed=f"exit {res.exit_code} in {seconds:.1f} s {out.get('error', '')}".strip(),
                               expected="the pinned download completes (node_download.py, standard library)",
                               fix="check HF_ENDPOINT (and HF_TOKEN for a gated repo) from the node; re-run keeps "
                                   "finished files and continues a cut one from its partial"))
    if not ok or res.dry_run:
        return result
    if out.get("resumable"):
        result.checks.append(fetched_check(out["resumable"], node=node.name))
    report = verify_on_node(node, tree, expected, python=python, workers=verify_workers)
    result.checks.extend(verify_checks(report, node=node.name))
    result.data["verify"] = {k: report.get(k) for k in ("bytes_hashed", "seconds", "gbps", "failed")}
    return result


# -------------------------------------------------------------------------------------------
# NFS (the rendered commands and sudo rules: ``weights_tools/nfs.py``)

def nfs_share(head, worker, export_dir: str, mountpoint: str, *, execute: bool,
              head_manifest: dict[str, Any] | None = None, python: str = "python3",
              workers: int = 4, reason: str = "", name: str = "weights", tree: str = "",
              probe: str = "config.json", worker_ips: list[str] | None = None) -> ShareResult:
    """Render (and with ``execute`` run) the kernel NFS mode for one directory. Paths are expanded on
    their own node (``~`` = that node's home); commands that need root get ``sudo -n`` when the SSH
    user is not root, and sudo is proven to work before anything changes. ``tree``: where the
    verified files sit in the export (hub cache: ``snapshots/<rev>``). Without ``execute`` (a kernel
    with no nfsd / nfs4 client) the commands are rendered and reported N/A — never as a pass. ``worker_ips``:
    every worker's fabric address (the export lists them all; default: this worker's alone)."""
    export_dir, mountpoint = on_node(head, export_dir), on_node(worker, mountpoint)
    head_sudo = execute and not node_user(head).is_root
    worker_sudo = execute and not node_user(worker).is_root
    cmds = render_nfs(export_dir, head.spec.fabric_ip, worker.spec.fabric_ip, mountpoint, name=name,
                      head_sudo=head_sudo, worker_sudo=worker_sudo, probe=probe,
                      export_to=worker_ips or [worker.spec.fabric_ip])
    result = ShareResult("nfs", data={"commands": cmds, "executed": execute, "export": export_dir,
                                      "mountpoint": mountpoint})
    if not execute:
        result.checks.append(not_applicable(
            "weights.nfs", reason or "rendered, not run (no kernel NFS server/client here)",
            node="cluster", expected="export ro to every worker's *_IP only; mount nfs4.2 nconnect=8 hard"))
        return result
    refused = [c for c in (sudo_check(head, cmds["head"]), sudo_check(worker, cmds["worker"])) if c]
    result.checks.extend(refused)
    # a dry run (the offline review among them) records the commands it would run even past a refused sudo
    # probe, so a reviewer sees the whole share; a real run stops here, before anything changes
    if refused and not (head.dry_run and worker.dry_run):
        return result
    for cmd in cmds["head"]:
        head.run(cmd, timeout=60)
    for cmd in cmds["worker"]:
        worker.run(cmd, timeout=120)
    head_manifest = head_manifest or read_node_manifest(head, posixpath.join(export_dir, tree))
    if head_manifest:
        report = verify_on_node(worker, posixpath.join(mountpoint, tree), manifest_to_expected(head_manifest),
                                python=python, workers=workers, reuse=False, write=False)
        result.checks.extend(verify_checks(report, node=worker.name))
    return result


def sudo_allowed_row(node, commands: list[str]) -> Check:
    """``weights.nfs.sudo`` for one node: a FAIL naming the first command sudo refuses (:func:`sudo_check`), or a
    PASS saying what was proven (every ``sudo -n`` command of ``commands`` allowed, or root: none needed)."""
    refused = sudo_check(node, commands)
    if refused is not None:
        return refused
    user = node_user(node)
    argvs = sudo_argvs(commands)
    return check("weights.nfs.sudo", True, node=node.name,
                 observed=(f"`sudo -n -l` allows each of the {len(argvs)} commands that need root, as {user.name}"
                           if argvs else f"the SSH user is {user.name}: no sudo needed"),
                 expected="every command that needs root allowed by sudo without a password (or root)",
                 data={"user": user.name, "sudo": [" ".join(a) for a in argvs]})


def exported_clients(listing: str, export_dir: str) -> dict[str, list[str]]:
    """Every client of ``export_dir`` in ``exportfs -v`` output (one line per client; a long path puts the client
    on the next line) -> {address: options, in exportfs's order}.

    >>> exported_clients("/srv/m \\t10.0.0.2(sync,ro,root_squash)\\n/srv/m \\n\\t\\t10.0.0.3(sync,rw)\\n", "/srv/m")
    {'10.0.0.2': ['sync', 'ro', 'root_squash'], '10.0.0.3': ['sync', 'rw']}
    """
    tokens = (listing or "").split()
    out: dict[str, list[str]] = {}
    for i, token in enumerate(tokens[:-1]):
        if token == export_dir:
            client, _, opts = tokens[i + 1].partition("(")
            out[client] = [o for o in opts.rstrip(")").split(",") if o]
    return out


def _last(res) -> str:
    """The last line a command said (stderr first), for a row."""
    lines = (res.stderr or res.stdout or "").strip().splitlines()
    return lines[-1][-200:] if lines else "no output"


def kernel_nfs_until_server(head, worker, export_dir: str, mountpoint: str, *, name: str = "weights",
                            probe: str = "config.json", worker_ips: list[str] | None = None) -> list[Check]:
    """Where nfsd and the kernel's NFS client cannot run (the lab), the kernel NFS mode up to them, for real and
    as the profile's SSH user: the sudo probe on both nodes (stops here on a refusal), the exports file written
    with the rendered line (``sudo -n tee`` for a non-root user) and read back, ``exportfs -ra`` and
    ``exportfs -v`` on the head, the mount point made on the worker. The server and the mount rows say N/A
    with what the node answered, never PASS. ``worker_ips``: every worker's fabric address, all of which the
    export must list (default: this worker's alone)."""
    head_sudo, worker_sudo = not node_user(head).is_root, not node_user(worker).is_root
    clients = worker_ips or [worker.spec.fabric_ip]
    cmds = render_nfs(export_dir, head.spec.fabric_ip, worker.spec.fabric_ip, mountpoint, name=name,
                      head_sudo=head_sudo, worker_sudo=worker_sudo, probe=probe, export_to=clients)
    rows = [sudo_allowed_row(head, cmds["head"]), sudo_allowed_row(worker, cmds["worker"])]
    if any(r.failed for r in rows):
        return rows
    mkdir, tee, exportfs_ra, exportfs_v, rpcinfo = cmds["head"]
    exports = exports_file(name)
    wrote = head.run(f"{mkdir} && {tee}", timeout=60, warn=True)
    line = export_line(export_dir, clients)
    back = head.read(f"cat {_q(exports)}", timeout=20)
    rows.append(check("weights.nfs.exports", wrote.ok and back.stdout.strip() == line, node=head.name,
                      observed=(f"{exports}: {back.stdout.strip()}" if wrote.ok and back.ok else
                                f"exit {wrote.exit_code}: {(wrote.stderr or wrote.stdout).strip()[-300:]}"),
                      expected=f"{exports} holds exactly: {line}",
                      fix=f"check the sudo rule for tee {exports} on {head.name}"))
    ra = head.run(exportfs_ra, timeout=60, warn=True)
    listed = head.read(exportfs_v.split(" | ")[0], timeout=30)      # the export table exportfs keeps (etab)
    listed_clients = exported_clients(listed.stdout, export_dir)
    missing = [ip for ip in clients if not {"ro", "root_squash"} <= set(listed_clients.get(ip, ()))]
    extra = sorted(set(listed_clients) - set(clients))
    shown = ", ".join(f"{ip}({','.join(o)})" for ip, o in listed_clients.items()) or "not listed"
    rows.append(check("weights.nfs.exportfs", ra.ok and not missing and not extra, node=head.name,
                      observed=(f"`{exportfs_ra}` exit {ra.exit_code}" + ("" if ra.ok else f": {_last(ra)}")
                                + f"; `exportfs -v`: {export_dir} {shown}"
                                + (f"; not exported ro,root_squash to {', '.join(missing)}" if missing else "")
                                + (f"; also exported to {', '.join(extra)}" if extra else "")),
                      expected=(f"exportfs takes the exports file: {export_dir} to {', '.join(clients)} (every "
                                "worker, nobody else), ro, root_squash"),
                      fix=f"read {exports} and exportfs's message on {head.name}"))
    server = head.read(rpcinfo, timeout=30)
    rows.append(not_applicable(
        "weights.nfs.kernel_server", f"the lab kernel has no nfsd: `{rpcinfo}` exit {server.exit_code}: "
        f"{_last(server)}; the userspace server stands in", node=head.name,
        expected="rpcinfo finds nfs 4 on HEAD_IP (nfsd serving the export)"))
    made = worker.run(cmds["worker"][0], timeout=60, warn=True)
    rows.append(check("weights.nfs.mountpoint", made.ok, node=worker.name,
                      observed=f"{mountpoint} made as {node_user(worker).name}" if made.ok
                      else f"exit {made.exit_code}: {(made.stderr or made.stdout).strip()[-300:]}",
                      expected="the mount point exists on the worker",
                      fix=f"check the sudo rule for mkdir on {worker.name}"))
    return rows


# -------------------------------------------------------------------------------------------
# node-local caches

def cache_dir_is_local(cache_dir: str, shared_dirs: Iterable[str], *, node: str = "") -> Check:
    """JIT/compile caches (CACHE_DIR) must not live inside a shared/NFS weights tree: both ranks
    compiling into one cache fails in confusing ways (tonyd2wild#27)."""
    cache = os.path.normpath(cache_dir)
    inside = [d for d in shared_dirs if d and (cache == os.path.normpath(d)
                                               or cache.startswith(os.path.normpath(d) + os.sep))]
    return check("weights.cache_local", not inside, node=node,
                 observed=f"CACHE_DIR={cache_dir}" + (f" is inside {inside[0]}" if inside else ""),
                 expected="CACHE_DIR outside every shared weights directory",
                 fix="set CACHE_DIR to a node-local path (e.g. ~/.cache/spark-runbook)")


__all__ = [
    "ShareResult",
    "Status",
    "cache_dir_is_local",
    "download_on_node",
    "nfs_share",
    "parity",
    "read_node_manifest",
    "render_nfs",
    "render_node_download",
    "render_rsync",
    "rsync_to_worker",
    "ship_tools",
    "tools_dir",
    "sudo_check",
    "sudo_argvs",
    "sudo_probe_cmd",
    "sudoers_fix",
    "SUDO_RULES",
    "verify_on_node",
]
