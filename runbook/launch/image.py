"""The runtime image on every node: present and identical (layer digests) before launch.

    plan = plan_image(profile, infos)          # pure (facts/system.py): "none" | "ship" | "pull" | "fail"
    result = ensure_image(cluster, profile)    # plan -> apply -> verify; returns checks

Identity is the digest of ``RootFS.Layers`` (seed A: overlay2 and containerd disagree on ``.Id``, and
``docker save | docker load`` drops RepoDigests). When a worker lacks the head's image it is shipped
over the fabric: ``docker save | dd`` into a staging dir on the head (free space checked first on both
ends: tar size x 2 + margin on the worker), a resumable copy (``rsync --partial --inplace`` over
ssh to the worker's fabric address; re-running resumes), ``dd | docker load`` on the worker (each phase's bytes
counted through ``runbook.progress``), then the
layer digests are compared again and the staging files removed. A digest-pinned IMAGE is pulled on every
node that lacks it; a moving tag is pulled on the head only and shipped. A lab profile never pulls (``lab up``
imports its image); a rehearsal pulls the recipe's image from the lab registry (``runbook.lab.oci``). A failed
pull's output is kept in ``data["pull_failed"]`` for the diagnose catalogue's ``docker-pull-*`` rows.

The tar holds the *target node's platform* only: ``docker save --platform <os/arch of the node's
daemon>`` where both docker CLI and daemon speak API 1.48+ (Docker 28). A multi-arch index saved whole
references the other platforms' blobs, which the head never pulled, and ``docker load`` dies with
``open /var/lib/docker/tmp/docker-import-*/blobs/sha256/<id>: no such file`` (recipe A's issue #8;
its ``start.sh`` saves with ``--platform`` too). Older docker with the containerd image store (where an
index is kept as such) is refused before the save, with the fix; the classic store keeps one platform's
image, which ``docker save`` exports whole. A head image of another platform than the node's is refused.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from .. import progress
from ..checks import Check, CheckList, Status, check, not_applicable
from ..errors import ActionError
from ..facts import system
from ..facts.system import ImageInfo, plan_image
from ..remote import Cluster, CommandResult, Node, expand_home, node_ssh_argv, quote

__all__ = ["SHIP_MARGIN_BYTES", "ShipFacts", "ensure_image", "image_infos", "parse_ship_facts", "save_command",
           "ship_facts_cmd"]

GIB = 1024 ** 3
SHIP_MARGIN_BYTES = 5 * GIB      # seed A: worker needs tar size x 2 + 5 GiB
LAB_SHIP_MARGIN_BYTES = 64 * 1024 ** 2
SAVE_PLATFORM_API = (1, 48)      # `docker save --platform`: API 1.48+ (Docker 28.0), CLI and daemon
BLOBS_MISSING_FIX = ("the tar held a multi-arch index whose other platforms' blobs are not on the head "
                     "(`docker load`: 'blobs/sha256/<id>: no such file'): upgrade Docker to 28+ on the head "
                     "(`docker save --platform`), or pull the image on the worker by digest, or "
                     "`docker pull --platform linux/arm64 IMAGE` on the head and rerun")


@dataclass
class ShipFacts:
    """What decides the ``docker save`` command: the API versions of the head's docker CLI and daemon,
    whether the daemon keeps images in the containerd store (indexes stay indexes there), the head
    image's platform, and the target daemon's platform."""
    client_api: str
    server_api: str
    containerd_store: bool
    image_platform: str           # os/arch[/variant] of the head's image; "" when unknown
    target_platform: str          # os/arch of the target node's daemon


def ship_facts_cmd(image: str) -> str:
    """One read on the head (prints three lines: API versions, storage driver status, image platform)."""
    return ("docker version --format '{{.Client.APIVersion}} {{.Server.APIVersion}}' 2>&1; "
            "docker info --format '{{json .DriverStatus}}' 2>&1; "
            "docker image inspect --format '{{.Os}}/{{.Architecture}}{{if .Variant}}/{{.Variant}}{{end}}' "
            f"{quote(image)} 2>&1")


TARGET_PLATFORM_CMD = "docker version --format '{{.Server.Os}}/{{.Server.Arch}}' 2>&1"


def parse_ship_facts(head_text: str, target_text: str) -> ShipFacts:
    """Parse :func:`ship_facts_cmd`'s three lines and :data:`TARGET_PLATFORM_CMD`'s line::

        1.48 1.48
        [["driver-type","io.containerd.snapshotter.v1"]]
        linux/arm64
    """
    lines = [l.strip() for l in head_text.strip().splitlines()] + ["", "", ""]
    apis = lines[0].split() + ["", ""]
    plat = lines[2] if re.fullmatch(r"[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?", lines[2]) else ""
    target = target_text.strip().splitlines()[-1].strip() if target_text.strip() else ""
    return ShipFacts(apis[0], apis[1], "io.containerd.snapshotter" in lines[1], plat,
                     target if re.fullmatch(r"[a-z0-9]+/[a-z0-9_]+", target) else "")


def _api(version: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _arch(platform: str) -> str:
    return "/".join(platform.split("/")[:2])


def save_command(image: str, tar: str, facts: ShipFacts, *, node: str = "worker") -> str:
    """The ``docker save`` that writes exactly the target node's platform of ``image`` to ``tar`` (``-``: to its
    stdout, for a counted copy), or ActionError (before anything is written) when no such command exists here."""
    out = "" if tar == "-" else f" -o {quote(tar)}"
    if not facts.target_platform:
        raise ActionError(f"cannot read the docker platform of {node}", node=node,
                          expected="`docker version --format '{{.Server.Os}}/{{.Server.Arch}}'` answers",
                          fix=f"check that docker runs on {node} and the SSH user may use it (docker group)")
    if facts.image_platform and _arch(facts.image_platform) != facts.target_platform:
        raise ActionError(f"the head's {image} is {facts.image_platform}, {node} runs {facts.target_platform}",
                          node="head", observed=f"image {facts.image_platform}, {node} {facts.target_platform}",
                          expected="the image of the node's platform",
                          fix=f"docker pull --platform {facts.target_platform} {image} on the head, then rerun")
    api = min(_api(facts.client_api), _api(facts.server_api))
    if api >= SAVE_PLATFORM_API:
        return f"docker save --platform {quote(facts.target_platform)}{out} {quote(image)}"
    if facts.containerd_store:
        raise ActionError("this docker cannot save one platform of a multi-arch image", node="head",
                          observed=f"docker API client {facts.client_api or '?'} / daemon {facts.server_api or '?'} "
                                   "with the containerd image store",
                          expected="API >= 1.48 (Docker 28) for `docker save --platform`",
                          fix="upgrade Docker on the head to 28 or later; or make the worker pull the image by "
                              "digest (IMAGE=<repo>@sha256:…); a plain `docker save` writes the whole index, "
                              "naming platforms' manifests the tar does not hold (recipe A's users saw `docker "
                              "load` fail on it with 'blobs/sha256/<id>: no such file'; containerd's importers "
                              "fail on it with 'content digest …: not found')")
    return f"docker save{out} {quote(image)}"        # the classic store: one platform, saved whole


def image_infos(cluster: Cluster, image: str) -> dict[str, ImageInfo | None]:
    res = cluster.each(lambda n: system.parse_image(n.read(system.image_cmd(image)).stdout))
    for v in res.values():
        if isinstance(v, Exception):
            raise v
    return res  # type: ignore[return-value]


def _free_bytes(node: Node, path: str) -> int:
    r = node.read(system.disk_free_cmd(path))
    return system.parse_disk_free(r.stdout).avail_bytes if r.ok else 0


def _file_bytes(node: Node, path: str) -> int:
    out = node.read(f"stat -c %s {quote(path)}", timeout=30).stdout.strip()
    return int(out) if out.isdigit() else 0


def _ship(cluster: Cluster, profile, target: Node, checks: CheckList) -> dict[str, Any]:
    head = cluster.head
    home = head.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    thome = target.read("printf %s \"$HOME\"").stdout.strip() or "/root"

    stage = f"{expand_home(profile.cache_dir, home)}/image-ship"
    tstage = f"{expand_home(profile.cache_dir, thome)}/image-ship-{target.name}"   # the lab nodes share a filesystem
    tar_name = profile.image.replace("/", "_").replace(":", "_").replace("@", "_") + ".tar"
    size_r = head.read(f"docker image inspect --format '{{{{.Size}}}}' {quote(profile.image)}")
    size = int(size_r.stdout.strip() or 0) if size_r.stdout.strip().isdigit() else 0
    margin = LAB_SHIP_MARGIN_BYTES if profile.lab else SHIP_MARGIN_BYTES
    head.run(f"mkdir -p {quote(stage)}", timeout=30)
    target.run(f"mkdir -p {quote(tstage)}", timeout=30)
    free_h, free_t = _free_bytes(head, stage), _free_bytes(target, tstage)
    ok = free_h >= size + margin and free_t >= 2 * size + margin or head.dry_run   # a dry run knows no size
    checks.add(check("image ship: free space", ok, node=target.name,
                     observed=f"head {free_h / GIB:.1f} GiB, {target.name} {free_t / GIB:.1f} GiB free; "
                              f"image {size / GIB:.2f} GiB",
                     expected=f"head >= size + margin, {target.name} >= 2 x size + margin",
                     fix="free disk space under CACHE_DIR on both nodes"))
    if not ok:
        raise ActionError("not enough disk to ship the image", node=target.name,
                          observed=f"head {free_h} B, {target.name} {free_t} B free, image {size} B",
                          fix="free disk space under CACHE_DIR")
    t0 = time.monotonic()
    tar = f"{stage}/{tar_name}"
    facts = parse_ship_facts(head.read(ship_facts_cmd(profile.image), timeout=30).stdout,
                             target.read(TARGET_PLATFORM_CMD, timeout=30).stdout)
    save = save_command(profile.image, "-", facts, node=target.name)
    # each phase counted in bytes (runbook.progress): dd's status=progress for the save and the load, rsync's
    # progress2 for the copy; the image's size is the save's estimate until the tar's own size is known
    dry = head.dry_run
    with progress.from_tool(f"{target.name} image save", size, progress.DD_BYTES, dry_run=dry) as (bar, lines):
        head.run(f"set -o pipefail; {save} | dd of={quote(tar)} bs=4M status=progress", timeout=3600, lines=lines)
        tar_size = (0 if dry else _file_bytes(head, tar)) or size
        bar.update(tar_size, total=tar_size)
    ssh = " ".join(quote(a) for a in node_ssh_argv(profile, target, target.spec.fabric_ip)[:-1])
    dest = node_ssh_argv(profile, target, target.spec.fabric_ip)[-1]
    with progress.from_tool(f"{target.name} image copy", tar_size, progress.RSYNC_BYTES, dry_run=dry) as (bar, lines):
        head.run(f"rsync -a --partial --inplace --info=progress2 -e {quote(ssh)} {quote(tar)} "
                 f"{quote(dest + ':' + tstage + '/')}", timeout=7200, lines=lines)
        bar.update(tar_size)
    with progress.from_tool(f"{target.name} image load", tar_size, progress.DD_BYTES, dry_run=dry) as (bar, lines):
        target.run(f"set -o pipefail; dd if={quote(tstage + '/' + tar_name)} bs=4M status=progress | docker load",
                   timeout=3600, lines=lines)
        bar.update(tar_size)
    target.run(f"rm -f {quote(tstage + '/' + tar_name)}", timeout=60)
    head.run(f"rm -f {quote(tar)}", timeout=60)
    return {"bytes": size, "tar_bytes": tar_size, "seconds": round(time.monotonic() - t0, 2),
            "via": f"rsync to {target.spec.fabric_ip}",
            "platform": facts.target_platform, "save": save}


def ensure_image(cluster: Cluster, profile) -> "ImageChecks":
    """Make the runtime image present and identical on every node (docker runtime only)."""
    checks = CheckList()
    if profile.runtime != "docker":
        checks.add(not_applicable("runtime image identical", f"RUNTIME={profile.runtime}: no image is used",
                                  node="cluster"))
        return _finish(checks, {})
    infos = image_infos(cluster, profile.image)
    plan = plan_image(profile, infos)
    data: dict[str, Any] = {"plan": plan.action, "reason": plan.reason,
                            "before": {n: (i.image_id if i else None) for n, i in infos.items()}}
    if plan.action == "none":
        checks.add(Check("runtime image identical", node="cluster", status=Status.NOOP,
                         observed=f"{plan.reason} ({infos['head'].image_id[:19]})",
                         expected="same layer digests on every node"))
        return _finish(checks, data)
    if plan.action == "fail":
        checks.add(check("runtime image identical", False, node="head", observed=plan.reason,
                         expected=f"{profile.image} on the head",
                         fix=f"docker pull {profile.image} on the head (or build/import it), then rerun"))
        return _finish(checks, data)
    dry = cluster.head.dry_run        # the pulls and the ship are recorded, not run (the offline review shows them)
    shipped: dict[str, Any] = {}
    for name in plan.targets:
        node = cluster[name]
        if plan.action == "pull" or (plan.action == "pull-head" and name == "head"):
            r = node.run(f"docker pull {quote(profile.image)}", timeout=7200, warn=True)
            shipped[name] = {"pulled": r.ok, "seconds": round(r.duration_s, 2)}
            if dry and name != "head":
                # a dry run shows the fallback as well: the ship a worker gets when its pull fails
                node.log.record(CommandResult(name, f"should the pull above fail on {name}, the head's image is "
                                              "shipped to it as follows", 0, dry_run=True), kind="note")
            elif r.ok or dry:
                continue
            else:
                # the pull's own words, for the diagnose catalogue's docker-pull rows (launch.run matches them)
                data.setdefault("pull_failed", {})[name] = (r.stdout + "\n" + r.stderr).strip()[-4000:]
                if name == "head":
                    checks.add(check("image pulled", False, node="head", observed=r.stderr.strip()[-500:],
                                     expected=f"docker pull {profile.image} succeeds",
                                     fix="see the docker error (`unexpected EOF`: rerun, `manifest unknown`: fix "
                                         "IMAGE, `no such host`: DNS); or docker load a saved image on the head"))
                    return _finish(checks, {**data, "shipped": shipped})
                # a worker's pull failed: the head has the image now (present, or pulled first: targets are in
                # rank order), so ship it from there, as recipe A does when the worker cannot reach the registry
                checks.add(Check("image pulled", node=name, status=Status.WARN, observed=r.stderr.strip()[-300:],
                                 expected=f"docker pull {profile.image} succeeds on {name}",
                                 fix="nothing to do: the head's image is shipped instead"))
        try:
            shipped[name] = _ship(cluster, profile, node, checks)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            text = str(exc)
            fix = (exc.fix if isinstance(exc, ActionError) and exc.fix else "rerun: the copy resumes (rsync --partial)")
            if "blobs/sha256" in text and "no such file" in text:
                fix = BLOBS_MISSING_FIX
            checks.add(check("image shipped", False, node=name, observed=text[:800],
                             expected="docker load done", fix=fix))
            return _finish(checks, {**data, "shipped": shipped})
    if dry:
        checks.add(not_applicable("runtime image identical", f"dry run: {plan.action} recorded, not run "
                                  f"({plan.reason})", node="cluster"))
        return _finish(checks, {**data, "shipped": shipped})
    after = image_infos(cluster, profile.image)
    head = after.get("head")
    same = head is not None and all(i is not None and list(i.layers) == list(head.layers) for i in after.values())
    checks.add(check("runtime image identical", same, node="cluster",
                     observed=", ".join(f"{n}={(i.image_id[:19] if i else 'absent')}" for n, i in after.items())
                     + f" after {plan.action} ({', '.join(plan.targets)})",
                     expected="same layer digests on every node",
                     fix="compare `docker image inspect` RootFS.Layers on both nodes; rerun to ship again"))
    data.update({"shipped": shipped, "after": {n: (i.image_id if i else None) for n, i in after.items()}})
    return _finish(checks, data)


class ImageChecks(CheckList):
    """The image rows, and what was found and done per node (``data``: ids, what was shipped) for the sidecar."""
    data: dict[str, Any]


def _finish(checks: CheckList, data: dict[str, Any]) -> ImageChecks:
    out = ImageChecks(checks)
    out.data = data
    return out
