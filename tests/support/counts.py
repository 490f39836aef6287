"""What the one progress channel (``runbook.progress``) showed, kept for a test: ``with seeing() as seen:`` routes
every count of the process to a :class:`Seen` sink (and forgets the final counts before and after)."""
from __future__ import annotations

import contextlib
import threading

from runbook import progress


class Seen:
    """A sink that keeps what the channel showed: ``shown`` (label, done, total, final) and the ``lines``."""

    def __init__(self):
        self.shown: list[tuple[str, float, float, bool]] = []
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def show(self, counter, text, final):
        with self._lock:
            self.shown.append((counter.label, counter.done, counter.total, final))
            self.lines.append(text)

    def of(self, label):
        return [s for s in self.shown if s[0] == label]


@contextlib.contextmanager
def seeing():
    """Every count goes to a fresh :class:`Seen` while inside; the sink is chosen again afterwards."""
    sink = Seen()
    progress.use(sink)
    progress.reset()
    try:
        yield sink
    finally:
        progress.use(None)
        progress.reset()


def assert_rising_to_the_end(shown, *, at_total: bool = True):
    """Shown counts rise (never back) and the last one is final (``at_total``: and at its total; a wait that ended
    early does not reach its limit)."""
    assert shown, "nothing was counted"
    done = [s[1] for s in shown]
    assert done == sorted(done), done
    label, last, total, final = shown[-1]
    assert final, shown[-1]
    if at_total:
        assert last == total, shown[-1]
