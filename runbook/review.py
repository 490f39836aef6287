"""The offline review (``python -m runbook render``): every command each step would run on every node, in order,
with no SSH and no lab, secrets masked.

    text = review("env/exl3-v41.env", home="/home/spark")     # the steps' commands, node by node
    print(text)

It is the steps' own code in a dry run, on :class:`runbook.remote.OfflineNode` s: a change is recorded, not run;
a read is answered only from declared facts (each node's $HOME) and otherwise recorded as a command the step
would read with, and answered "unknown". Nothing connects: an OfflineNode raises before any socket opens. A
step that cannot go on without a real answer says where it stopped, and the review goes on with the next step.
Steps 05-07 send HTTP requests to the server (none in a dry run); 08 runs no command. The evidence of the dry run
goes to a scratch folder that is removed afterwards.
"""
from __future__ import annotations

import contextlib
import io
import posixpath
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from . import bench, engram, launch, network, preflight, weights
from .evidence import RunDir
from .profile import load_profile
from .remote import Cluster, CommandLog
from .secrets import redactor_from_env
from .step import Step
from .weights.node_paths import USER_CMD

__all__ = ["STEPS", "review"]

# the steps that run commands on the nodes, in run order, with the entry each notebook calls
STEPS: list[tuple[str, Callable]] = [
    ("00_preflight", preflight.run),
    ("01_network", network.run),
    ("02_weights", weights.run),              # download, verify, the worker's copy or the NFS share
    ("03_engram", engram.run),
    ("04_launch", launch.run),                # checkout, image, self-checks, start (the rendered serve per rank)
    ("07_bench", bench.run),
]


def review(profile_path: str | Path, *, home: str = "", overrides: dict[str, str] | None = None) -> str:
    """Every command of every step on every node, grouped by step, in the order the steps issue them."""
    profile = load_profile(profile_path, overrides=overrides)
    homes = {n.name: home or _default_home(n.ssh) for n in profile.nodes}
    # the only facts the review declares: each node's home (and the user it implies); every other read is unknown
    facts = {name: {'printf %s "$HOME"': h, USER_CMD: f"{h}\n1000\n{posixpath.basename(h) or 'root'}\n"}
             for name, h in homes.items()}
    redactor = redactor_from_env()
    log = CommandLog(None, redactor)
    scratch = Path(tempfile.mkdtemp(prefix="runbook-review-"))
    out = [f"# offline review of {profile.profile_name} ({profile.source}): recipe {profile.recipe}, "
           f"{len(profile.nodes)} nodes; no node is contacted",
           "# nodes: " + ", ".join(f"{n.name}={n.ssh} (rank {n.rank}, home {homes[n.name]})" for n in profile.nodes),
           f"# [read] = a read-only probe the step runs (here answered 'unknown'); [run] = a change; secrets are {'***'}"]
    try:
        run = RunDir.create(profile.profile_name, scratch, redactor)
        for name, entry in STEPS:
            step = Step(name, profile, run, dry_run=True)
            step._cluster = Cluster.offline(profile, facts=facts, log=log)
            first = len(log.entries)
            stopped = ""
            try:
                with contextlib.redirect_stdout(io.StringIO()):      # the steps' own progress lines
                    result = entry(step)
            except Exception as exc:  # noqa: BLE001 - a step that needs a real answer stops; the review goes on
                result, stopped = None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            out.append(f"\n## {name}")
            if name == "04_launch" and result is not None:
                out.append(result.plan.to_text())
                out.append("")
            entries = log.entries[first:]
            for e in entries:
                out.append(f"[{e['node']}] [{e['kind']}] {e['command']}")
            if not entries:
                out.append("(no command on the nodes)")
            if stopped:
                out.append(f"# stopped here offline (needs a real answer from a node): {redactor.redact(stopped)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return "\n".join(out) + "\n"


def _default_home(ssh: str) -> str:
    """/home/<user> from user@host, else /home/<your user> (``--home`` overrides)."""
    import getpass
    user = ssh.split("@", 1)[0] if "@" in ssh else getpass.getuser()
    return "/root" if user == "root" else f"/home/{user}"
