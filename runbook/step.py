"""What a notebook calls: ``begin`` (validation + provenance) and ``Step.finish`` (summary).

    step = runbook.step.begin("00_preflight", profile_path, run_dir=run_dir, dry_run=dry_run)
    outcome = runbook.preflight.run(step)     # every step's run returns a StepOutcome: outcome.shown is displayed
    step.finish()        # table, sidecar, raises CheckFailed on any FAIL

Run interactively (``run_dir`` empty) a step opens a new run folder of its own, so interactive
and headless runs leave the same evidence layout.

``begin`` attaches the profile's site (``step.site``: ``runbook.lab.site.site_for(profile)``, the one builder):
what differs between the Sparks, the lab and a rehearsal reaches a step package through it, never through an
import of ``runbook.lab`` (docs/DESIGN.md, "The site"). That is why this module sits above the lab and below the
steps in the layer drawing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from . import progress
from .checks import Check, CheckList, Status
from .evidence import RESULTS_ROOT, RunDir, provenance
from .lab.site import site_for
from .profile import Profile, load_profile
from .records import Record
from .remote import Cluster
from .secrets import redactor_from_env
from .site import Site


@dataclass(frozen=True)
class StepOutcome:
    """What every step's ``run(step, …)`` returns (``step.outcome(shown)``): what its notebook shows, the status of
    the step's rows when ``run`` returned, and the step's typed record if it has one. The notebook keeps it as
    ``outcome`` and displays ``outcome.shown``; ``step.finish()`` still renders the table and raises on a FAIL."""
    step: str                           # the step's name, e.g. "03_engram"
    shown: Any                          # what the notebook displays: a figure, figures, the launch's plan and start…
    status: str                         # "passed" | "failed": the rows recorded so far (Step.status)
    record: Record | None = None        # the typed record run set (runbook.records), None for a step without one


class Step:
    def __init__(self, name: str, profile: Profile, run: RunDir, *, site: Site, dry_run: bool = False):
        self.name = name
        self.profile = profile
        self.site = site                        # what differs on this site (runbook.site): site_for(profile)
        self.run = run
        self.dry_run = dry_run
        self.checks = CheckList()
        self.data: dict[str, Any] = {}
        self.record: Record | None = None       # the facts later steps read (runbook.records), set by run()
        self.started = time.monotonic()
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        """Connections to the nodes; opened lazily on first use."""
        if self._cluster is None:
            self._cluster = Cluster.from_profile(self.profile, run_dir=self.run.path,
                                                 dry_run=self.dry_run, redactor=self.run.redactor)
        return self._cluster

    @property
    def raw_dir(self) -> Path:
        return self.run.path / "raw" / self.name

    def add(self, items: Check | Iterable[Check]) -> None:
        self.checks.add(items)

    def raw(self, name: str, text: str) -> str:
        """Archive a raw tool output under raw/<step>/; returns its run-relative path."""
        return self.run.write_raw(self.name, name, text)

    def archive(self, raw: dict[str, str]) -> list[str]:
        """Archive several raw outputs at once (name -> text); returns their run-relative paths."""
        return [self.raw(name, text) for name, text in raw.items()]

    def keep(self, archive) -> None:
        """Record what an ``api.server_info.Archive`` holds: its raw files under raw/<step>/, its data."""
        self.archive(archive.files)
        self.data.update(archive.data)

    def status(self) -> str:
        return "failed" if self.checks.failures() else "passed"

    def outcome(self, shown: Any = None) -> StepOutcome:
        """What ``run`` returns: ``shown`` (what the notebook displays) with the status and record as they are now."""
        return StepOutcome(self.name, shown, self.status(), self.record)

    def finish(self, display: bool = True) -> None:
        """Render the table, write the sidecar and manifest entry, raise if any check failed."""
        try:
            if self._cluster is not None:
                self._cluster.close()
            status = self.status()
            self.data.setdefault("duration_s", round(time.monotonic() - self.started, 3))
            counted = progress.finals()
            if counted:                 # the step's counted work as it ended (the sidecar is masked as written)
                self.data["progress"] = counted
            self.run.write_sidecar(self.name, self.checks.to_records(), self.data, status, self.record)
            self.run.record_step(self.name, checks=self.checks.counts(), check_status=status,
                                 sidecar=self.run.sidecar_rel(self.name))
            if display:
                show_table(self.checks)
        finally:
            self.run.scrub()
        self.checks.raise_on_failure(self.name)


def begin(name: str, profile_path: str | Path, *, run_dir: str | Path = "", dry_run: bool = False,
          overrides: dict[str, str] | None = None, results_root: Path | None = None) -> Step:
    """Validate the profile (raises ProfileError before any connection) and open the run dir."""
    profile = load_profile(profile_path, overrides=overrides)
    redactor = redactor_from_env()
    if run_dir:
        run = RunDir(Path(run_dir), redactor)
    else:
        run = RunDir.create(profile.profile_name, results_root or RESULTS_ROOT, redactor)
        run.write_json("profile.json", profile.redacted())
        run.write_json("provenance.json", provenance(profile))
        run.update_manifest(mode="interactive")
    run.record_step(name, kernel_started=time.time(), dry_run=dry_run)
    progress.reset()                    # this step's counts only (a kernel may run one step after another)
    return Step(name, profile, run, site=site_for(profile), dry_run=dry_run)


_STATUS_COLOURS = {Status.PASS.value: "#d4edda", Status.FAIL.value: "#f8d7da",
                   Status.WARN.value: "#fff3cd", Status.NA.value: "#e2e3e5", Status.NOOP.value: "#d1ecf1",
                   Status.SIMULATED.value: "#e8dff5"}


def show_table(checks: CheckList) -> None:
    """A styled table in Jupyter, plain text elsewhere (headless logs)."""
    print(checks.to_text())
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is None:
        return
    frame = checks.to_frame()
    styled = frame.style.apply(
        lambda col: [f"background-color: {_STATUS_COLOURS.get(v, '')}" for v in col], subset=["status"])
    display(styled.hide(axis="index"))
