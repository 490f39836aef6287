"""TP2 x PP2 on four lab nodes (issue 39 item 2, env/lab-tp2pp2.env): the profile loads, validates, plans and renders
offline; every step places the stage-1 nodes (ranks 2 and 3: TP ranks 0 and 1 of stage 1, vLLM numbering TP
innermost) -- Engram packs per TP rank within the stage, the roofline pays the pipeline bubble, the report's per-rank
table names each rank's stage -- and validate refuses a layout whose TP x PP is not one rank per node."""
from __future__ import annotations

import pytest

from runbook import cli
from runbook.benchmark.roofline_panel import rank_rows
from runbook.engram import packing, precheck, read_probe
from runbook.engram_tools import synth
from runbook.errors import ProfileError
from runbook.fit import roofline as R
from runbook.launch import engram_attach
from runbook.launch.render import NodeFacts, render
from runbook.profile import REPO_ROOT, load_profile

ENV = REPO_ROOT / "env"
NAMES = ["head", "worker", "worker2", "worker3"]


def pp2(**ov):
    return load_profile(ENV / "lab-tp2pp2.env", {k: str(v) for k, v in ov.items()}, environ={})


def refused(**ov) -> list:
    with pytest.raises(ProfileError) as err:
        pp2(**ov)
    return err.value.issues


# ----------------------------------------------------------------------------- the profile and validate

def test_the_profile_is_lab_tp4_with_two_stages_compiled():
    p, tp4 = pp2(), load_profile(ENV / "lab-tp4.env", environ={})
    assert (p.tp, p.pp, p.nnodes, p.node_count, p.topology) == (2, 2, 4, 4, "switch")
    assert p.enforce_eager is False and p.hf_model_repo == tp4.hf_model_repo == "spark-runbook/tiny-tp4"
    diff = {k for k in type(p).model_fields if k != "profile_name" and getattr(p, k) != getattr(tp4, k)}
    assert diff == {"tp", "pp", "enforce_eager", "ready_timeout"}, diff
    assert [(p.tp_rank(n.rank), p.pp_stage(n.rank)) for n in p.nodes] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert all(p.holds_rank(n.rank) for n in p.nodes) and not p.holds_rank(4)


def test_validate_refuses_tp_x_pp_other_than_one_rank_per_node_naming_the_keys():
    for ov, words in (({"PP": 3}, "TP=2 x PP=3 = 6 but NNODES=4"), ({"TP": 4}, "TP=4 x PP=2 = 8 but NNODES=4"),
                      ({"TP": 1}, "TP=1 x PP=2 = 2 but NNODES=4")):
        iss = refused(**ov)
        hit = [i for i in iss if words in i.message]
        assert hit and hit[0].key in ("TP", "PP", "NNODES"), (ov, iss)
        assert "TP x PP = 4" in hit[0].fix or "TP=4 and PP=1" in hit[0].fix
    eager = refused(ENFORCE_EAGER=1)
    assert [i.key for i in eager] == ["ENFORCE_EAGER"] and "cpu_model_runner.py:84-86" in eager[0].message
    spec = refused(SPEC_METHOD="dspark", SPEC_TOKENS=2)
    assert "PP" in [i.key for i in spec]


def test_validate_and_plan_and_render_run_offline(capsys):
    assert cli.main(["validate", "--profile", "env/lab-tp2pp2.env"]) == 0
    assert "topology switch" in capsys.readouterr().out
    assert cli.main(["render", "--profile", "env/lab-tp2pp2.env", "--step", "04"]) == 0
    text = capsys.readouterr().out
    for rank, node in enumerate(NAMES):
        start = [ln for ln in text.splitlines() if ln.startswith(f"[{node}] [run] ") and " serve " in ln]
        assert len(start) == 1, node
        assert "--tensor-parallel-size 2 --pipeline-parallel-size 2" in start[0] and f"--node-rank {rank}" in start[0]
        assert "--enforce-eager" not in start[0] and "--nnodes 4" in start[0]


def test_plan_prints_the_decode_ceiling_with_the_bubble(capsys):
    cli.main(["plan", "--profile", "env/lab-tp2pp2.env"])      # FITS or not: this host's MemAvailable right now
    out = capsys.readouterr().out
    assert "per rank at TP=2 x PP=2" in out
    assert "each rank idles 50% of a step (the bubble)" in out
    assert "ceiling (lab CPU):" in out and "2 stages x " in out and "1 stage hop(s)" in out


# ----------------------------------------------------------------------------- Engram per TP rank within the stage

def test_every_stage_packs_its_tp_ranks_shards():
    p = pp2()
    plans = packing.plan_pack(p)
    assert [n for n, cmds in plans.items() if cmds] == NAMES          # no node skipped: every node runs a rank
    ranks = {n: cmds[1].split("--rank ")[1].split()[0] for n, cmds in plans.items()}
    assert ranks == {"head": "0", "worker": "1", "worker2": "0", "worker3": "1"}
    assert all("--tp 2" in cmds[1] for cmds in plans.values())
    files = precheck.expected_files(p, synth.engram_text_config(2000))
    assert list(files) == NAMES
    for twin, of in (("worker2", "head"), ("worker3", "worker")):      # stage 1 packs stage 0's ranges
        assert [(r.file_name, r.lo, r.hi) for r in files[twin]] == [(r.file_name, r.lo, r.hi) for r in files[of]]
    assert files["head"][0].file_name == "engram-l1-r0of2.bin" and files["head"][0].hi != files["worker"][0].hi
    probes = read_probe.plan_probe(p)
    assert "engram-l1-r0of2.bin" in probes["worker2"] and "engram-l1-r1of2.bin" in probes["worker3"]
    assert [engram_attach.tp_ranks(p, r) for r in range(4)] == [[0], [1], [0], [1]]


def test_the_engram_record_gives_each_node_its_tp_rank_and_stage():
    p = pp2()
    facts = {n: {"rank": r} for r, n in enumerate(NAMES)}
    rec = packing.engram_record(p, facts, {})
    assert [(r.node, r.rank, r.stage) for r in rec.ranks] == [("head", 0, 0), ("worker", 1, 0),
                                                              ("worker2", 0, 1), ("worker3", 1, 1)]


# ----------------------------------------------------------------------------- the roofline and the report's rows

def _roof(pp: int) -> R.Roofline:
    p = pp2(PP=pp, TP=4 // pp)
    return R.roofline_for(p)


def test_the_ceiling_at_one_stream_pays_the_bubble():
    tp2pp2, tp2 = _roof(2), R.Roofline(_roof(2).step, _roof(2).config, 2, _roof(2).context)
    # a rank reads half of what a TP2 rank reads, but a token passes both stages: the read time is the same
    assert tp2pp2.plain_bytes() == pytest.approx(tp2.plain_bytes() / 2)
    c, c1 = tp2pp2.ceiling(10e9, 50e-6), tp2.ceiling(10e9, 50e-6)
    assert c.read_s == pytest.approx(c1.read_s) and c.stages == 2 and c.bubble == 0.5
    assert c.step_s == pytest.approx(c1.step_s + 50e-6)               # plus one hand-off between the stages
    assert c.to_dict()["stages"] == 2
    back = R.Roofline.from_dict(tp2pp2.to_dict())
    assert back.pp == 2 and back.plain_bytes() == pytest.approx(tp2pp2.plain_bytes())
    assert R.Roofline.from_dict({k: v for k, v in tp2.to_dict().items() if k != "pp"}).pp == 1   # older sidecars


def test_rank_rows_name_each_ranks_stage_and_the_slowest_of_each_stage_binds():
    roof = _roof(2)
    membw = {"before": {"head": {"gbs": 12.0}, "worker": {"gbs": 10.0}, "worker2": {"gbs": 11.0},
                        "worker3": {"gbs": 12.5}}}
    rows = rank_rows(roof, membw, bandwidth=10e9, allreduce_s=100e-6, ranks=2, allreduce_measured=True, pp=2)
    assert [(r["node"], r["stage"], r["tp_rank"]) for r in rows] == [("head", 0, 0), ("worker", 0, 1),
                                                                     ("worker2", 1, 0), ("worker3", 1, 1)]
    assert [r["binds"] for r in rows] == [False, True, True, False]
    w = rows[1]
    assert w["step_ms"] == pytest.approx(2 * w["stage_ms"] + 0.1)        # 2 stages + one 100 us hand-off
    one = rank_rows(roof, membw, bandwidth=10e9, allreduce_s=100e-6, ranks=2, allreduce_measured=True)
    assert "stage" in one[0] and one[0]["hops_ms"] == 0


def test_the_report_table_shows_the_stage_column():
    from runbook.report import html_sections
    roof = _roof(2)
    membw = {"before": {n: {"gbs": 10.0 + i} for i, n in enumerate(NAMES)}}
    rows = rank_rows(roof, membw, bandwidth=10e9, allreduce_s=1e-4, ranks=2, allreduce_measured=True, pp=2)
    B = {"roofline": {**roof.to_dict(), "rank_rows": rows, "allreduce_measured": True}}
    html = "".join(html_sections.roofline(B, lambda x: str(x), False, None))
    assert "<th>stage</th><th>TP rank</th>" in html.replace("\n", "")
    assert "2 pipeline stages of TP=2" in html and "binds stage 0" in html and "binds stage 1" in html
    flat = rank_rows(roof, membw, bandwidth=10e9, allreduce_s=1e-4, ranks=4, allreduce_measured=True)
    html1 = "".join(html_sections.roofline({"roofline": {"tp": 4, "rank_rows": flat}}, str, False, None))
    assert "TP rank" not in html1 and "the slowest rank sets the step" in html1


def test_launch_plan_places_every_rank():
    p = pp2()
    plan = render(p, {n.name: NodeFacts(home="/root", packed_engram=True) for n in p.nodes})
    assert [r.node for r in plan.ranks] == NAMES
    for r in plan.ranks:
        argv = " ".join(r.serve_argv)
        assert "--pipeline-parallel-size 2" in argv and f"--node-rank {p.node(r.node).rank}" in argv
