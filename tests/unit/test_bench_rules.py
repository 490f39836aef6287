"""The honesty rules trip: failed request, short completion, cached tokens; soak stall/collapse;
exact-length, cache-busting prompts; the CLI never prints or writes the API key."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from runbook.bench.cli import main as cli_main
from runbook.benchmark.client import (
    RequestRecord,
    build_payload,
    make_stream_client,
    stream_request,
)
from runbook.api.prompts import PromptBuilder
from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.result import BenchConfig, BenchResult
from runbook.benchmark.runner import run_benchmark
from runbook.errors import BenchError

# some cases time the reference server's answers: on the lab's xdist worker in `make test`, never niced
pytestmark = pytest.mark.timed

FAST = {"ttft_s": 0.005, "interval_s": 0.002}


def small(**kw) -> BenchConfig:
    base = {"prompt_tokens": 40, "decode_tokens": 12, "concurrency": (2,), "prefill_tokens": (), "repeats": 1,
            "warmup_requests": 1}
    base.update(kw)
    return BenchConfig(**base)


@pytest.fixture
def srv():
    with serve_in_thread(RefConfig(**FAST)) as s:
        yield s


def test_clean_run_passes_and_roundtrips(srv, tmp_path):
    res = run_benchmark(srv.base_url, "ref-model", small(prefill_tokens=(50,)), tmp_path)
    assert res.status == "PASS", [(c.failures, c.warnings) for c in res.cases]
    # tiny timings: on a loaded box the steady window may cover < 80 % (a WARN); nothing else may warn
    assert res.cases, "no case measured"
    assert all(c.status == "PASS" or (c.warnings and all("steady window" in w for w in c.warnings))
               for c in res.cases), \
        [c.warnings for c in res.cases]
    again = BenchResult.load(tmp_path)
    assert again.cases[0].figures == res.cases[0].figures
    rows = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert rows and all(r["prompt_tokens"] == r["target_prompt_tokens"] for r in rows), rows   # exact lengths
    assert {r["cached_tokens"] for r in rows} == {0}
    assert len({r["nonce"] for r in rows}) == len(rows)                         # unique, warm-up disjoint
    chk = res.checks()
    assert len(chk) == 2 and not any(c.failed for c in chk)


def test_cached_tokens_fail_the_case(srv):
    srv.set_config(force_cached_tokens=16)
    res = run_benchmark(srv.base_url, "ref-model", small())
    case = res.cases[0]
    assert case.status == "FAIL" and res.status == "FAIL"
    assert any("prefix cache" in f for f in case.failures)


def test_absent_cached_tokens_warn_and_server_prefix_hits_fail(srv):
    srv.set_config(prompt_tokens_details=False)      # cached_tokens absent: unknown, not zero
    res = run_benchmark(srv.base_url, "ref-model", small())
    assert res.cases[0].status == "WARN"
    assert any("cached_tokens not reported" in w for w in res.cases[0].warnings)
    srv.set_config(force_cached_tokens=16)           # ... then only /metrics can tell: it must FAIL
    res = run_benchmark(srv.base_url, "ref-model", small())
    assert res.cases[0].status == "FAIL"
    assert any("server prefix-cache hits" in f for f in res.cases[0].failures), res.cases[0].failures


def test_short_completion_fails_the_case(srv):
    srv.set_config(eos_after=5)                      # stops early unless ignore_eos/min_tokens
    res = run_benchmark(srv.base_url, "ref-model", small(ignore_eos=False))
    case = res.cases[0]
    assert case.status == "FAIL"
    assert any("completion_tokens != requested" in f for f in case.failures), case.failures


def test_failed_request_fails_the_case(srv):
    srv.set_config(fail_every=3)                     # warm-up is request 1; a measured one fails
    res = run_benchmark(srv.base_url, "ref-model", small())
    assert res.cases[0].status == "FAIL"
    assert any("failed" in f and "HTTP 500" in f for f in res.cases[0].failures)


def test_in_stream_error_fails_the_case(srv):
    srv.set_config(error_every=2)
    res = run_benchmark(srv.base_url, "ref-model", small())
    assert res.cases[0].status == "FAIL"
    assert any("stream error" in f for f in res.cases[0].failures)


def test_warmup_failure_raises(srv):
    srv.set_config(fail_every=1)
    with pytest.raises(BenchError):
        run_benchmark(srv.base_url, "ref-model", small())


def test_nonce_at_token0_busts_the_prefix_cache_suffix_does_not(srv):
    async def go():
        http = make_stream_client(srv.base_url)
        body = " ".join(["word"] * 64)
        out = {}
        for name, prompts in (("prefix", [f"n1 {body}", f"n2 {body}"]), ("suffix", [f"{body} n1", f"{body} n2"])):
            recs = []
            for p in prompts:
                r = RequestRecord(id=name)
                await stream_request(http, "completions", build_payload("completions", "m", p, 4), r, timeout_s=10)
                recs.append(r)
            out[name] = recs[1].cached_tokens
        await http.close()
        return out
    out = asyncio.run(go())
    assert out["prefix"] == 0 and out["suffix"] >= 48


def test_prompt_builder_exact_with_awkward_tokenizer():
    """Words 'market'/'street' count 2 tokens: the builder still hits the exact length."""
    async def tokenize(prompt=None, messages=None):
        text = prompt if prompt is not None else " ".join(m["content"] for m in messages)
        return sum(2 if w in ("market", "street", "history") else 1 for w in text.split()) + 1  # +BOS
    async def go():
        b = PromptBuilder(tokenize)
        return [await b.build(t, f"nonce{t}") for t in (7, 100, 1001, 4096)]
    built = asyncio.run(go())
    assert all(p.exact for p in built), [(p.tokens, p.target) for p in built]
    assert all(p.prompt.startswith(p.nonce) for p in built)


def _when_soak_starts(s, n: int, **changes) -> threading.Thread:
    """Reconfigure the server once ``n`` soak requests have reached it (not on a timer: the box is loaded)."""
    def run():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sum("-soak-" in e.nonce for e in list(s.log)) >= n:
                s.set_config(**changes)
                return
            time.sleep(0.005)
    s.clear()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


@pytest.mark.slow
def test_soak_passes_then_detects_collapse_and_stall():
    with serve_in_thread(RefConfig(**FAST)) as s:
        cfg = small(concurrency=(1, 2), soak_seconds=0.9, soak_window_s=0.3, soak_stall_s=2.0)
        res = run_benchmark(s.base_url, "ref-model", cfg)
        assert res.soak["status"] == "PASS", res.soak["failures"]
        assert res.soak["windows_n"] >= 3 and res.soak["requests"] > 4
        # collapse: tokens get 15x slower after the first soak requests
        th = _when_soak_starts(s, 4, interval_s=0.03)
        cfg = small(concurrency=(1,), decode_tokens=8, soak_seconds=2, soak_window_s=0.2, soak_min_ratio=0.5)
        res = run_benchmark(s.base_url, "ref-model", cfg)
        th.join(5)
        assert res.soak["status"] == "FAIL"
        assert any("collapse" in f for f in res.soak["failures"]), res.soak["failures"]
        # stall: one token every 0.5 s once the soak runs, with a 0.2 s stall limit
        s.set_config(interval_s=0.002)
        th = _when_soak_starts(s, 1, interval_s=0.5)
        cfg = small(concurrency=(1,), decode_tokens=8, soak_seconds=5, soak_window_s=2, soak_stall_s=0.2)
        res = run_benchmark(s.base_url, "ref-model", cfg)
        th.join(5)
        assert res.soak["status"] == "FAIL"
        assert any("stall" in f for f in res.soak["failures"]), res.soak["failures"]


def test_cli_reads_key_from_env_and_never_leaks_it(srv, tmp_path, monkeypatch, capsys):
    secret = "sk-test-DO-NOT-LEAK-1234"
    monkeypatch.setenv("BENCH_TEST_KEY", secret)
    rc = cli_main(["--base-url", srv.base_url + "/v1", "--model", "ref-model", "--api-key-env", "BENCH_TEST_KEY",
                   "--prompt-tokens", "30", "--decode-tokens", "8", "--concurrency", "1", "--prefill-tokens", "40",
                   "--repeats", "1", "--out", str(tmp_path), "--recipe", "exl3-v41", "--no-plot"])
    out = capsys.readouterr()
    assert rc == 0, out
    assert secret not in out.out + out.err
    written = list(tmp_path.iterdir())
    assert written, "the CLI wrote nothing"
    for p in written:
        assert secret not in p.read_bytes().decode("utf-8", "replace"), p
    assert {"result.json", "requests.jsonl", "chunks.jsonl", "metrics.jsonl", "table.csv", "summary.txt"} <= \
        {p.name for p in tmp_path.iterdir()}
    assert json.loads((tmp_path / "result.json").read_text())["environment"]["api_key_env"] == "BENCH_TEST_KEY"


def test_cli_errors(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    assert cli_main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--api-key-env", "NO_SUCH_KEY_VAR"]) == 2
    assert cli_main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "1,x"]) == 2
    # nothing listening: a BenchError exit code, not a traceback
    assert cli_main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--repeats", "1"]) == BenchError.exit_code
