"""``net.tcp_pairs.<rail>`` (issue 39 item 3): on a rail of three or more nodes, step 01's per-pair iperf3 results name
the slow pair (below 0.5 x the fastest: WARN) and the pair below MIN_TCP_GBPS or with no figure (FAIL). The iperf3
output is real: captured from iperf 3.12 on this machine (``iperf3 -s -D -1 -p 5399`` and
``iperf3 -c 127.0.0.1 -p 5399 -J -t 1``; ``capped.json`` with ``-b 2G``: a pair that gets a quarter of the rate)."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

from runbook.checks import Status
from runbook.facts import net as fnet
from runbook.network.context import Rail, RailEnd, Verification
from runbook.network.ip_traffic import SLOW_PAIR_FRACTION, iperf_checks, tcp_pairs_check
from support.doubles import FakeCluster, FakeNode
from support.net import by
from support.profiles import profile_from

DATA = Path(__file__).parent / "data" / "iperf3"
FAST, CAPPED = (DATA / "fast.json").read_text(), (DATA / "capped.json").read_text()
NAMES = ["head", "worker", "worker2", "worker3"]
IP = {n: f"169.254.30.{r + 1}" for r, n in enumerate(NAMES)}


def test_the_captures_are_real_iperf3_312_and_parse():
    fast, capped = fnet.parse_iperf3(FAST), fnet.parse_iperf3(CAPPED)
    assert '"version":\t"iperf 3.12"' in FAST and not fast.error
    assert fast.receiver_gbps > 4 * capped.receiver_gbps > 0           # the capped pair is the slow one
    assert 1.5 < capped.receiver_gbps < 2.1                           # -b 2G


def results(slow: tuple[str, str] | None = None, *, text=FAST, missing=()) -> dict:
    out = {}
    for a, b in itertools.permutations(NAMES, 2):
        out[(a, b)] = None if (a, b) in missing else fnet.parse_iperf3(CAPPED if (a, b) == slow else text).receiver_gbps
    return out


def test_every_pair_alike_passes():
    c = tcp_pairs_check("rail0", results(), 0.1)
    assert c.name == "net.tcp_pairs.rail0" and c.status is Status.PASS and c.node == "cluster"
    assert "12 directions of 6 pairs measured" in c.observed


def test_a_pair_below_half_the_fastest_is_named():
    c = tcp_pairs_check("rail0", results(("worker2", "worker3")), 0.1)
    assert c.status is Status.WARN
    assert re.search(r"below 0\.5 x the fastest \(\d+\.\d\d Gb/s\): worker2->worker3 1\.\d\d Gb/s$", c.observed), c.observed
    assert "(slowest worker2->worker3)" in c.observed and "port, cable or transceiver" in c.fix
    assert c.data["slow"] == [f"worker2->worker3 {c.data['gbps']['worker2->worker3']:.2f}"]
    assert c.data["slow_floor_gbps"] == SLOW_PAIR_FRACTION * c.data["fastest_gbps"]


def test_below_min_tcp_gbps_or_no_figure_fails_naming_the_pair():
    c = tcp_pairs_check("rail0", results(("head", "worker3")), 3.0)          # MIN_TCP_GBPS above the capped pair
    assert c.status is Status.FAIL and "below MIN_TCP_GBPS=3.0: head->worker3 1." in c.observed
    c = tcp_pairs_check("rail1", results(missing=[("worker", "worker2")]), 0.1)
    assert c.status is Status.FAIL and "no figure: worker->worker2" in c.observed
    c = tcp_pairs_check("rail0", {k: None for k in results()}, 0.1)
    assert c.status is Status.FAIL and "no iperf3 figure for any of the 12 directions of 6 pairs" in c.observed


def test_step_01_adds_the_row_on_a_switch_from_the_nodes_iperf3_output():
    """iperf_checks over four fake nodes whose clients print the captured JSON: worker3 -> head gets the capped
    flow; the per-direction rows pass (above MIN_TCP_GBPS), the pairs row names the slow one."""
    def node(r, n):
        client = (lambda cmd, n=n: CAPPED if n == "worker3" and f"-c {IP['head']} " in cmd else FAST)
        return FakeNode(n, r, fabric_ip=IP[n], fabric_if="enp1s0f0np0", read_only=True,
                        rules=[(r"iperf3 -s -1", FAST), (r"iperf3 -c ", client)])
    cluster = FakeCluster([node(r, n) for r, n in enumerate(NAMES)])
    ctx = Verification(cluster, profile_from("env/lab-tp4.env"), None)
    rail = Rail(0, {n: RailEnd(n, "enp1s0f0np0", IP[n]) for n in NAMES})
    iperf_checks(ctx, [rail], 1)
    rows = list(ctx.checks)
    assert len([c for c in rows if c.name.startswith("net.tcp.")]) == 12
    assert by(rows, "net.tcp.rail0.worker3->head").status is Status.PASS           # 1.9 Gb/s >= 0.1
    pairs = by(rows, "net.tcp_pairs.rail0")
    assert pairs.status is Status.WARN and "worker3->head" in pairs.observed and "worker3->head 1." in pairs.observed


def test_two_nodes_get_no_pairs_row():
    cluster = FakeCluster([FakeNode(n, r, fabric_ip=IP[n], fabric_if="enp1s0f0np0", read_only=True,
                                    rules=[(r"iperf3 -s -1", FAST), (r"iperf3 -c ", FAST)])
                           for r, n in enumerate(NAMES[:2])])
    ctx = Verification(cluster, profile_from("env/lab.env"), None)
    iperf_checks(ctx, [Rail(0, {n: RailEnd(n, "enp1s0f0np0", IP[n]) for n in NAMES[:2]})], 1)
    assert [c.name for c in ctx.checks if "tcp_pairs" in c.name] == []
