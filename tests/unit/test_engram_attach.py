"""Engram attach (issue 34 item 2): the rank's own report that its packed shards were attached, parsed
(facts/engram_log.py) and turned into step 04's ``engram attached`` row per rank (launch/engram_attach.py).

The log lines are the ones recipe A's file backend prints, in the exact formats of the fork copy
(Englishtartar2028/DeepSeek-v4.1-Flash-EXL3-2x-DGX-Sparks @ e2944b3: overlay/engram_file_backend.py:361-367,
:142-150, overlay/row_store.cpp:399-407, :84), filled in with V4.1's TP=2 row ranges (docs/engram.md); vLLM's
worker prefix and timestamps in front, as a real multi-process rank writes them.
"""
from __future__ import annotations

from runbook.checks import CheckList, Status
from runbook.facts import engram_log
from runbook.launch import engram_attach, server
from runbook.launch.render import NodeFacts, render
from runbook.profile import REPO_ROOT, load_profile

ENV = REPO_ROOT / "env"
HOME = "/home/spark"
R0 = (0, 192001740)
R1 = (192001740, 384006168)

LOADED = "(Worker_TP0 pid=412) File-backed Engram layer={l} rank={r}/2 rows=[{lo},{hi}) cache=0.0GiB packed={p}"
LOGGED = ("(Worker_TP0 pid=412) INFO 12-05 09:12:01 [engram_file_backend.py:350] File-backed Engram layer={l} "
          "rank={r}/2 rows=[{lo},{hi}) cache=0.0GiB scales=0.0GiB packed={p} (not pinned 47GiB UVA)")
IGNORED = ("Engram: packed shard /engram-packed/engram-l{l}-r{r}of2.bin does not match this rank "
           "(layer={l} lo={lo} hi={hi}); ignoring, using checkpoint")
STATS = ("(Worker_TP1 pid=77) INFO 12-05 10:01:00 [engram_file_backend.py:142] Engram layer={l} lookups=4096 "
         "hit_rate=0.0% reads=4096 cache=0.0GiB packed={p}")
ABORT = "Engram retrieval failed: packed Engram shard has no header (errno=0)"
BUFFERED = ("Engram: O_DIRECT unavailable for /engram-src/model-00047-of-00048.safetensors, using buffered reads "
            "(errno was 22)")
NOISE = "(EngineCore pid=300) INFO 12-05 09:12:40 [kv_cache_utils.py:2327] GPU KV cache size: 774,400 tokens"


def _boot(rank: int, packed: bool = True, *, ignored_layers=()) -> str:
    lo, hi = R0 if rank == 0 else R1
    lines = [NOISE, BUFFERED]
    for layer in (1, 14):
        if layer in ignored_layers:
            lines.append(IGNORED.format(l=layer, r=rank, lo=lo, hi=hi))
        ok = packed and layer not in ignored_layers
        lines.append(LOGGED.format(l=layer, r=rank, lo=lo, hi=hi, p=ok))
        lines.append(LOADED.format(l=layer, r=rank, lo=lo, hi=hi, p=ok))
    return "\n".join(lines) + "\n"


def _plan(name="exl3-v41", overrides=None, packed=(True, True)):
    profile = load_profile(ENV / f"{name}.env", overrides)
    facts = {"head": NodeFacts(home=HOME, packed_engram=packed[0]), "worker": NodeFacts(home=HOME, packed_engram=packed[1])}
    return profile, render(profile, facts)


def _rows(checks) -> dict[str, object]:
    rows = {c.node: c for c in checks if c.name == engram_attach.ROW}
    assert rows, CheckList(checks).to_text()
    return rows


# ------------------------------------------------------------------------------------------- the parser

def test_parser_reads_every_line_of_an_attached_rank():
    rep = engram_log.parse_engram_log(_boot(1))
    assert sorted(rep.layers) == [(1, 1), (14, 1)]
    a = rep.layers[(14, 1)]
    assert (a.layer, a.rank, a.tp, a.lo, a.hi, a.packed) == (14, 1, 2, *R1, True)
    assert a.line.startswith("(Worker_TP0 pid=412) File-backed Engram layer=14")
    assert rep.buffered == ["/engram-src/model-00047-of-00048.safetensors"]
    assert not rep.ignored and not rep.aborts and rep.said_anything


def test_parser_reads_the_fallback_the_abort_and_the_stats_lines():
    rep = engram_log.parse_engram_log(_boot(0, ignored_layers=(14,)) + ABORT + "\n"
                                      + STATS.format(l=1, p="True") + "\n" + STATS.format(l=14, p="False"))
    (ign,) = rep.ignored
    assert (ign.path, ign.layer, ign.lo, ign.hi) == ("/engram-packed/engram-l14-r0of2.bin", 14, *R0)
    assert rep.layers[(14, 0)].packed is False and rep.layers[(1, 0)].packed is True
    assert rep.aborts == ["packed Engram shard has no header"]
    assert {k: (s.lookups, s.packed) for k, s in rep.stats.items()} == {1: (4096, True), 14: (4096, False)}


def test_parser_finds_nothing_in_a_log_without_engram_lines():
    rep = engram_log.parse_engram_log(NOISE + "\n[dsv41-exl3-head] start chain complete: 16 steps applied\n")
    assert not rep.said_anything and rep.to_dict() == {"layers": [], "ignored": [], "stats": [], "aborts": [],
                                                        "buffered": []}


# ------------------------------------------------------------------------------------------- the row

def test_every_rank_attached_passes():
    profile, plan = _plan()
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": _boot(0), "worker": _boot(1)}))
    assert set(rows) == {"head", "worker"} and all(c.status is Status.PASS for c in rows.values())
    assert "packed=True" in rows["worker"].observed
    assert rows["worker"].data["packed_files"] == ["~/dsv41-engram/engram-l1-r1of2.bin",
                                                   "~/dsv41-engram/engram-l14-r1of2.bin"]


def test_a_header_mismatch_fails_naming_the_file_and_the_fix():
    profile, plan = _plan()
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": _boot(0),
                                                             "worker": _boot(1, ignored_layers=(14,))}))
    assert rows["head"].status is Status.PASS
    bad = rows["worker"]
    assert bad.status is Status.FAIL and "ignoring, using checkpoint" in bad.observed
    assert "engram-l14-r1of2.bin" in bad.fix and "engram-l1-r1of2.bin" not in bad.fix
    assert "step 03" in bad.fix and "header" in bad.fix and "25-50 %" in bad.fix


def test_a_rank_that_said_nothing_fails_and_a_missing_file_fails():
    profile, plan = _plan(packed=(True, False))
    silent = NOISE + "\n"
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": silent, "worker": _boot(1, packed=False)}))
    assert rows["head"].status is Status.FAIL and "said nothing" in rows["head"].observed
    bad = rows["worker"]
    assert bad.status is Status.FAIL and "packed=False" in bad.observed
    assert "no packed file was mounted" in bad.fix and "~/dsv41-engram/engram-l1-r1of2.bin" in bad.fix
    assert "DSV41_PACKED_DIR" not in plan.rank("worker").env            # seed A: not mounted where missing


def test_an_abort_fails():
    profile, plan = _plan()
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": _boot(0), "worker": ABORT}))
    assert rows["worker"].status is Status.FAIL and "no header" in rows["worker"].observed


def test_a_reused_server_reads_the_stats_lines_or_is_na():
    profile, plan = _plan()
    tail = STATS.format(l=1, p="True") + "\n" + STATS.format(l=14, p="True")
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": tail, "worker": NOISE}, reused=True))
    assert rows["head"].status is Status.PASS and rows["worker"].status is Status.NA
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": STATS.format(l=1, p="False"), "worker": NOISE},
                                             reused=True))
    assert rows["head"].status is Status.FAIL


def test_engram_off_and_seed_b_are_na():
    profile, plan = _plan(overrides={"ENGRAM": "0"})
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": "", "worker": ""}))
    assert all(c.status is Status.NA and "ENGRAM=0" in c.observed for c in rows.values())
    profile, plan = _plan("dspark-v4")
    rows = _rows(engram_attach.attach_checks(profile, plan, {"head": "", "worker": ""}))
    assert all(c.status is Status.NA for c in rows.values())


def test_the_row_is_computed_after_readiness_with_the_other_boot_log_rows():
    """server._after_wait adds it beside the marker rows: a start whose worker fell back does not pass."""
    profile, plan = _plan()
    result = server.StartResult(plan=plan, base_url="http://127.0.0.1:8888")
    result.readiness.port_open = result.readiness.health = result.readiness.models = 1.0
    result.readiness.first_token = 2.0
    logs = {"head": _boot(0), "worker": _boot(1, ignored_layers=(1, 14))}

    class Cluster:                                 # what cluster.each(ranks.log_text) returns per node
        def each(self, fn):
            return dict(logs)

    server._after_wait(Cluster(), profile, plan, result, lambda name, text: "", False, t0=0.0, started=True,
                       cleanup=False, failure=None, diagnostics={}, stopped_already=False, kept_logs={})
    rows = _rows(result.checks)
    assert rows["head"].status is Status.PASS and rows["worker"].status is Status.FAIL
    assert not result.ok
