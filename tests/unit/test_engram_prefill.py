"""Step 05's ``context.engram_prefill`` row (issue 34 item 2): the needles' measured prefill against recipe A's
published prefill with attached Engram; a WARN naming the fallback's 25-50 % slower prefill when far below it."""
from __future__ import annotations

from runbook.checks import Check, Status
from runbook.profile import REPO_ROOT, load_profile
from runbook.smoke import cases

ENV = REPO_ROOT / "env"


def _needle(tokens: int, tok_s: float | None, status: Status = Status.PASS) -> Check:
    return Check(name=f"context.needle.{tokens}", node="head", status=status,
                 data={"prompt_tokens": tokens, "prefill_tok_s": tok_s})


def test_expected_prefill_follows_the_published_points():
    assert cases.expected_engram_prefill(8192) == 1041.0
    assert cases.expected_engram_prefill(28_000) == 1008.0
    assert 965.0 < cases.expected_engram_prefill(32768) < 1008.0
    assert cases.expected_engram_prefill(200_000) == 965.0


def test_a_prefill_like_the_fallback_warns_naming_it():
    profile = load_profile(ENV / "exl3-v41.env")
    needles = [_needle(8192, 1010.0), _needle(32768, 620.0), _needle(131072, 300.0), _needle(262144, 200.0)]
    row = cases.engram_prefill_check(profile, needles)
    assert row.name == cases.ENGRAM_PREFILL_ROW and row.status is Status.WARN
    assert "620 tok/s at 32,768 tokens" in row.observed and "131,072" not in row.observed   # outside the figures
    assert "25-50 % slower prefill" in row.fix and "engram attached" in row.fix
    assert [p["tokens"] for p in row.data["points"]] == [8192, 32768]


def test_a_prefill_near_the_published_one_passes():
    profile = load_profile(ENV / "exl3-v41.env")
    row = cases.engram_prefill_check(profile, [_needle(8192, 960.0), _needle(32768, 900.0)])
    assert row.status is Status.PASS, row


def test_no_figure_engram_off_and_the_lab_are_na():
    profile = load_profile(ENV / "exl3-v41.env")
    assert cases.engram_prefill_check(profile, [_needle(32768, None), _needle(32768, 500.0, Status.FAIL)]
                                      ).status is Status.NA
    assert cases.engram_prefill_check(profile, []).status is Status.NA
    off = load_profile(ENV / "exl3-v41.env", {"ENGRAM": "0"})
    assert "ENGRAM=0" in cases.engram_prefill_check(off, [_needle(32768, 100.0)]).observed
    lab = load_profile(ENV / "lab.env")
    assert cases.engram_prefill_check(lab, [_needle(512, 10.0)]).status is Status.NA
    seed_b = load_profile(ENV / "dspark-v4.env")
    assert cases.engram_prefill_check(seed_b, [_needle(32768, 10.0)]).status is Status.NA
