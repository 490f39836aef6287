"""The one client session of a serve step (05 smoke, 06 vision and tools): its client, its archive, the serving
watchdog, and the close at the end of the step (:func:`step_session`)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ..checks import Check
from .server_info import ApiClient, Archive, connect
from .watchdog import watching

__all__ = ["step_session"]


@contextlib.contextmanager
def step_session(profile, run_dir: str | Path, raw_prefix: str, *, add: Callable[[Check], None],
                 keep: Callable[[Archive], None], dry_run: bool = False, base_url: str = "",
                 model: str = "") -> Iterator[tuple[ApiClient | None, Archive]]:
    """The client for the step's server (None in a dry run) and the step's :class:`Archive` (``raw_prefix``:
    ``raw/05_smoke``), under the serving watchdog (its row to ``add``; not for a server passed in by ``base_url``:
    it is not the profile's). At the end, even when a case raised, ``keep`` records what was asked (the step's
    raw files and data) and the client is closed: no notebook keeps an open connection::

        with step_session(step.profile, step.run.path, f"raw/{step.name}", add=step.add, keep=step.keep,
                          dry_run=step.dry_run, base_url=base_url) as (client, rec):
            step.add(run_smoke(client, step.profile, rec, dry_run=step.dry_run))
    """
    client = connect(profile, run_dir, dry_run=dry_run, base_url=base_url, model=model)
    rec = Archive(raw_prefix)
    try:
        with watching(profile, add, dry_run=dry_run) if not base_url else contextlib.nullcontext():
            yield client, rec
    finally:
        try:                                 # what was asked before a crash is evidence too
            keep(rec)
        finally:
            if client is not None:
                client.close()
