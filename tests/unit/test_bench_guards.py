"""Guards before any measurement: a server other clients are using, or one serving another model id,
is refused with the reason and the override -- and nothing is sent to it."""
from __future__ import annotations

import threading

import pytest

from runbook.bench.cli import main as cli_main
from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.result import BenchConfig
from runbook.benchmark.runner import run_benchmark
from runbook.errors import BenchError

# some cases time the reference server's answers: on the lab's xdist worker in `make test`, never niced
pytestmark = pytest.mark.timed

FAST = {"ttft_s": 0.005, "interval_s": 0.002}


def small(**kw) -> BenchConfig:
    return BenchConfig(**{"prompt_tokens": 30, "decode_tokens": 8, "concurrency": (1,), "prefill_tokens": (),
                          "repeats": 1, "warmup_requests": 1, **kw})


@pytest.fixture
def srv():
    with serve_in_thread(RefConfig(**FAST)) as s:
        yield s


@pytest.mark.parametrize("load,seen", [({"extra_running": 1}, "1 running, 0 waiting"),
                                       ({"extra_waiting": 3}, "0 running, 3 waiting")])
def test_busy_server_is_refused_before_anything_is_sent(srv, load, seen):
    srv.set_config(**load)
    with pytest.raises(BenchError) as ei:
        run_benchmark(srv.base_url, "ref-model", small())
    msg = str(ei.value)
    assert "busy" in msg and seen in msg and "allow_busy=True" in msg and "--allow-busy" in msg, msg
    assert srv.log == []                       # not even the warm-up


def test_allow_busy_measures_and_records_the_load(srv):
    srv.set_config(extra_running=2)
    res = run_benchmark(srv.base_url, "ref-model", small(allow_busy=True))
    assert res.environment["guard"]["busy_check"] == "busy: 2 running, 0 waiting"
    assert res.config["allow_busy"] is True
    assert res.cases and all(c.status != "FAIL" for c in res.cases)


def test_a_request_finishing_is_not_busy(srv):
    """Busy at the first scrape, idle half a second later (a request just ending): measured."""
    srv.set_config(extra_running=1)
    timer = threading.Timer(0.6, lambda: srv.set_config(extra_running=0))
    timer.start()
    try:
        res = run_benchmark(srv.base_url, "ref-model", small())
    finally:
        timer.cancel()
    assert res.environment["guard"]["busy_check"] == "idle"
    assert srv.log, "nothing was measured"


def test_other_model_id_is_refused(srv):
    with pytest.raises(BenchError) as ei:
        run_benchmark(srv.base_url, "deepseek-v4-flash", small())
    msg = str(ei.value)
    assert "does not serve the requested model" in msg and "['ref-model']" in msg and "'deepseek-v4-flash'" in msg
    assert "allow_other_model=True" in msg
    assert srv.log == []


def test_allow_other_model_measures(srv):
    res = run_benchmark(srv.base_url, "alias-of-ref", small(allow_other_model=True))
    assert res.environment["guard"]["model_mismatch_allowed"] is True
    assert res.environment["guard"]["served_models"] == ["ref-model"]
    assert srv.log


def test_cli_says_why_and_how(srv, capsys):
    srv.set_config(extra_waiting=1)
    rc = cli_main(["--base-url", srv.base_url, "--model", "ref-model", "--prompt-tokens", "30",
                   "--decode-tokens", "8", "--concurrency", "1", "--prefill-tokens", "1", "--repeats", "1"])
    err = capsys.readouterr().err
    assert rc == BenchError.exit_code and "0 running, 1 waiting" in err and "--allow-busy" in err, err
    assert srv.log == []
