"""The report of a four-node run (issue 39 item 8): a network figure for every pair and direction of the four
nodes, and the roofline one row per rank -- each rank at its own measured bandwidth, the all-reduce across the
TP group of four -- with nothing that assumes two or three nodes."""
from __future__ import annotations

import itertools

import pytest

from runbook.fit import roofline as R
from runbook.report import write
from runbook.secrets import Redactor
from support.runs import API, bench_output, build_run, chk, edit_sidecar, iperf_json, ping_text, write as put

NODES = ("head", "worker", "worker2", "worker3")
PAIRS = list(itertools.permutations(NODES, 2))          # 12 directions over the 6 pairs of the switch


def _four_node_network(run):
    gbps = {pair: 80.0 + i for i, pair in enumerate(PAIRS)}
    rows = []
    for (a, b), g in gbps.items():
        base = f"iperf3_switch_{a}_to_{b}"
        rows.append(chk(f"net.tcp.switch.{a}->{b}", a, observed=f"{g:.2f} Gb/s received", expected=">= 50 Gb/s",
                        evidence=[put(run / "raw/01_network" / f"{base}_client.json", iperf_json(g * 1e9, g * 1e9)),
                                  put(run / "raw/01_network" / f"{base}_server.json", "{}")],
                        data={"kind": "tcp", "rail": "switch", "direction": f"{a}->{b}", "gbps": g,
                              "threshold_gbps": 50.0}))
        rows.append(chk(f"net.ping.switch.{a}->{b}", a, observed="0% loss", expected="0% loss",
                        evidence=[put(run / "raw/01_network" / f"ping_switch_{a}_to_{b}.txt", ping_text(0.2))],
                        data={"rtt_avg_ms": 0.2, "rtt_max_ms": 0.3}))
    edit_sidecar(run, "01_network", lambda sc: sc.update(checks=rows))
    return gbps


def test_four_node_report_has_every_pair_and_every_rank(tmp_path):
    out = bench_output(tmp_path / "bench", recipe="lab")
    run = build_run(tmp_path / "results", "20261205-120000-tp4", bench=out)
    gbps = _four_node_network(run)
    roof = R.Roofline(R.checkpoint_step_bytes("v4.1-exl3-2.9"), R.V41_FLASH_CONFIG, 4, 256, "", 5)
    probe = {"head": 231.0, "worker": 229.0, "worker2": 70.0, "worker3": 228.0}     # worker2 in the slow state
    membw = {"before": {n: {"gbs": g, "label": "GEMV"} for n, g in probe.items()}, "valid": False}

    def add(sc):
        sc["data"].update(roofline={**roof.to_dict(), "bandwidth": 70e9, "bandwidth_note": "slowest rank",
                                    "allreduce_s": 28e-6, "allreduce_note": "[published] 2-rank",
                                    "allreduce_measured": False, "comparable": False}, membw=membw)
    edit_sidecar(run, "07_bench", add)
    path, model = write.write_report(run, redactor=Redactor([API]))
    page = path.read_text()
    # every direction of every pair, recomputed from its own iperf3 file
    tcp = {f.label: f.value for f in model.figures if f.group == "tcp"}
    assert len(tcp) == len(PAIRS) == 12
    for (a, b), g in gbps.items():
        assert tcp[f"TCP switch {a}->{b}"] == pytest.approx(g)
        assert f"TCP switch {a}-&gt;{b}" in page
    assert sum(1 for f in model.figures if f.group == "ping") == 12
    # one roofline row per rank, the all-reduce at four ranks (the 2-rank 28 us x log2 4), the slow rank binds
    ranks = model.bench["roofline"]["rank_rows"]
    assert [r["node"] for r in ranks] == list(NODES)
    assert all(r["ranks"] == 4 and r["allreduce_us"] == pytest.approx(56.0) for r in ranks)
    assert [r["binds"] for r in ranks] == [False, False, True, False]
    assert ranks[2]["read_ms"] == pytest.approx(roof.plain_bytes() / 70e9 * 1e3)
    assert "Roofline per rank (4 ranks; the all-reduce spans TP=4" in page
    assert page.count("<td>binds</td>") == 1 and "<td>worker3</td>" in page
