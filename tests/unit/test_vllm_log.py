"""The startup log parser on real captured vLLM 0.32 CPU logs (the lab, TP=2 across the two lab
nodes, process and docker runtimes) and on log lines quoted in the seed recipes."""
from __future__ import annotations

from pathlib import Path

import pytest

from runbook.facts.vllm_log import capacity, is_periodic, parse_startup_log

DATA = Path(__file__).parent / "data" / "vllm_logs"


def test_lab_head_log_process_runtime():
    log = parse_startup_log((DATA / "cpu032_tp2_head.log").read_text())
    assert log.version == "0.32.0"
    assert (log.kv_device, log.kv_tokens) == ("CPU", 2_097_152)
    assert (log.concurrency_len, log.max_concurrency) == (4096, 512.0)
    assert log.kv_memory_gib == 1.0                     # "Explicitly set (1.0/13.21) GiB for KV cache"
    assert log.weights_loading_s == pytest.approx(0.04)
    assert log.init_engine_s == pytest.approx(10.01)
    assert log.api_url == "http://0.0.0.0:8000" and log.startup_complete
    assert log.world == {"world_size": 2, "rank": 0, "init_method": "tcp://169.254.77.1:29501", "backend": "gloo"}
    assert log.errors == []


def test_lab_worker_log_is_headless():
    log = parse_startup_log((DATA / "cpu032_tp2_worker.log").read_text())
    assert log.headless_master == "169.254.77.1:29501"
    assert log.world["rank"] == 1 and log.world["backend"] == "gloo"
    assert log.kv_tokens is None and not log.startup_complete      # the head owns the KV report and the API


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*docker*head*.log")))
def test_lab_head_log_docker_runtime(name):
    log = parse_startup_log((DATA / name).read_text())
    assert log.kv_tokens and log.startup_complete and log.version == "0.32.0"


# lines as quoted in seeds-repos.md (§A.1, §A.6, §B.1, §B.2) and bringup-anchors.md §2.5
SEED_B_VISION = """\
(EngineCore_DP0 pid=312) INFO 09-20 10:01:02 [gpu_worker.py:436] Available KV cache memory: 17.04 GiB
(EngineCore_DP0 pid=312) INFO 09-20 10:01:03 [kv_cache_utils.py:1087] GPU KV cache size: 2,331,430 tokens
(EngineCore_DP0 pid=312) INFO 09-20 10:01:03 [kv_cache_utils.py:1091] Maximum concurrency for 1,048,576 tokens per request: 2.22x
(EngineCore_DP0 pid=312) WARNING 09-20 10:01:04 [compilation.py:900] Truncating max_cudagraph_capture_size to 24
"""
SEED_A_BOOT = """\
(VllmWorker TP0 pid=201) INFO 09-15 03:10:11 [default_loader.py:267] Loading weights took 191.75 seconds
(VllmWorker TP0 pid=201) INFO 09-15 03:10:45 [gpu_model_runner.py:2653] Model loading took 98.86 GiB memory and 270.5 seconds
(EngineCore_DP0 pid=180) INFO 09-15 03:11:00 [cuda.py:1] Using DeepSeek's fp8_ds_mla KV cache format
(APIServer pid=1) INFO 09-15 03:12:00 [api_server.py:1900] Starting vLLM API server 0 on http://0.0.0.0:8888
(APIServer pid=1) INFO:     Application startup complete.
"""


def test_seed_b_vision_exp_boot_lines():
    log = parse_startup_log(SEED_B_VISION)
    assert (log.kv_device, log.kv_tokens, log.kv_memory_gib) == ("GPU", 2_331_430, 17.04)
    assert (log.concurrency_len, log.max_concurrency) == (1_048_576, 2.22)
    assert log.capture_truncated_to == 24


def test_seed_b_0731_boot_line_on_one_line():
    log = parse_startup_log("INFO GPU KV cache size: 2,493,464 tokens, "
                            "Maximum concurrency for 1,048,576 tokens per request: 2.38x\n")
    assert (log.kv_tokens, log.max_concurrency) == (2_493_464, 2.38)


def test_seed_a_boot_lines():
    log = parse_startup_log(SEED_A_BOOT)
    assert (log.model_loading_gib, log.model_loading_s) == (98.86, 270.5)
    assert log.weights_loading_s == 191.75 and log.kv_format == "fp8_ds_mla"
    assert log.api_url == "http://0.0.0.0:8888" and log.startup_complete


def test_errors_are_collected():
    text = ("INFO ok\nTraceback (most recent call last):\n  File x\n"
            "ValueError: Available memory on node 0 (8.66/9.96 GiB) on startup is less than desired\n")
    log = parse_startup_log(text)
    assert log.errors[0].startswith("Traceback") and "ValueError" in log.errors[1]


def test_periodic_lines_do_not_count_as_progress():
    assert is_periodic("(EngineCore pid=9) INFO [shm_broadcast.py:466] No available shared memory broadcast "
                       "block found in 60 second.")
    assert is_periodic('(APIServer pid=815) INFO:     10.77.0.1:40000 - "GET /health HTTP/1.1" 200 OK')
    assert is_periodic("INFO [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s")
    assert not is_periodic("INFO [default_loader.py:501] Loading weights took 0.04 seconds")


def test_capacity_table_seed_b():
    rows = capacity(2_331_430, [("32k", 32768), ("200k", 200_000), ("500k", 500_000), ("1M", 1_048_576)],
                    max_model_len=1_048_576, max_num_seqs=6)
    assert [r["fit_in_pool"] for r in rows] == [71, 11, 4, 2]
    assert [r["concurrent_servable"] for r in rows] == [6, 6, 4, 2]
    assert rows[-1]["pool_ratio"] == 2.22                      # = vLLM's "Maximum concurrency" 2.22x


def test_capacity_marks_requests_longer_than_the_context():
    rows = capacity(774_400, [("1M", 1_048_576)], max_model_len=600_000, max_num_seqs=2)
    assert rows[0]["concurrent_servable"] == 0 and "MAX_MODEL_LEN" in rows[0]["note"]
