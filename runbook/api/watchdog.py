"""The serving watchdog: a server can answer ``/health`` with 200 while it no longer completes requests
(reported on GB10 for days: ``num_requests_running`` stuck, no generation tokens). While steps 05-07 run,
and as ``python -m runbook watch``, it scrapes ``/metrics`` every few seconds and fires when requests are
running or waiting but the generation-token counter has not moved for ``stall_s`` seconds, or when the API
stops answering; when it fires it checks the fabric (link state, pings both ways) and each rank, so the
alert says which it is.

    with watching(profile, step.add, dry_run=step.dry_run):   # its "serving watchdog" row goes to step.add
        ...requests...
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..checks import Check, Status, check
from ..errors import RunbookError
from ..facts.prom import MetricsSnapshot
from ..remote import Cluster
from ..secrets import load_secrets
from .server_info import ApiClient, ServerInfo
from . import health
from .endpoint import base_url

GENERATED = "vllm:generation_tokens_total"
PROMPTED = "vllm:prompt_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
INTERVAL_S = 2.0
STALL_S = 20.0          # the lab: caught within 30 s (the stall plus one scrape and the fabric checks)
# on Sparks a published 262k-token prefill runs ~130 s at ~2k tok/s without a generated token, and vLLM may
# count its prompt tokens only when it completes: the stall limit there must be longer than the longest prefill
RECIPE_STALL_S = 180.0


def stall_for(profile) -> float:
    return STALL_S if profile.is_lab or profile.rehearsal else RECIPE_STALL_S


@dataclass
class Alert:
    at_s: float                       # seconds after the watch started
    kind: str                         # "wedge" | "api-gone"
    observed: str
    rows: list[Check] = field(default_factory=list)   # the fabric and rank rows checked when it fired
    since_s: float | None = None      # when the stall began (the last scrape that saw progress), after the watch start

    @property
    def after_s(self) -> float:
        """Seconds from the stall's start to the alert (the watch start when no start is known)."""
        return round(self.at_s - (self.since_s or 0.0), 1)

    def explanation(self) -> str:
        bad = [f"{r.name}@{r.node}: {r.observed}" for r in self.rows if r.failed]
        if bad:
            return "; ".join(bad)
        if not self.rows:
            return "fabric and ranks not checked"
        return "fabric up and pingable, every rank running and none frozen"

    def headline(self) -> str:
        since = f" (stalled since {self.since_s:.0f} s into the watch)" if self.since_s is not None else ""
        return f"{self.kind} {self.after_s:.0f} s after it began{since}"


class Watchdog:
    """A background thread over one server. ``alerts`` fills as it fires; ``stop()`` ends it."""

    def __init__(self, profile, *, interval_s: float = INTERVAL_S, stall_s: float | None = None,
                 check_nodes: bool = True, echo=print):
        self.profile, self.check_nodes = profile, check_nodes
        self.interval_s, self.echo = interval_s, echo
        self.stall_s = stall_for(profile) if stall_s is None else stall_s
        self.alerts: list[Alert] = []
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="serving-watchdog", daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        try:
            server = ServerInfo(base_url(self.profile), self.profile.served_model_name,
                                api_key=load_secrets().api_key)
        except RunbookError as exc:     # the SSH forward to a loopback-bound API could not open
            self._fire("api-gone", exc.what)
            return
        last_count: float | None = None
        moved_at = last_ok = time.monotonic()
        firing = ""
        with ApiClient(server, timeout=5) as api:
            while not self._stop.wait(self.interval_s):
                ex = api.get("/metrics")
                now = time.monotonic()
                self.scrapes += 1
                if ex.status != 200 or not isinstance(ex.body, str):
                    if firing != "api-gone":
                        firing = "api-gone"
                        self._fire("api-gone", f"/metrics: {ex.status or ex.error}", since=last_ok)
                    continue
                last_ok = now
                snap = MetricsSnapshot.from_text(now, ex.body)
                # progress is any token processed: generated, or prompt tokens of a long prefill
                count = (snap.total(GENERATED) or 0.0) + (snap.total(PROMPTED) or 0.0)
                busy = (snap.total(RUNNING) or 0.0) + (snap.total(WAITING) or 0.0)
                if last_count is None or count != last_count or busy == 0:
                    last_count, moved_at = count, now
                    firing = ""
                    continue
                if now - moved_at >= self.stall_s and firing != "wedge":
                    firing = "wedge"
                    self._fire("wedge", f"{busy:.0f} request(s) running/waiting, no token processed ({GENERATED} + "
                                        f"{PROMPTED} stuck at {count:.0f}) for {now - moved_at:.0f} s while "
                                        "/metrics answers", since=moved_at)

    def _fire(self, kind: str, observed: str, since: float | None = None) -> None:
        rows: list[Check] = []
        if self.check_nodes:
            try:    # its own connections: the step's cluster belongs to the step's thread
                with Cluster.from_profile(self.profile) as cluster:
                    rows = health.fabric_rows(cluster, self.profile) + [
                        r for r in health.server_rows(cluster, self.profile) if r.name != "server answers /health"]
            except Exception as exc:  # noqa: BLE001 - the alert stands without its explanation
                rows = [check("state readable", False, node="cluster", observed=str(exc)[:300])]
        since_s = round(max(0.0, since - self._t0), 1) if since is not None else None
        alert = Alert(round(time.monotonic() - self._t0, 1), kind, observed, rows, since_s)
        self.alerts.append(alert)
        self.echo(f"[watchdog] {alert.headline()}: {observed} -- {alert.explanation()}")

    def check(self) -> Check:
        """The step's row: PASS when it never fired over a watch that really scraped."""
        if not self.alerts:
            return Check("serving watchdog", node="head", status=Status.PASS if self.scrapes else Status.NA,
                         observed=f"{self.scrapes} scrapes, generation never stalled with requests pending",
                         expected=f"tokens flow whenever requests run (stall limit {self.stall_s:.0f} s)")
        first = self.alerts[0]
        return check("serving watchdog", False, node="head",
                     observed=f"{first.headline()}: {first.observed}; seen: {first.explanation()}",
                     expected=f"tokens flow whenever requests run (stall limit {self.stall_s:.0f} s)",
                     fix="a wedge with a healthy fabric: restart both ranks together (python -m runbook stop, then "
                         "04_launch); with a fabric row failing: fix that link first",
                     data={"alerts": [{"at_s": a.at_s, "since_s": a.since_s, "after_s": a.after_s, "kind": a.kind,
                                       "observed": a.observed, "explanation": a.explanation()} for a in self.alerts]})


@contextlib.contextmanager
def watching(profile, add: Callable[[Check], None], *, dry_run: bool = False, **kw):
    """Run a watchdog over the profile's server for the block; its row goes to ``add`` (the step's) afterwards.
    Nothing runs in a dry run."""
    if dry_run:
        yield None
        return
    dog = Watchdog(profile, **kw).start()
    try:
        yield dog
    finally:
        dog.stop()
        add(dog.check())
