"""The runtime image on every node: present and identical (layer digests) before launch.

    plan = plan_image(profile, infos)          # pure (facts/system.py): "none" | "ship" | "pull" | "fail"
    result = ensure_image(cluster, profile)    # plan -> apply -> verify; returns checks

Identity is the digest of ``RootFS.Layers`` (seed A: overlay2 and containerd disagree on ``.Id``, and
``docker save | docker load`` drops RepoDigests). When a worker lacks the head's image it is shipped
over the fabric: ``docker save -o`` into a staging dir on the head (free space checked first on both
ends: tar size x 2 + margin on the worker), a resumable copy (``rsync --partial --inplace`` over
ssh to the worker's fabric address; re-running resumes), ``docker load -i`` on the worker, then the
layer digests are compared again and the staging files removed. Pulling happens only for a
digest-pinned IMAGE and never in the lab (its nodes have no route out).
"""
from __future__ import annotations

import time
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from ..errors import ActionError
from ..facts import system
from ..facts.system import ImageInfo, plan_image
from ..remote import Cluster, Node, expand_home, node_ssh_argv, quote

__all__ = ["SHIP_MARGIN_BYTES", "ensure_image", "image_infos"]

GIB = 1024 ** 3
SHIP_MARGIN_BYTES = 5 * GIB      # seed A: worker needs tar size x 2 + 5 GiB
LAB_SHIP_MARGIN_BYTES = 64 * 1024 ** 2


def image_infos(cluster: Cluster, image: str) -> dict[str, ImageInfo | None]:
    res = cluster.each(lambda n: system.parse_image(n.read(system.image_cmd(image)).stdout))
    for v in res.values():
        if isinstance(v, Exception):
            raise v
    return res  # type: ignore[return-value]


def _free_bytes(node: Node, path: str) -> int:
    r = node.read(system.disk_free_cmd(path))
    return system.parse_disk_free(r.stdout).avail_bytes if r.ok else 0


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
    ok = free_h >= size + margin and free_t >= 2 * size + margin
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
    head.run(f"docker save -o {quote(tar)} {quote(profile.image)}", timeout=3600)
    ssh = " ".join(quote(a) for a in node_ssh_argv(profile, target, target.spec.fabric_ip)[:-1])
    dest = node_ssh_argv(profile, target, target.spec.fabric_ip)[-1]
    head.run(f"rsync -a --partial --inplace -e {quote(ssh)} {quote(tar)} {quote(dest + ':' + tstage + '/')}",
             timeout=7200)
    target.run(f"docker load -i {quote(tstage + '/' + tar_name)}", timeout=3600)
    target.run(f"rm -f {quote(tstage + '/' + tar_name)}", timeout=60)
    head.run(f"rm -f {quote(tar)}", timeout=60)
    return {"bytes": size, "seconds": round(time.monotonic() - t0, 2), "via": f"rsync to {target.spec.fabric_ip}"}


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
    if cluster.head.dry_run:
        checks.add(not_applicable("runtime image identical", f"dry run: would {plan.action} ({plan.reason})",
                                  node="cluster"))
        return _finish(checks, data)
    shipped: dict[str, Any] = {}
    for name in plan.targets:
        node = cluster[name]
        if plan.action == "pull" or (plan.action == "pull-head" and name == "head"):
            r = node.run(f"docker pull {quote(profile.image)}", timeout=7200, warn=True)
            if r.ok or name == "head" or infos.get("head") is None:
                shipped[name] = {"pulled": r.ok}
                if name == "head" and not r.ok:
                    checks.add(check("image pulled", False, node="head", observed=r.stderr.strip()[-500:],
                                     expected=f"docker pull {profile.image} succeeds",
                                     fix="see the docker error (`unexpected EOF`: rerun, `manifest unknown`: fix "
                                         "IMAGE, `no such host`: DNS); or docker load a saved image on the head"))
                    return _finish(checks, {**data, "shipped": shipped})
                continue
        try:
            shipped[name] = _ship(cluster, profile, node, checks)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            checks.add(check("image shipped", False, node=name, observed=str(exc)[:800],
                             expected="docker load done", fix="rerun: the copy resumes (rsync --partial)"))
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
