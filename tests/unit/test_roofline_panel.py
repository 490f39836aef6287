"""bench/roofline_panel.py and its report section: ms per step and accepted tokens per step from /metrics
deltas, the ceiling per class at its own context (plain and at the measured acceptance), measured/ceiling,
the published figures of the same class; the lab's tiny model with the CPU bandwidth; the report page."""
from __future__ import annotations

import json

import pytest

from runbook.benchmark.result import BenchResult
from runbook.benchmark.roofline_panel import allreduce_latency, panel_rows, plot_roofline, slowest_bandwidth
from runbook.fit import roofline as R
from runbook.records import AllreducePoint, AllreduceSweep, NetworkRecord
from runbook.report import write
from runbook.secrets import Redactor
from support.runs import API, bench_output, build_run, edit_sidecar


def case(name, wl, th, rate, acc_len=None, drafts=None, accepted=None, kind="class", p=1024, d=128):
    server = {"available": True, "counters": {}}
    figures = {"decode_tok_s": {"median": rate, "min": rate, "max": rate, "n": 3}}
    if acc_len is not None:
        figures["spec_mean_acceptance_length"] = {"median": acc_len, "min": acc_len, "max": acc_len, "n": 1}
        server["counters"] = {"vllm:spec_decode_num_drafts_total": drafts,
                              "vllm:spec_decode_num_draft_tokens_total": drafts * 6,
                              "vllm:spec_decode_num_accepted_tokens_total": accepted}
    return {"name": name, "kind": kind, "concurrency": 1, "prompt_tokens": p, "decode_tokens": d, "repeats": 3,
            "figures": figures, "server": server, "workload": wl if kind == "class" else "", "thinking": th if kind == "class" else ""}


def result(recipe, cases, **cfg):
    return BenchResult.from_dict({"schema_version": "runbook.bench/1", "run_id": "r", "base_url": "http://x",
                                  "model": "m", "config": {"recipe": recipe, **cfg}, "environment": {}, "cases": cases})


def test_v4_flash_panel_by_hand():
    roof = R.Roofline(R.recipe_step_bytes("dspark-v4"), R.V4_FLASH_CONFIG, 2, 0, "nvfp4_ds_mla", 6)
    # code: 76 tok/s at acceptance length 1 + 900/300 = 4.0 (Δ drafts 300, Δ accepted 900); prose 37.3 at 1.6
    res = result("dspark-v4", [case("decode-code-thinkoff-c1-p1024-d128", "code", "off", 76.0, 4.0, 300, 900),
                               case("decode-prose-thinkoff-c1-p1024-d128", "prose", "off", 37.3, 1.6, 500, 300)],
                 endpoint="chat", chat_template_kwargs={"thinking": False})
    rows = panel_rows(res, roof, bandwidth=230e9, allreduce_s=77e-6, recipe="dspark-v4")
    assert [r["class"] for r in rows] == ["code", "prose"]
    code = rows[0]
    assert code["tokens_per_step"] == 4.0 and code["ms_per_step"] == pytest.approx(1000 * 4.0 / 76.0)
    assert code["steps"] == 300 and code["accepted"] == 900 and code["drafts"] == 1800
    ctx = R.Roofline(roof.step, roof.config, 2, 1024 + 64, "nvfp4_ds_mla", 6)
    verify_s = ctx.verify_bytes() / 230e9 + 86 * 77e-6
    assert code["context"] == 1088
    assert code["ceiling_ms_per_step"] == pytest.approx(verify_s * 1e3)
    assert code["ceiling_tok_s"] == pytest.approx(4.0 / verify_s)
    assert code["ceiling_plain_tok_s"] == pytest.approx(1 / (ctx.plain_bytes() / 230e9 + 86 * 77e-6))
    assert code["measured_over_ceiling"] == pytest.approx(76.0 / (4.0 / verify_s))
    # published figures of the same class beside it (seeds B.9: code 76.0, prose 37.3)
    assert "76 tok/s" in code["published"] and "37.3 tok/s" in rows[1]["published"]
    assert rows[1]["measured_over_ceiling"] == pytest.approx(37.3 / (1.6 / verify_s), rel=1e-3)
    fig = plot_roofline(rows)
    assert len(fig.axes[0].patches) == 2


def test_spec_on_without_metrics_leaves_the_ratio_empty():
    roof = R.Roofline(R.recipe_step_bytes("dspark-v4"), R.V4_FLASH_CONFIG, 2, 0, "nvfp4_ds_mla", 6)
    rows = panel_rows(result("dspark-v4", [case("decode-tool-thinkon-c1-p1024-d128", "tool", "on", 50.0)]),
                      roof, bandwidth=230e9, allreduce_s=77e-6, recipe="dspark-v4")
    assert rows and rows[0]["tokens_per_step"] is None and rows[0]["measured_over_ceiling"] is None
    assert rows[0]["ceiling_plain_tok_s"] > 0


def test_lab_tiny_model_at_cpu_bandwidth_is_not_compared_with_published():
    roof = R.Roofline(R.recipe_step_bytes("lab"), R.ARCH["lab"].config, 2, 0, "", 0)
    res = result("lab", [case("decode-c1-p64-d24", "", "", 50.0, kind="decode", p=64, d=24),
                         case("decode-prose-thinkoff-c1-p1024-d24", "prose", "off", 45.0)])
    rows = panel_rows(res, roof, bandwidth=10e9, allreduce_s=300e-6, recipe="lab", comparable=False)
    assert len(rows) == 2 and all(r["published"] == "" for r in rows)
    r0 = R.Roofline(roof.step, roof.config, 2, 64 + 12, "", 0)
    step_s = r0.plain_bytes() / 10e9 + 4 * 300e-6
    assert rows[0]["tokens_per_step"] == 1.0 and rows[0]["ceiling_tok_s"] == pytest.approx(1 / step_s)
    assert rows[0]["measured_over_ceiling"] == pytest.approx(50.0 * step_s)


def _network(*sweeps: tuple[str, list[tuple[int, float]]]) -> NetworkRecord:
    """Step 01's record with these all-reduce sweeps (node, [(bytes, time_us)])."""
    return NetworkRecord(gid_index={}, allreduce=tuple(
        AllreduceSweep(node=node, points=tuple(AllreducePoint(bytes=b, time_us=t) for b, t in pts))
        for node, pts in sweeps))


def test_inputs_from_the_records():
    net = _network(("head", [(4096, 400.0), (1024, 310.0)]), ("worker", [(1024, 290.0)]))
    s, note = allreduce_latency(net)
    assert s == pytest.approx(310e-6) and "1024 bytes" in note and "head" in note
    assert allreduce_latency(None) == (None, "01_network did not run in this run")
    assert allreduce_latency(_network()) == (None, "no all-reduce sweep in 01_network")
    bw, note = slowest_bandwidth({"before": {"head": {"gbs": 11.0, "label": "CPU memory bandwidth (lab)"},
                                             "worker": {"gbs": 9.5, "label": "CPU memory bandwidth (lab)"}}})
    assert bw == 9.5e9 and "worker" in note and "(lab)" in note
    assert slowest_bandwidth({"before": {"head": {"error": "x"}}})[0] is None


def test_report_shows_the_panel_membw_and_reconciliation(tmp_path):
    out = bench_output(tmp_path / "bench", recipe="lab")
    run = build_run(tmp_path / "results", "20261203-070000-lab", bench=out)
    roof = R.Roofline(R.recipe_step_bytes("lab"), R.ARCH["lab"].config, 2, 0, "", 0)
    membw = {"before": {"head": {"gbs": 10.2, "label": "CPU memory bandwidth (lab): memcpy"},
                        "worker": {"gbs": 9.8, "label": "CPU memory bandwidth (lab): memcpy"}},
             "after": {"head": {"gbs": 10.0}, "worker": {"gbs": 9.9}}, "valid": True}
    rec = [{"figure": "TTFT (ms)", "harness": 20.0, "harness_definition": "first token", "vllm": 22.0,
            "vllm_definition": "first chunk", "delta": 2.0, "delta_pct": 10.0, "explained": 0.0, "residual": 2.0,
            "causes": [{"cause": "first chunk vs first token", "estimate": 0.0, "note": "same chunk"}]}]

    def add(sc):
        sc["data"].update(roofline={**roof.to_dict(), "bandwidth": 9.8e9, "bandwidth_note": "CPU memory bandwidth (lab)",
                                    "allreduce_s": 0.0, "allreduce_note": "none", "comparable": False},
                          membw=membw, vllm_cross_check={"case": "decode-c1-p64-d24", "seed": 7, "reconciliation": rec})
    edit_sidecar(run, "07_bench", add)
    path, model = write.write_report(run, redactor=Redactor([API]))
    page = path.read_text()
    rows = model.bench["roofline"]["rows"]
    assert rows and rows[0]["measured_over_ceiling"] is not None
    # recomputed from the recomputed result, not copied from the sidecar
    case_rate = next(f.value for f in model.figures if f.key.endswith("decode-c1-p64-d24/decode_tok_s"))
    assert rows[0]["decode_tok_s"] == pytest.approx(case_rate)
    assert "Roofline: how close to the memory-bandwidth limit" in page and "measured / ceiling" in page
    assert "Memory bandwidth per rank (bench valid)" in page and "9.8 GB/s" in page
    assert "Protocol reconciliation" in page and "first chunk vs first token" in page
    assert page.count("data:image/png;base64,") >= 2
    json.dumps(model.bench["roofline"])        # the panel stays plain JSON


def _cluster():
    from support.doubles import FakeCluster, FakeNode, res
    # a head that answers nothing: the checkpoint's headers cannot be read there, so the recipe's config
    return FakeCluster([FakeNode("head", 0, rules=[(r"", res(1))], read_only=True)])


def test_step_panel_inputs_lab_and_recipe():
    from runbook.bench import ceiling
    from runbook.lab.site import site_for
    from support.runs import recipe_profile
    lab = recipe_profile("env/lab.env")
    network = _network(("worker", [(1024, 250.0)]))
    res = result("lab", [case("decode-code-thinkoff-c1-p1024-d24", "code", "off", 40.0)])
    membw = {"before": {"head": {"gbs": 12.0, "label": "CPU memory bandwidth (lab)"},
                        "worker": {"gbs": 11.0, "label": "CPU memory bandwidth (lab)"}}}
    out = ceiling.panel(_cluster(), lab, res, membw, network, site=site_for(lab))     # the lab's tiny model
    assert out["bandwidth"] == 11.0e9 and out["allreduce_s"] == pytest.approx(250e-6)
    assert out["comparable"] is False and out["step"]["parts"]["lm_head"] == 2048 * 256 * 4
    assert len(out["rows"]) == 1 and out["rows"][0]["published"] == ""
    # one row per rank, each at its own probe; 01_network's sweep spans the nodes, so no N-rank factor
    assert [(r["node"], r["bandwidth_gbs"], r["binds"]) for r in out["rank_rows"]] == [("head", 12.0, False),
                                                                                     ("worker", 11.0, True)]
    assert out["rank_rows"][0]["allreduce_us"] == pytest.approx(250.0)
    # a recipe with no probe and no 01_network: the published GB10 figures, said so
    spark = recipe_profile("env/dspark-v4.env")
    res = result("dspark-v4", [case("decode-prose-thinkoff-c1-p1024-d128", "prose", "off", 37.3, 1.6, 500, 300)])
    out = ceiling.panel(_cluster(), spark, res, {"before": {}}, None)
    assert out["step"]["source"].startswith("config-only: DeepSeek-V4-Flash"), out.get("error")
    assert out["bandwidth"] == 230e9 and out["bandwidth_note"].startswith("[published]")
    assert out["allreduce_s"] == 77e-6 and out["rows"][0]["measured_over_ceiling"] > 0
    assert "error" in ceiling.panel(_cluster(), recipe_profile("env/exl3-v41.env"), res, {}, network)


def test_rank_rows_use_each_ranks_bandwidth_and_the_n_rank_all_reduce():
    roof = R.Roofline(R.checkpoint_step_bytes("v4.1-native"), R.V41_FLASH_CONFIG, 4, 256, "fp8", 5)
    membw = {"before": {"spark1": {"gbs": 230.0}, "spark2": {"gbs": 228.0}, "spark3": {"gbs": 70.0},
                        "spark4": {"gbs": 231.0}, "spark5": {"error": "probe failed"}}}
    from runbook.benchmark.roofline_panel import rank_rows
    rows = rank_rows(roof, membw, bandwidth=230e9, allreduce_s=28e-6, ranks=4, allreduce_measured=False)
    assert [r["node"] for r in rows] == ["spark1", "spark2", "spark3", "spark4"]
    assert all(r["bytes_per_rank"] == pytest.approx(roof.plain_bytes()) for r in rows)
    # the 2-rank published latency at four ranks: a tree, x log2 4
    assert rows[0]["allreduce_us"] == pytest.approx(56.0) and rows[0]["allreduces"] == 80
    assert rows[2]["read_ms"] == pytest.approx(roof.plain_bytes() / 70e9 * 1e3)
    assert [r["binds"] for r in rows] == [False, False, True, False]       # the slow-state rank sets the step
    # 01_network's sweep ran across all four: taken as it is
    measured = rank_rows(roof, membw, bandwidth=230e9, allreduce_s=40e-6, ranks=4, allreduce_measured=True)
    assert measured[0]["allreduce_us"] == pytest.approx(40.0)
    # no probe: one row per rank at the given bandwidth
    bare = rank_rows(roof, None, bandwidth=230e9, allreduce_s=28e-6, ranks=2, allreduce_measured=False)
    assert [r["node"] for r in bare] == ["rank 0", "rank 1"] and bare[0]["allreduce_us"] == pytest.approx(28.0)
