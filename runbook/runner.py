"""Run the notebooks in order with papermill and archive them as evidence.

Reads top to bottom as the checklist of a run:
validate the profile → (lab) bring the lab up → open the run folder → for each step, execute
its notebook into a scratch folder, scrub secrets, archive it, record it → stop at the first
failing step.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import launch, progress, records, weights
from .checks import CheckList, check
from .console import ARCHIVE_NAME, Console, StepResult
from .api import health
from .errors import ActionError, ExitStatus, RemoteError, RunbookError, UsageError, exit_status_of
from .evidence import NOTEBOOKS_DIR, REPO_ROOT, RESULTS_ROOT, RunDir, discover_steps, file_sha256, provenance, scrub_tree
from .profile import load_profile
from .remote import Cluster, ClusterLock
from .secrets import redactor_from_env

KERNEL_NAME = "runbook"
DEFAULT_STEP_TIMEOUT = 3600


@dataclass
class StepRun:
    """How one notebook's execution ended, as the runner saw it (not the step's own ``runbook.step.StepOutcome``,
    which its ``run`` returns inside the kernel)."""
    name: str
    status: str          # passed | failed | skipped
    seconds: float
    error: str = ""
    exit: int = 0        # the failing step's class (ExitStatus: checks, action, remote, bench, lab failed)


def select_steps(steps: list[str], *, start: str = "", stop: str = "", only: list[str] | None = None) -> list[str]:
    def find(token: str) -> int:
        for i, name in enumerate(steps):
            if name == token or name.split("_", 1)[0] == token or name.split("_", 1)[-1] == token:
                return i
        raise UsageError(f"unknown step {token!r}", expected=", ".join(steps),
                           fix="name a step by its number (01), name (network) or file stem (01_network)")
    if only:
        return [steps[find(t)] for t in only]
    lo = find(start) if start else 0
    hi = find(stop) if stop else len(steps) - 1
    return steps[lo:hi + 1]


# the slowest step is a first download: weights + Engram source at a pessimistic 50 MB/s, plus an hour
DOWNLOAD_MB_S = 50


def default_step_timeout(profile) -> int:
    """Seconds one notebook may run: an hour, or more when the profile's first download needs it
    (recipe A: ~197 GiB of weights + ~189 GiB of Engram source is ~2.3 h at 50 MB/s). WEIGHT_SYNC=download-both
    downloads on every node one after the other, as recipe B's prepare script does (head, then each worker):
    every node's download counts."""
    downloads = len(profile.nodes) if profile.weight_sync == "download-both" else 1
    gib = float(profile.weights_gib) * downloads + (float(profile.engram_gib) if profile.engram else 0.0)
    return int(DEFAULT_STEP_TIMEOUT + gib * 1024 ** 3 / (DOWNLOAD_MB_S * 1e6))


def check_kernel(kernel: str) -> None:
    from jupyter_client.kernelspec import KernelSpecManager
    if kernel not in KernelSpecManager().find_kernel_specs():
        raise RunbookError(f"Jupyter kernel {kernel!r} is not installed",
                           fix="run `make install` (it registers the `runbook` kernel from .venv)")


def run(profile_path: str | Path, *, start: str = "", stop: str = "", only: list[str] | None = None,
        resume: str = "", dry_run: bool = False, overrides: dict[str, str] | None = None,
        kernel: str = KERNEL_NAME, step_timeout: int = 0,
        results_root: Path | None = None, notebooks_dir: Path = NOTEBOOKS_DIR,
        lab_up: Callable | None = None, echo: Callable[[str], None] = print,
        rehearsal: list[dict[str, str]] | None = None,
        console: Console | None = None) -> tuple[RunDir, list[StepRun]]:
    """``console``: the CLI's face (runbook/console.py): each step gets a live line instead of papermill's
    stream, which it archives as ``console.log`` in the run folder; without it (a library call) the stream goes
    to the ``papermill`` logger as before."""
    # 1. the profile is validated before anything else happens
    profile = load_profile(profile_path, overrides=overrides)
    step_timeout = step_timeout or default_step_timeout(profile)
    steps = select_steps(discover_steps(notebooks_dir), start=start, stop=stop, only=only)
    check_kernel(kernel)
    redactor = redactor_from_env()
    if console is not None:
        console.redact = redactor.redact
        echo(f"{_repo_relative(str(profile.source))}, {len(profile.nodes)} nodes "
             f"({', '.join(f'{n.name} {n.ssh}' for n in profile.nodes)}): "
             + (", ".join(steps) if len(steps) < 4 else f"{steps[0]} .. {steps[-1]} ({len(steps)} steps)"))

    # 2. one run per cluster: the head's lock, held to the end (a dry run changes nothing and takes none). On the
    # lab it is taken before the lab is touched when the lab's head answers already, so a second run refuses
    # (exit 9) before it restarts any lab node under the run that holds it.
    command = "run" + (f" --resume {resume}" if resume else "")
    lock = None
    if profile.lab and lab_up is not None:
        if not dry_run:
            try:
                lock = ClusterLock.for_profile(profile, command=command, echo=echo)
            except RemoteError:           # the lab is not up yet: nothing runs there; the lock is taken below
                lock = None
        try:
            if console is None:
                echo(f"lab: bringing the {len(profile.nodes)}-node lab up")
                lab_up(profile)
            else:                       # a live line while it comes up (minutes on a fresh machine); its lines: -v
                with console.step(f"lab up ({len(profile.nodes)} nodes)"):
                    lab_up(profile)
            if profile.rehearsal and not dry_run:
                set_lab_server_aside(profile, echo=echo)
            elif not dry_run:
                set_rehearsal_server_aside(profile, echo=echo)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
    if lock is None and not dry_run:
        try:
            lock = ClusterLock.for_profile(profile, command=command, echo=echo)
        except RemoteError as err:        # the head does not answer: nothing can run there; 00 records why
            echo(f"cluster lock: not taken, the head does not answer ({err.what}); the steps will say why")
    run_dir = None
    try:
        # 4. the run folder (new, or an earlier one to resume)
        selection = {"start": start, "stop": stop, "only": list(only or [])}
        if resume:
            run_dir = RunDir(run_folder(resume, results_root), redactor).hold("run --resume")
            recorded = run_dir.manifest().get("selection")
            if recorded and not (start or stop or only):
                # resume means the same run: the range it was started with, not every step that has not passed
                steps = select_steps(discover_steps(notebooks_dir), start=recorded.get("start", ""),
                                     stop=recorded.get("stop", ""), only=recorded.get("only") or None)
                selection = recorded
                echo(f"resuming {run_dir.run_id} with its own range: {', '.join(steps)}")
            done = {name for name, entry in run_dir.manifest().get("steps", {}).items()
                    if entry.get("status") == "passed"}
            gone = first_state_gone(profile, run_dir, sorted(done), dry_run=dry_run)
            if gone:
                name, why = gone
                echo(f"resuming {run_dir.run_id}: {name} passed, but its state is gone ({why}): re-running from {name}")
                steps = sorted(set(steps) | {s for s in done if s >= name})
                for s in sorted(done):
                    if s >= name:
                        run_dir.record_step(s, status="stale", stale_since=name)
                done = {s for s in done if s < name}
            # a step that runs again makes every later step's evidence stale (05 measured on the server a re-run
            # 04 replaces): those re-run too, and say so in the manifest at once, so a resume that fails before
            # reaching them cannot leave them counted as passed for the next resume
            pending = [s for s in steps if s not in done]
            stale = sorted(s for s in done if pending and s > min(pending))
            if stale:
                echo(f"resuming {run_dir.run_id}: {', '.join(stale)} passed after {min(pending)}, which runs again: "
                     "they run again too")
                done -= set(stale)
                steps = sorted(set(steps) | set(stale))
                for s in stale:
                    run_dir.record_step(s, status="stale", stale_since=min(pending))
            steps = [s for s in steps if s not in done]
            echo(f"resuming {run_dir.run_id}: skipping {sorted(done) or 'nothing'}")
        else:
            run_dir = RunDir.create(profile.profile_name, results_root or RESULTS_ROOT, redactor).hold("run")
            run_dir.write_json("profile.json", profile.redacted())
            run_dir.write_json("provenance.json", provenance(profile))
            if rehearsal is not None:
                from .lab.rehearsal import record
                run_dir.write_json("rehearsal.json", record(profile, rehearsal))
        if lock is not None:
            lock.name_run(run_dir.run_id)
        run_dir.update_manifest(status="running", mode="headless", dry_run=dry_run,
                                profile_source=str(profile.source), selection=selection)
        if not resume and not dry_run:
            reuse_launch(profile, run_dir, steps, results_root=results_root, echo=echo)
        if console is None:
            echo(f"run {run_dir.run_id}: {len(steps)} step(s) -> {run_dir.path} (each may take up to {step_timeout} s; "
                 "--step-timeout to change)")
        else:
            console.archive_to(run_dir.path / ARCHIVE_NAME, run_dir.redactor.redact)
            echo(f"run {run_dir.run_id} in {_repo_relative(str(run_dir.path))}/ (full stream: {ARCHIVE_NAME}"
                 + ("" if console.verbose else "; -v shows it") + ")")
            console.detail(f"each step may take up to {step_timeout} s (--step-timeout to change)")
        if dry_run:
            echo("dry run: connects to the nodes over SSH and runs their read-only probes; every change is recorded "
                 "(commands.jsonl), not made; a failing step does not stop it. To review without connecting: "
                 f"python -m runbook render --profile {_repo_relative(str(profile.source))}")

        # 5. the steps, in order, stopping at the first failure (a dry run goes on: every step's commands show)
        outcomes: list[StepRun] = []
        for name in steps:
            outcome = execute_step(name, run_dir, profile_path=str(profile.source), dry_run=dry_run,
                                   overrides=overrides, kernel=kernel, step_timeout=step_timeout,
                                   notebooks_dir=notebooks_dir, echo=echo, console=console)
            outcomes.append(outcome)
            if outcome.status != "passed" and not dry_run:
                break
        status = "passed" if outcomes and all(o.status == "passed" for o in outcomes) else "failed"
        if not outcomes:
            status = "passed" if resume else "empty"
        # passed only if what 05-07 measured belongs to the server the run ends with (a resume that restarted it
        # after them, with their results kept, cannot pass)
        other = run_dir.evidence_of_other_servers() if status == "passed" else {}
        for line in other.values():
            echo(f"not passed: {line}")
        if other:
            status = "failed"
        run_dir.update_manifest(status=status, finished=time.time(), **({"other_servers": other} if other else {}))
        # the report page is rewritten once the run's final status is known (the 08 step wrote it
        # while the run was still "running"); a report problem never changes the run's outcome
        try:
            from .report import write_report
            path, model = write_report(run_dir.path, results_root=run_dir.path.parent)
            if console is not None:
                verdict = model.verdict
                console.report(path, "" if verdict is None else verdict.verdict if verdict.validated else
                               f"{verdict.verdict} ({len(verdict.missing)} requirement(s) not met, listed in the report)")
            else:
                echo(f"report: {path}")
        except Exception as exc:  # noqa: BLE001
            if console is not None:
                console.report(None, problem=f"{type(exc).__name__}: {exc}")
            else:
                echo(f"report: not written ({type(exc).__name__}: {exc})")
        run_dir.scrub()
        return run_dir, outcomes
    finally:
        if run_dir is not None:
            run_dir.release()
        if lock is not None:
            lock.release()


def _stop_aside(cluster: Cluster, profile, what: str, *, fix: str, nodes: list[str] | None = None) -> None:
    """Stop another profile's server on the lab's nodes (set aside: its restore command was said); raise when
    anything of it is left. ``nodes``: only these (the lab's nodes now, when that server ran on a larger lab)."""
    from .launch import stop
    failed = stop.stop(cluster, profile, nodes, mem_settle_s=0).checks.failures()
    if failed:
        raise ActionError(what, observed="; ".join(f"{c.node}: {c.observed}" for c in failed)[:500], fix=fix)


def set_lab_server_aside(profile, *, echo: Callable[[str], None] = print, needed_by: str = "the rehearsal") -> str:
    """A rehearsal runs on the lab's nodes and ports: the lab profile's own server (``make runbook`` leaves it
    up) is stopped first, as ``make test`` does, and the command that starts it again is said. Returns the
    fingerprint it ran with ('' when none ran). The rehearsal's own server then stays up like a real one."""
    from .facts import ranks
    from .lab.rehearsal import LAB_PROFILES
    lab_path = LAB_PROFILES.get(profile.node_count)
    if lab_path is None:
        return ""
    asked = load_profile(lab_path)
    with Cluster.from_profile(asked) as cluster:
        before = ranks.rank_state(cluster.head, asked)
    if not before.running:
        return ""
    # every lab profile's head rank keeps its state in the same place: which one runs is told by its ranks' count
    # (`make runbook` on two nodes, then `make rehearse` of a four-node recipe finds env/lab.env's server)
    lab_path = LAB_PROFILES.get(lab_node_count(before.argv) or profile.node_count, lab_path)
    lab = load_profile(lab_path)
    here = [n.name for n in lab.nodes if n.name in {m.name for m in profile.nodes}]
    with Cluster.from_profile(lab) as cluster:
        echo(f"lab: the lab's own server ({lab_path.name}, {before.describe()}) holds the ports {needed_by} "
             f"needs: stopping it; start it again with `python -m runbook start --profile "
             f"{_repo_relative(str(lab_path))}` after `python -m runbook stop --rehearse --profile {profile.source}`")
        _stop_aside(cluster, lab, "the lab's own server could not be set aside for the rehearsal",
                    fix=f"python -m runbook stop --profile {_repo_relative(str(lab_path))}", nodes=here)
    return before.fingerprint


def lab_node_count(argv: str) -> int | None:
    """The node count a running head rank was started for: its serve's ``--nnodes N`` (None when its command line
    does not show it: a Ray head's serve)."""
    m = re.search(r"--nnodes[ =](\d+)", argv)
    return int(m.group(1)) if m else None


def set_rehearsal_server_aside(profile, *, echo: Callable[[str], None] = print) -> str:
    """The other way round from :func:`set_lab_server_aside`: a lab profile's run finds a rehearsal's server (``make
    rehearse`` leaves it up, like a real one) holding the lab's nodes and ports. It is found by asking each shipped
    recipe profile of at least this profile's node count, as ``run --rehearse`` loads it (as root and as the lab's operator), whose
    ranks run on the lab's head; that server is stopped and the command that starts it again is said. A recipe of
    more nodes counts too (a four-node rehearsal, then `make runbook` on two): the lab has just gone back to this
    profile's nodes, so its ranks are stopped on those. Returns the recipe profile set aside ('' when none ran)."""
    from .facts import ranks
    from .lab.netlab.spec import OPERATOR
    from .lab.rehearsal import load_rehearsal
    with Cluster.from_profile(profile) as cluster:
        mine = ranks.rank_state(cluster.head, profile)
    if mine.running or not (mine.processes or mine.container_status):
        return ""           # our own server, or nothing at all: nothing of another profile to set aside
    for path in sorted((REPO_ROOT / "env").glob("*.env")):
        recipe = load_profile(path)
        if recipe.is_lab or recipe.node_count < profile.node_count:
            continue
        for user in ("", OPERATOR):
            rehearsed, _, _ = load_rehearsal(path, ssh_user=user)
            with Cluster.from_profile(rehearsed) as cluster:
                st = ranks.rank_state(cluster.head, rehearsed)
                if not st.running:
                    continue
                as_user = f" --ssh-user {user}" if user else ""
                rel = _repo_relative(str(path))
                echo(f"lab: a rehearsal's server ({rel}{as_user}, {st.describe()}) holds the lab's nodes and ports: "
                     f"stopping it; start it again with `python -m runbook start --rehearse --profile {rel}{as_user}` "
                     f"after `python -m runbook stop --profile {_repo_relative(str(profile.source))}`")
                _stop_aside(cluster, rehearsed, "a rehearsal's server could not be set aside for this lab run",
                            fix=f"python -m runbook stop --rehearse --profile {rel}{as_user}",
                            nodes=[n.name for n in profile.nodes])
            return rel
    return ""


def first_state_gone(profile, run_dir: RunDir, passed: list[str], *, dry_run: bool = False
                     ) -> tuple[str, str] | None:
    """Resume means resume: the first passed step whose state on the nodes is gone, and why (None when all
    are intact). Checked read-only: the server 04 launched (same fingerprint on every rank), and the weights
    manifest 02 wrote on every node that holds a copy."""
    checkable = [s for s in passed if s in STATE_CHECKS]
    if not checkable or dry_run:
        return None
    with Cluster.from_profile(profile) as cluster:
        for name in checkable:
            why = STATE_CHECKS[name](cluster, profile, run_dir.read_sidecar(name))
            if why:
                return name, why
    return None


LAUNCH = records.LAUNCH.id
# the steps that talk to the server 04 launched (find_server reads its record)
SERVER_STEPS = tuple(s.number for s in (records.SMOKE, records.VISION_TOOLS, records.BENCH))


def reuse_launch(profile, run_dir: RunDir, steps: list[str], *, results_root: Path | None = None,
                 echo: Callable[[str], None] = print) -> str:
    """A new run of server steps without 04 (``--only smoke``, ``--from 05``) reuses the server an earlier run's
    04 launched: the latest run of the profile whose 04 passed (``evidence.previous_good_run(step=...)``), when
    its ranks still run that fingerprint and the profile renders the same one. Its 04 record is written into
    this run with a NO-OP row and ``data.reused_from`` (manifest status ``reused``). Returns the run reused,
    or "" (then the step says there is no server, as before)."""
    from .checks import Check, Status
    from .evidence import previous_good_run
    from .lab.site import site_for
    from .launch.plan import launch_plan
    from .records import LaunchRecord, NetworkRecord, RecordError
    if LAUNCH in steps or not any(s[:2] in SERVER_STEPS for s in steps) or run_dir.read_sidecar(LAUNCH):
        return ""
    prev = previous_good_run(run_dir.path, results_root or run_dir.path.parent, step=LAUNCH)
    if prev is None:
        echo(f"no earlier run of {profile.profile_name} whose {LAUNCH} passed: the steps have no server to reuse "
             f"(run {LAUNCH} first)")
        return ""
    earlier = RunDir(prev, run_dir.redactor)
    sidecar = earlier.read_sidecar(LAUNCH) or {}
    try:
        record = earlier.read_record(LaunchRecord)
    except RecordError as err:           # an older runbook's 04: nothing typed to reuse
        echo(f"not reusing the server of run {prev.name}: {err.what}; run {LAUNCH}")
        return ""
    fingerprint = record.fingerprint
    try:
        with Cluster.from_profile(profile) as cluster:
            why = launch.state_left(cluster, profile, sidecar)
            if not why:
                now = launch_plan(cluster, profile, earlier.read_record(NetworkRecord, missing_ok=True),
                                  site=site_for(profile)).fingerprint
                if now != fingerprint:
                    why = (f"the profile now renders fingerprint {now[:12]}, the server of run {prev.name} runs "
                           f"{fingerprint[:12]}")
    except RunbookError as err:          # a node that does not answer: nothing to reuse; the step says why
        why = f"cannot read the nodes ({err.what})"
    if why:
        echo(f"not reusing the server of run {prev.name}: {why}; run {LAUNCH} (it starts, or refuses with the stop "
             "command)")
        return ""
    row = Check(f"server reused from run {prev.name}", node="cluster", status=Status.NOOP,
                observed=f"the server {LAUNCH} of run {prev.name} started still runs fingerprint {fingerprint[:12]} "
                         "on every rank, and the profile renders the same one",
                expected=f"a server for {', '.join(s for s in steps if s[:2] in SERVER_STEPS)}",
                evidence=[f"../{prev.name}/{run_dir.sidecar_rel(LAUNCH)}"])
    run_dir.write_sidecar(LAUNCH, [row.to_record()], {**(sidecar.get("data") or {}), "reused_from": prev.name},
                          "reused", record.model_copy(update={"reused_from": prev.name}))
    run_dir.record_step(LAUNCH, status="reused", reused_from=prev.name, start=time.time(), end=time.time())
    echo(f"{LAUNCH}: reusing the server run {prev.name} launched (fingerprint {fingerprint[:12]}, still running)")
    return prev.name


def _weights_state(cluster, profile, sidecar) -> str:
    """What a resume re-checks before skipping a passed 02: a verified manifest still in the tree 02's record
    names on every node that holds a copy (WEIGHT_SYNC=nfs: the head's). '' when intact, else why not."""
    try:
        rec = records.record_from_sidecar(sidecar, records.WeightsRecord)
    except records.RecordError as err:   # an older run's 02: resume runs it again
        return f"{err.what}: {err.fix}"
    names = {node.name for node in cluster}
    for copy in rec.copies:
        if not copy.own_copy:
            continue
        if copy.node not in names:
            return f"02 put weights on {copy.node}, which this profile no longer names"
        if weights.read_node_manifest(cluster[copy.node], copy.tree) is None:
            return f"no verified weights manifest on {copy.node} in {copy.tree}"
    return ""


STATE_CHECKS = {records.WEIGHTS.id: _weights_state, LAUNCH: launch.state_left}


def execute_step(name: str, run_dir: RunDir, *, profile_path: str, dry_run: bool,
                 overrides: dict[str, str] | None, kernel: str, step_timeout: int,
                 notebooks_dir: Path, echo: Callable[[str], None], console: Console | None = None) -> StepRun:
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    source = notebooks_dir / f"{name}.ipynb"
    parameters = {"profile_path": _repo_relative(profile_path), "run_dir": str(run_dir.path),
                  "dry_run": dry_run}
    if overrides:
        parameters["overrides"] = dict(overrides)
    started = time.time()
    run_dir.record_step(name, notebook=f"notebooks/{name}.ipynb", notebook_sha256=file_sha256(source),
                        parameters=parameters, start=started, status="running")
    if console is None:
        echo(f"--- {name}")
    # executed into a scratch folder: nothing reaches results/ before it is scrubbed
    scratch = Path(tempfile.mkdtemp(prefix=f"runbook-{name}-"))
    scratch_nb = scratch / f"{name}.ipynb"
    status, error, exit_code = "passed", "", 0
    # papermill streams each cell's output through its logger (log_output): masked before any handler sees it
    papermill_log = logging.getLogger("papermill")
    streamed = RedactingFilter(run_dir.redactor)
    papermill_log.addFilter(streamed)
    shown = contextlib.ExitStack()
    engine: dict = {}
    if console is not None:
        # the console's live line follows the stream; the stream itself goes to console.log (and -v)
        handler = console.logging_handler()
        papermill_log.addHandler(handler)
        shown.callback(papermill_log.removeHandler, handler)
        shown.callback(setattr, papermill_log, "propagate", papermill_log.propagate)
        papermill_log.propagate = False
        kernel_out = scratch / "kernel.log"       # the kernel's own stdout/stderr (its transport warning)
        kernel_fd = os.open(kernel_out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        shown.callback(os.close, kernel_fd)
        shown.enter_context(console.follow_file(kernel_out))
        counts = scratch / "progress.log"          # the kernel's counted work (runbook.progress): the live line
        counts.touch(mode=0o600)
        shown.enter_context(console.follow_file(counts, counts=True))
        shown.enter_context(console.step(name, cells=_cell_count(source)))
        engine["kernel_manager_class"] = _kernel_writing_to(kernel_fd, counts)
    try:
        with shown:
            pm.execute_notebook(str(source), str(scratch_nb), parameters=parameters, kernel_name=kernel,
                                cwd=str(REPO_ROOT), execution_timeout=step_timeout, log_output=True,
                                progress_bar=False, report_mode=False, **engine)
    except PapermillExecutionError as exc:
        status, exit_code = "failed", int(exit_status_of(exc.ename))
        error = f"{exc.ename}: {exc.evalue}".strip()
    except Exception as exc:  # kernel death, timeouts, missing kernel: still archive what ran
        status, exit_code = "failed", int(ExitStatus.FAILED)
        error = f"{type(exc).__name__}: {exc}"
    finally:
        logging.getLogger("papermill").removeFilter(streamed)
        run_dir.redactor.add_current()      # a key the step generated (API_HOST beyond loopback) is masked too
        if scratch_nb.exists():
            scrub_tree(scratch, run_dir.redactor)
            dest = run_dir.path / "notebooks" / scratch_nb.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(scratch_nb), str(dest) + ".partial")
            Path(str(dest) + ".partial").replace(dest)
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.time() - started
    if status == "failed" and not _sidecar_written_since(run_dir, name, started):
        write_failure_sidecar(run_dir, name, error, profile_path=profile_path, overrides=overrides,
                              dry_run=dry_run, seconds=seconds)
    run_dir.record_step(name, status=status, end=time.time(), seconds=round(seconds, 2),
                        exit=exit_code, error=run_dir.redactor.redact(error))
    if console is None:
        echo(f"--- {name}: {status} in {seconds:.1f} s" + (f"\n{run_dir.redactor.redact(error)}" if error else ""))
    else:
        sidecar = run_dir.read_sidecar(name) if _sidecar_written_since(run_dir, name, started) else None
        rows = CheckList.from_records((sidecar or {}).get("checks") or [])
        console.step_done(StepResult(name, status, seconds, rows.counts(), run_dir.redactor.redact(error)), rows,
                          where="" if status == "passed" else str(run_dir.path / "notebooks" / f"{name}.ipynb"))
    return StepRun(name, status, seconds, error, exit_code)


def _cell_count(notebook: Path) -> int:
    """The cells papermill will number: the notebook's, plus the parameters cell it injects (0: unreadable)."""
    try:
        return len(json.loads(notebook.read_text()).get("cells", [])) + 1
    except (OSError, ValueError, AttributeError):
        return 0


def _kernel_writing_to(fd: int, counts: Path | None = None):
    """A kernel manager class whose kernel writes its stdout and stderr to ``fd`` (a file: a child that keeps
    the descriptor never blocks on it) instead of this terminal: ipykernel's "running over TCP without
    encryption" warning (ipykernel/kernelapp.py ``init_sockets``) and anything a cell's subprocess writes to the
    kernel's own descriptors. nbclient creates it (``NotebookClient.kernel_manager_class``) and starts the kernel
    through ``start_kernel``, whose keywords reach ``subprocess.Popen`` (jupyter_client/launcher.py).
    ``counts``: the file the kernel's counted work goes to (``runbook.progress.FILE_ENV`` in its environment;
    ``env`` is the kernel's whole environment, jupyter_client/manager.py ``pre_start_kernel``)."""
    from jupyter_client.manager import AsyncKernelManager

    class StepKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            kw.setdefault("stdout", fd)
            kw.setdefault("stderr", fd)
            if counts is not None:
                kw["env"] = {**(kw.get("env") or os.environ), progress.FILE_ENV: str(counts)}
            return await super().start_kernel(**kw)

    return StepKernelManager


class RedactingFilter(logging.Filter):
    """Masks every record of a logger with the run's redactor (the streamed cell output of a step). A key the step
    generates into the secrets file is picked up within a second (``Redactor.add_current``)."""

    def __init__(self, redactor, refresh_s: float = 1.0):
        super().__init__()
        self.redactor, self.refresh_s, self._next = redactor, refresh_s, 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.refresh_s
            try:
                self.redactor.add_current()
            except Exception:  # noqa: BLE001 - a refused secrets file: its values were never loaded, nothing to mask
                pass
        record.msg, record.args = self.redactor.redact(record.getMessage()), None
        return True


SERVER_STEPS_FROM = "04"    # from the launch on, a failure is explained by the server's and fabric's state


def _sidecar_written_since(run_dir: RunDir, name: str, started: float) -> bool:
    path = run_dir.path / run_dir.sidecar_rel(name)
    return path.is_file() and path.stat().st_mtime >= started


def write_failure_sidecar(run_dir: RunDir, name: str, error: str, *, profile_path: str,
                          overrides: dict[str, str] | None, dry_run: bool, seconds: float) -> None:
    """A step that ended in an exception never reached its summary cell: write its sidecar here, with the
    error and (from the launch on) what can be seen of the server and the fabric, so the table says why."""
    rows = [check("step completed", False, node="local", observed=run_dir.redactor.redact(error)[:1500],
                  expected="the notebook ran to its summary cell",
                  fix=f"read notebooks/{name}.ipynb in the run folder for the cell that raised; the rows below "
                      "say what the server and the fabric look like now")]
    if name >= SERVER_STEPS_FROM and not dry_run:
        try:
            profile = load_profile(profile_path, overrides=overrides)
            with Cluster.from_profile(profile, run_dir=run_dir.path, redactor=run_dir.redactor) as cluster:
                rows += health.explain(cluster, profile)
        except Exception as exc:  # noqa: BLE001 - the explanation is best effort; the error row stands
            rows.append(check("state readable", False, node="cluster", observed=f"{type(exc).__name__}: {exc}"[:500],
                              expected="the nodes answer", fix="check ssh to the nodes", cause="node"))
    run_dir.write_sidecar(name, [r.to_record() for r in rows], {"duration_s": round(seconds, 3),
                                                               "written_by": "runner (the step raised)"},
                          "failed")


def run_folder(resume: str, results_root: Path | None) -> Path:
    """The run folder to resume: a folder directly under the results root that the runbook made (its manifest
    names it). Anything else is refused before it is read, written or scrubbed."""
    root = (results_root or RESULTS_ROOT).resolve()
    given = Path(resume)
    candidate = (given if given.is_absolute() or given.parent != Path(".") else root / given).resolve()
    if candidate.parent != root:
        raise UsageError(f"{resume!r} is not a run folder under {root}",
                         fix="give a run id listed under results/ (the runbook resumes only the folders it made)")
    try:
        manifest = json.loads((candidate / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = None
    if not candidate.is_dir() or not isinstance(manifest, dict) or manifest.get("run_id") != candidate.name \
            or "version" not in manifest or candidate.is_symlink():
        raise UsageError(f"no run {resume!r} to resume under {root}",
                         observed="no folder" if not candidate.is_dir() else "no manifest.json the runbook wrote",
                         fix="give a run id listed under results/")
    return candidate


def _repo_relative(path: str) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)
