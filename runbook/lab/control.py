"""Glue between a profile and the lab: the nodes, the tiny model, the lab's Hub endpoint and a rehearsal's image
in the lab registry.

The lab stands in for what cannot exist here. Its Hub endpoint is a clearly labelled fixture: the
real huggingface_hub client downloads from it exactly as it would from the Hub. Its registry is Debian's
Distribution registry: the nodes' dockerd pull a rehearsal's image from it as they would from ghcr.io.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from ..errors import LabError
from ..evidence import REPO_ROOT
from ..api.server_info import ApiClient, ServerInfo
from ..remote import quote
from . import hub, oci

LAB_DIR = REPO_ROOT / ".lab"
VLLM_PYTHON = LAB_DIR / "vllm-venv" / "bin" / "python"
TINY_MODEL_DIR = LAB_DIR / "models" / "tiny"
HUB_ROOT = LAB_DIR / "hub"
HUB_PID = LAB_DIR / "hub.pid"
HUB_LOG = LAB_DIR / "hub.log"
TINY_MODULE = "runbook.lab.tinymodel"
#: lab Hub repo -> (module that makes it, local model dir); the default is the 2-node tiny model
TINY_VARIANTS = {
    "spark-runbook/tiny-tp3": ("runbook.lab.tinymodel_tp3", LAB_DIR / "models" / "tiny-tp3"),   # TP=3 shapes
    "spark-runbook/tiny-tp4": ("runbook.lab.tinymodel_tp4", LAB_DIR / "models" / "tiny-tp4"),   # TP=4, TP2 x PP2
}
#: tensor-parallel size -> the tiny model a rehearsal publishes under the recipe's repo id (default: 2-node)
TINY_BY_TP = {3: TINY_VARIANTS["spark-runbook/tiny-tp3"], 4: TINY_VARIANTS["spark-runbook/tiny-tp4"]}


def tiny_for_tp(tp: int) -> tuple[str, Path]:
    """(module that makes it, local model dir) of the stand-in shaped for this tensor-parallel size."""
    return TINY_BY_TP.get(tp, (TINY_MODULE, TINY_MODEL_DIR))


def tiny_variant(repo_id: str) -> tuple[str, Path]:
    """(module that makes it, local model dir) of a lab Hub repo; the default is the 2-node tiny model."""
    return TINY_VARIANTS.get(repo_id, (TINY_MODULE, TINY_MODEL_DIR))


def stand_in_model_dir(profile) -> Path:
    """The local tiny model the lab serves for this profile (its tokenizer, for example): the TP-shaped
    stand-in of a rehearsal, else the profile's lab repo."""
    if profile.rehearsal:
        return tiny_for_tp(profile.tp)[1]
    return tiny_variant(profile.hf_model_repo)[1]


@contextlib.contextmanager
def lab_root(node) -> Iterator:
    """The same lab node logged in as root (the lab's ssh_config alias, whose user is root), for what the lab
    itself puts on or runs on a node in place of hardware or the kernel -- the simulated Spark, the userspace
    NFS server and mount that stand in for nfsd and the kernel's NFS client -- when the rehearsal's SSH user is
    the non-root operator. What the runbook does stays with the profile's user. The node itself when it is
    root already; a new connection, closed on exit, otherwise."""
    from ..remote import Node
    user, _, alias = node.spec.ssh.rpartition("@")
    if user in ("", "root"):
        yield node
        return
    root = Node(dataclasses.replace(node.spec, ssh=alias), node.ssh, log=node.log, dry_run=node.dry_run,
                command_prefix=node.command_prefix)
    try:
        yield root
    finally:
        root.close()


def lab_topology(profile) -> str:
    """How the lab wires the profile's nodes: ``profile.topology`` (a cable, the triangle or a switch; the lab has no
    switchless ring)."""
    from .netlab.spec import TOPOLOGIES
    nodes, topology = profile.nodes, profile.topology
    if topology not in TOPOLOGIES:
        raise LabError(f"the lab cannot wire a {topology}", observed=f"{len(nodes)} nodes, fabric addresses "
                       + ", ".join(n.fabric_ip for n in nodes), expected=" | ".join(TOPOLOGIES),
                       fix="put every node's fabric address (HEAD_IP, WORKER_IP, WORKER<k>_IP) on one /24 for the "
                           "lab's switch (env/lab-tp4.env: 169.254.30.<rank + 1>)")
    return topology


def ensure_lab(profile, *, echo=print):
    """Bring the lab up (idempotent) for this profile: nodes, tiny model, Hub endpoint."""
    from . import netlab
    info = netlab.up(LAB_DIR, nodes=len(profile.nodes), topology=lab_topology(profile))
    if profile.hf_endpoint:
        # a rehearsal pinned the stand-in shaped for its TP (rehearsal.publish_models); a lab profile pins main
        revision = ensure_tiny_repo(profile.hf_model_repo, tp=profile.tp if profile.rehearsal else None, echo=echo)
        if revision != profile.hf_revision:
            raise LabError("the lab's tiny model is not the revision the profile pins",
                           observed=revision, expected=profile.hf_revision,
                           fix=f"set HF_REVISION={revision} in {profile.source} (the tiny model's "
                               "content changed) or rebuild .lab/models/tiny")
        ensure_hub(profile.hf_endpoint, echo=echo)
    if profile.rehearsal and profile.runtime == "docker":
        ensure_rehearsal_image(profile, info, echo=echo)
    return info


def lab_image(*, native: str = "") -> oci.IndexImage:
    """The image a rehearsal pushes to the lab registry: the lab's busybox runtime as a two-platform index
    (this machine's platform and one other). Deterministic, so its digest is known before the push."""
    from .netlab.dockerd import runtime_rootfs_tar
    return oci.lab_index(runtime_rootfs_tar(), native or oci.native_platform())


#: on a node: remove every reference to the image unless a running container uses it; prints what it did
CLEAR_IMAGE = """id=$(docker image inspect --format '{{{{.Id}}}}' {ref} 2>/dev/null) || {{ echo absent; exit 0; }}
if [ -n "$(docker ps -q --filter ancestor="$id")" ]; then echo "in use by a running container"; exit 0; fi
docker rmi -f "$id" >/dev/null && echo removed"""


def ensure_rehearsal_image(profile, info, *, echo=print) -> oci.PushResult:
    """A rehearsal's IMAGE (the recipe's repository path and tag at the lab registry, pinned to the lab image's
    digest when the recipe pins one) pushed to the lab registry, and removed from the nodes so that step 04's
    image plan is a real pull (by digest on every node, or on the head and shipped to the workers)."""
    from .netlab.host import ssh
    from .netlab.spec import REGISTRY
    ref = oci.parse_reference(profile.image)
    if ref.host != REGISTRY:
        raise LabError("a rehearsal's image is pulled from the lab registry", observed=profile.image,
                       expected=f"{REGISTRY}/<the recipe's repository path>", fix="load the profile with "
                       "runbook.lab.rehearsal.load_rehearsal (run --rehearse does)")
    index = lab_image()
    if ref.digest and ref.digest != index.digest:
        raise LabError("the rehearsal pins a digest the lab image does not have", observed=ref.digest,
                       expected=index.digest, fix="load the rehearsal again (load_rehearsal(..., publish=True) pins "
                       "the lab image's digest)")
    pushed = oci.push(REGISTRY, ref.path, ref.tag, index)
    echo(f"lab registry: pushed {pushed.reference} ({', '.join(pushed.platforms)}; {pushed.blobs_sent} blob(s), "
         f"{pushed.bytes_sent} B sent, {pushed.blobs_present} present) in {pushed.seconds:.2f} s")
    for node in info.nodes:
        res = ssh(info.ssh_config, node.alias, CLEAR_IMAGE.format(ref=quote(str(ref))), timeout=60,
                  what=f"removing {ref} on {node.alias} (so the rehearsal pulls it)")
        echo(f"lab: {node.name}: {ref.path}: {res.stdout.strip() or 'done'}")
    return pushed


def ensure_tiny_model(*, echo=print, module: str = TINY_MODULE, out: Path = TINY_MODEL_DIR) -> Path:
    """Make the tiny random model once (deterministic; needs the lab vLLM venv)."""
    if (out / "config.json").is_file():
        return out
    if not VLLM_PYTHON.exists():
        raise LabError("the lab's CPU vLLM venv is missing", observed=str(VLLM_PYTHON),
                       fix="make lab-vllm (make runbook does it for the lab profile)")
    echo(f"lab: making the tiny model in {out}")
    tmp = out.with_name(out.name + ".partial")
    subprocess.run(["rm", "-rf", str(tmp)], check=True, timeout=60)
    res = subprocess.run([str(VLLM_PYTHON), "-m", module, "--out", str(tmp)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise LabError("making the tiny model failed", observed=res.stderr[-2000:],
                       fix="run the command by hand: .lab/vllm-venv/bin/python -m runbook.lab.tinymodel --out /tmp/t")
    tmp.rename(out)
    return out


def ensure_tiny_repo(repo_id: str, *, tp: int | None = None, echo=print) -> str:
    """Publish the tiny model to the lab Hub once; return its pinned revision.

    ``tp``: a rehearsal stands the tiny model in for a recipe's repo id, shaped for that tensor-parallel size
    (TP=3 needs the TP=3-shaped model). dspark-v4 and tp3-dspark share one repo id, so each shape is its own
    branch ``tp<N>`` and the profile pins that branch's commit."""
    from .hub import read_ref, publish_repo
    org, name = repo_id.split("/", 1)
    branch = f"tp{tp}" if tp else "main"
    existing = read_ref(HUB_ROOT / org / name, branch)
    if existing:
        return existing
    module, out = tiny_for_tp(tp) if tp else tiny_variant(repo_id)
    model = ensure_tiny_model(echo=echo, module=module, out=out)
    revision = publish_repo(HUB_ROOT, repo_id, model, branch=branch)
    echo(f"lab: published {repo_id}@{revision} ({branch}) to the lab Hub")
    return revision


def hub_alive(endpoint: str) -> bool:
    with ApiClient(ServerInfo(endpoint.rstrip("/"), ""), timeout=3) as api:
        # a route that answers whatever is published: a rehearsal on a fresh machine publishes only the recipe's ids
        return api.get(hub.HEALTH_PATH).status == 200


def ensure_hub(endpoint: str, *, echo=print) -> None:
    """Serve HUB_ROOT at ``endpoint`` (host side of the lab bridge) in the background."""
    if hub_alive(endpoint):
        return
    stop_hub()
    url = urlparse(endpoint)
    echo(f"lab: starting the Hub endpoint on {url.hostname}:{url.port}")
    with open(HUB_LOG, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "runbook.lab.hub", "--root", str(HUB_ROOT),
                                 "--host", url.hostname, "--port", str(url.port)],
                                cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    HUB_PID.write_text(str(proc.pid))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError("the lab Hub endpoint exited at start", observed=_tail(HUB_LOG),
                           fix="see .lab/hub.log")
        if hub_alive(endpoint):
            return
        time.sleep(0.2)
    raise LabError("the lab Hub endpoint did not answer within 20 s", observed=_tail(HUB_LOG))


def stop_hub() -> None:
    if not HUB_PID.exists():
        return
    try:
        pid = int(HUB_PID.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"runbook.lab.hub" in cmdline:     # only ever the process we started
            os.kill(pid, signal.SIGTERM)
    except (ValueError, FileNotFoundError, ProcessLookupError):
        pass
    HUB_PID.unlink(missing_ok=True)


def down() -> None:
    from . import netlab
    stop_hub()
    netlab.down(LAB_DIR)


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""
