"""Which tests `make test` runs in the lab group (one xdist worker, in collection order): tests/conftest.py's
scheduler asks ``in_lab_group``; tests/unit/test_lab_group.py checks it. Here, not in conftest, because
``import conftest`` from a test finds whichever conftest module pytest loaded last."""
from __future__ import annotations

import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
LAB = TESTS / "lab"


@functools.lru_cache(maxsize=None)
def _source(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def _marked(path: str, mark: str) -> bool:
    """A test file that marks itself (module ``pytestmark``): read from its source, because xdist's scheduler sees
    node ids only. ``timed`` files judge wall-clock, so they join the lab group; ``own_netns`` files under tests/lab
    build their own namespaces (``lab.switchlab``) and never touch the embedded lab, so they need not wait for it."""
    return f"pytest.mark.{mark}" in _source(path)


def in_lab_group(nodeid: str) -> bool:
    """Lab tests (one machine-wide resource, shared session fixtures) and the tests of files marked ``timed`` (they
    judge wall-clock against the reference server, so a starved worker would fail them): one worker, in order."""
    path = TESTS.parent / nodeid.split("::", 1)[0]
    if path.suffix != ".py" or not path.is_file():
        return LAB in path.parents
    if LAB in path.parents:
        return not _marked(str(path), "own_netns")
    return _marked(str(path), "timed")
