"""Identity across ranks before launch: every rank must load the same build, or the start refuses before anything
runs, naming the field, each rank's value and the fix.

    table = gather(cluster, profile, plan)       # read-only, every node in parallel: {node: RankIdentity}
    row = identity_check(table, profile)          # "ranks run one build": PASS, FAIL (the difference) or WARN
    record = to_record(table)                     # the table for the evidence (raw identity.json, the row's data)

What is compared (each a field of the table; ``n/a: …`` where the runtime has none, equal on every rank then):

* ``image``: the layer chain of IMAGE (docker runtime). The image id and repo digests are shown, not compared:
  overlay2 and containerd disagree on ``.Id``, and ``docker save | docker load`` (how 04 ships the image to a
  worker) drops RepoDigests (``image.py``), so the layers are what "the same image" means here.
* ``python``: the version of the rank's interpreter (its path is shown: homes differ between nodes).
* ``vLLM``: the installed distribution and version; ``vLLM package tree``: the sha256 over every file of the
  vllm package (``facts/stack.py`` says how, and why content not mtimes).
* ``torch``: its version; ``NCCL``: the version NCCL compiled into the library the rank loads and that file's
  sha256 (the build: vLLM #41725 / #42354, a pip and a system NCCL of different builds hung TP=2 20-26 min into
  load).
* ``driver / CUDA``: ``nvidia-smi``'s driver and CUDA (``n/a`` where a node has no nvidia-smi: the lab, and in a
  rehearsal, whose nvidia-smi is the simulator).
* ``recipe files``: the checkout's commit and the sha256 over the recipe files the ranks mount or run
  (``recipe.checkout_files``): a patch file edited on one node keeps the commit and changes the hash.

A field read on no rank (the probe cannot run: no python3 in the image, say) is a WARN, not a refusal; read on
some ranks and not others, it differs. A dry run reads (or, offline, records) the same commands and goes past.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checks import Check, Status, check
from ..facts import residue, stack
from ..facts.node_paths import vllm_python
from ..remote import Cluster, Node, expand_home
from . import recipe
from .render import LaunchPlan

__all__ = ["FIELDS", "RankIdentity", "differences", "gather", "identity_check", "to_record"]

FIELDS = ("image", "python", "vLLM", "vLLM package tree", "torch", "NCCL", "driver / CUDA", "recipe files")
CHECK_NAME = "ranks run one build (identity before launch)"
UNREAD = "unread"


@dataclass
class RankIdentity:
    node: str
    values: dict[str, str] = field(default_factory=dict)     # field -> what is compared ("unread: …" when not read)
    shown: dict[str, str] = field(default_factory=dict)      # field -> detail shown beside it (paths, ids)


def _unread(why: str) -> str:
    return f"{UNREAD}: {why}"[:200]


def _python_of(profile) -> str:
    """The interpreter the rank runs on this node (process runtime; the lab's docker runtime mounts the host's
    venv into its busybox image, so its ranks run the same interpreter)."""
    return vllm_python(profile) or ""


def _read_rank(node: Node, profile, plan: LaunchPlan, home: str) -> RankIdentity:
    rank = plan.rank(node.name)
    me = RankIdentity(node.name)
    in_image = profile.runtime == "docker" and not profile.lab
    # -- the image (docker runtime)
    if profile.runtime == "docker":
        img = stack.parse_image_identity(node.read(stack.image_identity_cmd(profile.image), timeout=30).stdout)
        me.values["image"] = img.layers_sha256 and f"layers {img.layers_sha256[:16]}" or _unread(img.error)
        me.shown["image"] = (f"{profile.image}: id {img.image_id[:19]}, repo digests "
                             f"{', '.join(d.split('@')[-1][:19] for d in img.repo_digests) or 'none'}")
    else:
        me.values["image"] = f"n/a: RUNTIME={profile.runtime}"
    # -- python, vLLM, torch, NCCL: the probe, where the rank's python runs
    cmd = (stack.probe_command(image=profile.image, env=rank.env) if in_image
           else stack.probe_command(python=_python_of(profile), env=rank.env))
    st = stack.parse_stack(node.read(cmd, timeout=stack.PROBE_TIMEOUT).stdout)
    if "error" in st:
        for name in ("python", "vLLM", "vLLM package tree", "torch", "NCCL"):
            me.values[name] = _unread(f"the stack probe printed nothing ({st['error']})")
    else:
        me.values["python"] = st.get("python_version") or _unread("no version")
        me.shown["python"] = f"{st.get('python', '?')} (prefix {st.get('prefix', '?')})"
        v = st.get("vllm") or {}
        if v:
            me.values["vLLM"] = f"{v.get('dist') or 'vllm'} {v.get('version') or '?'}"
            me.values["vLLM package tree"] = f"sha256 {str(v.get('tree_sha256', ''))[:16]}"
            me.shown["vLLM package tree"] = f"{v.get('files')} files, {int(v.get('bytes') or 0) / 1e6:.0f} MB in " \
                                            f"{v.get('dir')}"
        else:
            me.values["vLLM"] = me.values["vLLM package tree"] = _unread(
                f"no vllm package for {st.get('python', 'this python')} {st.get('vllm_error', '')}".strip())
        me.values["torch"] = st.get("torch") or "n/a: no torch distribution"
        nc = st.get("nccl") or {}
        if not nc:
            me.values["NCCL"] = "n/a: no libnccl.so.2 for this python (CPU build: gloo)"
        elif nc.get("missing"):
            me.values["NCCL"] = _unread(f"{nc.get('path')} ({nc.get('via')}) does not exist")
        else:
            me.values["NCCL"] = f"{nc.get('version') or 'version ?'} build {str(nc.get('sha256', ''))[:16]}"
            me.shown["NCCL"] = f"{nc.get('real') or nc.get('path')} via {nc.get('via')}" + \
                (f" {nc['pip_version']}" if nc.get("pip_version") else "")
    # -- the driver (host); a rehearsal's nvidia-smi is the simulator: its header is no fact to compare
    if profile.rehearsal:
        me.values["driver / CUDA"] = "n/a: rehearsal (nvidia-smi here is the simulator)"
    else:
        smi = node.read(f"command -v nvidia-smi >/dev/null 2>&1 && {{ {residue.NVIDIA_SMI_CMD}; }} "
                        "|| echo 'no nvidia-smi'", timeout=30).stdout
        if smi.strip() == "no nvidia-smi":
            me.values["driver / CUDA"] = "n/a: no nvidia-smi on the node"
        else:
            drv = residue.parse_nvidia_smi_header(smi)
            me.values["driver / CUDA"] = (f"driver {drv.driver} CUDA {drv.cuda}" if drv.driver
                                          else _unread(smi.strip()[-120:] or "nvidia-smi printed nothing"))
    # -- the recipe files the ranks mount or run
    pin = recipe.recipe_pin(profile)
    if pin is None:
        me.values["recipe files"] = "n/a: no recipe pinned"
    else:
        rf = stack.parse_recipe_files(node.read(stack.recipe_files_cmd(expand_home(pin.dir, home),
                                                                        recipe.checkout_files(profile)), timeout=60).stdout)
        me.values["recipe files"] = (f"{rf.commit[:12] or 'commit ?'}, {rf.files} files sha256 {rf.files_sha256[:16]}"
                                     if rf.files else _unread(rf.error or "no recipe file found in the checkout"))
    return me


def gather(cluster: Cluster, profile, plan: LaunchPlan, homes: dict[str, str] | None = None) -> dict[str, RankIdentity]:
    """Every rank's identity, read on every node in parallel (read-only; a node that does not answer has every
    field unread)."""
    homes = homes or {}

    def read(node: Node) -> RankIdentity:
        home = homes.get(node.name) or node.read("printf %s \"$HOME\"").stdout.strip() or "/root"
        return _read_rank(node, profile, plan, home)

    out: dict[str, RankIdentity] = {}
    for name, value in cluster.each(read).items():
        if isinstance(value, Exception):
            value = RankIdentity(name, {f: _unread(f"the node did not answer: {value}") for f in FIELDS})
        out[name] = value
    return out


def differences(table: dict[str, RankIdentity]) -> dict[str, dict[str, str]]:
    """Field -> {node: value} for every field whose value is not the same on every rank."""
    out: dict[str, dict[str, str]] = {}
    for f in FIELDS:
        values = {n: r.values.get(f, _unread("not read")) for n, r in table.items()}
        if len(set(values.values())) > 1:
            out[f] = values
    return out


def _fix(name: str, profile) -> str:
    stop = f"python -m runbook stop --profile {profile.source or '<profile>'}"
    docker = profile.runtime == "docker" and not profile.lab
    fixes = {
        "image": "make the image identical: rerun the start (04 ships the head's image to a worker that lacks it) "
                 "or pull the same IMAGE@sha256 digest on every node; `docker image inspect` RootFS.Layers shows "
                 "the difference",
        "python": "run every rank on the same python version (one venv built the same way on every node)",
        "vLLM": ("use one image on every node (IMAGE pinned by digest)" if docker else
                 "install the same vLLM on every node (the same wheel; pip show vllm on each), or copy the head's "
                 "venv to the worker"),
        "vLLM package tree": ("a file of the installed vllm package differs although the version may match: use one "
                              "image by digest on every node" if docker else
                              "a file of the installed vllm package differs although the version may match (a local "
                              "edit, a partial upgrade): reinstall it on the differing node (pip install "
                              "--force-reinstall --no-deps <the wheel>) or copy the head's venv"),
        "torch": "install the same torch on every node",
        "NCCL": "make every rank load the same libnccl.so.2 build (one image; or VLLM_NCCL_SO_PATH to one library "
                "present on every node): a pip and a system NCCL of different builds hung TP=2 20-26 min into load "
                "(vLLM #41725, #42354)",
        "driver / CUDA": "install the same NVIDIA driver on every node, then reboot",
        "recipe files": f"the recipe checkout differs on a node (an edited or missing patch file): {stop}, then "
                        "`git -C <RECIPE_DIR> status` on that node, `git checkout -- .`, or remove the checkout so the "
                        "start copies it from the head again",
    }
    return fixes[name]


def identity_check(table: dict[str, RankIdentity], profile, *, dry_run: bool = False) -> Check:
    """One row: PASS when every field is equal on every rank; FAIL naming each differing field with every
    rank's value and its fix; WARN when every rank agrees but some field could be read on none."""
    diff = differences(table)
    data = {"identity": to_record(table)}
    expected = "the same " + ", ".join(FIELDS) + " on every rank"
    if diff:
        observed = "; ".join(f"{f} differs: " + ", ".join(f"{n}={v}" for n, v in values.items())
                             for f, values in diff.items())
        fix = " | ".join(f"{f}: {_fix(f, profile)}" for f in diff)
        if dry_run:
            fix = "dry run: not enforced (a real start refuses here). " + fix
        return check(CHECK_NAME, False, node=",".join(table), observed=observed[:1500], expected=expected,
                     fix=fix, data=data, warn_only=dry_run)
    first = next(iter(table.values()), RankIdentity("?"))
    unread = [f for f in FIELDS if first.values.get(f, "").startswith(UNREAD)]
    summary = "; ".join(f"{f} {first.values.get(f, '?')}" for f in FIELDS if f not in unread)
    if unread:
        return Check(CHECK_NAME, node="cluster", status=Status.WARN,
                     observed=(f"equal on {len(table)} ranks: {summary}; not read on any rank: "
                               + "; ".join(f"{f} ({first.values[f]})" for f in unread))[:1500],
                     expected=expected,
                     fix="nothing blocks the start; to compare these too, make the probe run where the rank runs "
                         "(python3 in the image or next to VLLM_BIN)", data=data)
    return Check(CHECK_NAME, node="cluster", status=Status.PASS, observed=f"equal on {len(table)} ranks: {summary}",
                 expected=expected, data=data)


def to_record(table: dict[str, RankIdentity]) -> dict[str, Any]:
    """{"fields": [...], "ranks": {node: {field: value}}, "shown": {node: {field: detail}}}."""
    return {"fields": list(FIELDS), "ranks": {n: dict(r.values) for n, r in table.items()},
            "shown": {n: dict(r.shown) for n, r in table.items()}}
