"""Render (runbook.launch) against the seed recipes, flag by flag, plus golden files per recipe/rank.

The expected values below are transcribed from /work/shared/reference/seeds-repos.md: seed A
(`start.sh` @ 503b482) §A.3 serve flags and §A.4 docker flags/env; seed B (compose, Vision-Exp era)
§B.2 serve argv, docker flags and env. Regenerate the golden files with UPDATE_GOLDEN=1 after an
intended change and review the diff.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from runbook.launch import render as launch
from runbook.launch.render import NodeFacts, check_consistency, render
from runbook.profile import REPO_ROOT, load_profile
from support.doubles import FakeNode, rank_node
from support.golden import check_golden

ENV = REPO_ROOT / "env"
GOLDEN = Path(__file__).parent / "golden" / "launch"
HOME = "/home/spark"
FACTS = {"head": NodeFacts(home=HOME), "worker": NodeFacts(home=HOME)}


def _plan(name: str, overrides=None, facts=None, **kw):
    return render(load_profile(ENV / f"{name}.env", overrides), facts or FACTS, **kw)


def flags(argv: list[str]) -> dict[str, str | bool]:
    """--flag value / --flag (bool) -> dict; repeated flags keep the last value."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                vals = []
                j = i + 1
                while j < len(argv) and not argv[j].startswith("--"):
                    vals.append(argv[j])
                    j += 1
                out[a] = " ".join(vals)
                i = j
                continue
            else:
                out[a] = True
        i += 1
    return out


def docker_opts(argv: list[str]) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """docker run argv -> (options before the image, -v values, -e values)."""
    opts, vols, envs = [], [], []
    i = 2
    while i < len(argv):
        a = argv[i]
        if a == "--entrypoint":
            opts.append((a, argv[i + 1]))
            break
        if a in ("-v", "-e", "--name", "--gpus", "--shm-size", "--stop-timeout", "--restart", "--oom-score-adj",
                 "--cap-add", "--device", "--ulimit", "--network", "--label"):
            val = argv[i + 1]
            (vols if a == "-v" else envs if a == "-e" else opts).append(val if a in ("-v", "-e") else (a, val))
            i += 2
            continue
        opts.append((a, ""))
        i += 1
    return opts, vols, envs


# ----------------------------------------------------------------------------- seed A (exl3-v41)

SEED_A_SERVE = {
    "--served-model-name": "DeepSeek-v4.1-Flash-EXL3", "--host": "0.0.0.0", "--port": "8888",
    "--tensor-parallel-size": "2", "--nnodes": "2", "--master-addr": "10.0.0.1", "--master-port": "29521",
    "--distributed-executor-backend": "mp", "--tokenizer-mode": "deepseek_v41",
    "--tool-call-parser": "deepseek_v41", "--reasoning-parser": "deepseek_v41", "--enable-auto-tool-choice": True,
    "--enable-prefix-caching": True, "--enable-prompt-tokens-details": True,
    "--no-enable-flashinfer-autotune": True, "--hf-overrides": '{"engram_table_dir":"/engram-src"}',
    "--quantization": "exl3", "--max-model-len": "600000", "--gpu-memory-utilization": "0.88",
    "--max-num-seqs": "2", "--max-num-batched-tokens": "1536", "--long-prefill-token-threshold": "1280",
    "--kv-cache-memory-bytes": "2684354560", "--block-size": "64",
    "--speculative-config": '{"method":"dspark","num_speculative_tokens":3}',
    "--chat-template": "/opt/dsv41/chat_template.jinja", "--mm-encoder-tp-mode": "data",
    "--limit-mm-per-prompt": '{"image":100}', "--skip-mm-profiling": True,
    "--cudagraph-capture-sizes": "1 2 3 4 6 8 12 18 24",
}
SEED_A_ABSENT = ["--kv-cache-dtype", "--enforce-eager", "--language-model-only", "--api-key"]
SEED_A_DOCKER = [("--gpus", "all"), ("--network", "host"), ("--ipc=host", ""), ("--shm-size", "32g"),
                 ("--stop-timeout", "60"), ("--oom-score-adj", "1000"), ("--cap-add", "SYS_PTRACE"),
                 ("--device", "/dev/infiniband"), ("--cap-add", "IPC_LOCK"), ("--ulimit", "memlock=-1"),
                 ("--ulimit", "stack=67108864")]
SEED_A_COMMON_ENV = {
    "NCCL_IB_DISABLE": "0", "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_NET": "IB", "NCCL_NET_PLUGIN": "none",
    "NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0", "NCCL_IB_MERGE_NICS": "0", "NCCL_CROSS_NIC": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1", "NCCL_DEBUG": "WARN", "NCCL_BUFFSIZE": "1048576",
    "NCCL_LL128_BUFFSIZE": "262144", "NCCL_PROTO": "^LL128", "NCCL_MAX_NCHANNELS": "8",
    "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1", "CUDA_LAUNCH_BLOCKING": "0", "DSV41_EXL3_SERIAL_STREAMS": "1",
    "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "256", "DSV41_PREFILL_EMPTY_CACHE_TOKENS": "8192",
    "DSV41_PREFILL_EMPTY_CACHE_MEMAVAIL_GIB": "2.5", "DSV41_PREFILL_END_EMPTY_CACHE": "0",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CACHE_ROOT": "/root/.cache/vllm",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800", "TORCH_CUDA_ARCH_LIST": "12.1a",
    "FLASHINFER_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_DISABLE_VERSION_CHECK": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "VLLM_ENGINE_READY_TIMEOUT_S": "1500",
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1",
    "DSV41_EXL3_K_MAP": "/opt/dsv41/exl3_k_map.json", "GLM53_DENSE_FP8": "off", "DSV41_SOURCE": "/engram-src",
}
SEED_A_RANK_ENV = {
    "head": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1",
             "NCCL_IB_GID_INDEX": "3", "VLLM_HOST_IP": "10.0.0.1"},
    "worker": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "GLOO_SOCKET_IFNAME": "enp1s0f0np0",
               "NCCL_IB_HCA": "rocep1s0f0", "NCCL_IB_GID_INDEX": "3", "VLLM_HOST_IP": "10.0.0.2"},
}


@pytest.mark.parametrize("node,rank", [("head", 0), ("worker", 1)])
def test_seed_a_serve_flags(node, rank):
    # the seeds bind 0.0.0.0; the runbook's default is 127.0.0.1 (test_api_binds_loopback_by_default)
    r = _plan("exl3-v41", {"API_HOST": "0.0.0.0"}).rank(node)
    argv = r.serve_argv
    assert argv[:3] == ["vllm", "serve", "/model"]
    f = flags(argv[3:])
    for k, v in SEED_A_SERVE.items():
        assert f.get(k) == v, f"{k}: rendered {f.get(k)!r}, seed A {v!r}"
    assert f["--node-rank"] == str(rank)
    assert (f.get("--headless") is True) == (node == "worker")      # worker adds --headless, keeps --port
    for k in SEED_A_ABSENT:
        assert k not in f, k


@pytest.mark.parametrize("node", ["head", "worker"])
def test_seed_a_docker_flags_and_env(node):
    r = _plan("exl3-v41").rank(node)
    opts, vols, envs = docker_opts(r.docker_argv)
    for o in SEED_A_DOCKER:
        assert o in opts, o
    assert ("--name", f"dsv41-exl3-{node}") in opts
    assert f"{HOME}/.cache/dsv41-flash-exl3/model:/model:ro" in vols
    assert f"{HOME}/.cache/vllm-dsv41-flash-exl3:/root/.cache/vllm" in vols
    assert f"{HOME}/.cache/vllm-dsv41-flash-exl3/engram-src:/engram-src:ro" in vols
    assert not any(":/engram-packed" in v for v in vols)          # no packed shard on this node (fact)
    env = dict(e.split("=", 1) for e in envs)
    for k, v in {**SEED_A_COMMON_ENV, **SEED_A_RANK_ENV[node]}.items():
        assert env.get(k) == v, f"{k}: rendered {env.get(k)!r}, seed A {v!r}"
    assert "TP_SOCKET_IFNAME" not in env and "MASTER_ADDR" not in env    # seed A: master is a CLI flag
    assert "DSV41_PACKED_DIR" not in env


def test_seed_a_packed_engram_only_where_the_rank_file_exists():
    facts = {"head": NodeFacts(home=HOME, packed_engram=True), "worker": NodeFacts(home=HOME)}
    plan = _plan("exl3-v41", facts=facts)
    _, hv, he = docker_opts(plan.head.docker_argv)
    _, wv, we = docker_opts(plan.rank("worker").docker_argv)
    assert f"{HOME}/dsv41-engram:/engram-packed:ro" in hv and "DSV41_PACKED_DIR=/engram-packed" in he
    assert wv and we and not any("engram-packed" in v for v in wv + we)


# ----------------------------------------------------------------------------- seed B (dspark-v4)

SEED_B_SERVE = {
    "--revision": "86f746b36186f0e567729a5c06a8c918caba82a9", "--served-model-name": "deepseek-v4-flash-vision-exp",
    "--host": "0.0.0.0", "--port": "8888", "--trust-remote-code": True, "--tensor-parallel-size": "2",
    "--pipeline-parallel-size": "1", "--kv-cache-dtype": "nvfp4_ds_mla", "--block-size": "256",
    "--max-model-len": "1048576", "--max-num-seqs": "6", "--max-num-batched-tokens": "8192",
    "--long-prefill-token-threshold": "1024", "--max-cudagraph-capture-size": "48",
    "--gpu-memory-utilization": "0.835", "--enable-prefix-caching": True, "--enable-prompt-tokens-details": True,
    "--async-scheduling": True, "--enable-chunked-prefill": True,
    "--speculative-config": '{"method":"dspark","num_speculative_tokens":6,"draft_sample_method":"probabilistic"}',
    "--tokenizer-mode": "deepseek_v4", "--distributed-executor-backend": "mp", "--moe-backend": "flashinfer_b12x",
    "--tool-call-parser": "deepseek_v4", "--enable-auto-tool-choice": True, "--reasoning-parser": "deepseek_v4",
    "--reasoning-config": '{"reasoning_parser":"deepseek_v4","reasoning_start_str":"<think>",'
                          '"reasoning_end_str":"</think>"}',
    "--default-chat-template-kwargs": '{"thinking":true,"reasoning_effort":"low"}',
    "--generation-config": "vllm", "--enable-flashinfer-autotune": True, "--nnodes": "2",
    "--master-addr": "10.0.0.1", "--master-port": "25000", "--limit-mm-per-prompt": '{"image":8}',
}
SEED_B_DOCKER = [("--gpus", "all"), ("--network", "host"), ("--ipc=host", ""), ("--shm-size", "64g"),
                 ("--device", "/dev/infiniband"), ("--ulimit", "memlock=-1"), ("--ulimit", "stack=67108864")]
SEED_B_ENV = {
    "HF_HOME": "/cache/huggingface", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_XET": "1",
    "DSPARK_MODEL": "deepseek-ai/DeepSeek-V4-Flash-Vision-Exp",
    "DSPARK_REVISION": "86f746b36186f0e567729a5c06a8c918caba82a9",
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "4096", "DSPARK_MAX_INFLIGHT_PREFILLS": "1",   # compose @ 01eed1e
    "VLLM_CACHE_ROOT": "/cache/huggingface/vllm-cache", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "256", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0",
    "VLLM_USE_FLASHINFER_SAMPLER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800", "VLLM_USE_B12X_MOE": "1", "TORCH_CUDA_ARCH_LIST": "12.1a",
    "FLASHINFER_CUDA_ARCH_LIST": "12.1a", "CUTE_DSL_ARCH": "sm_121a", "FLASHINFER_DISABLE_VERSION_CHECK": "1",
    "FLASHINFER_WORKSPACE_BASE": "/cache/huggingface/flashinfer", "TILELANG_CLEANUP_TEMP_FILES": "1",
    "TILELANG_CACHE_DIR": "/cache/huggingface/tilelang-cache", "DG_JIT_USE_NVRTC": "0",
    "DG_JIT_NVCC_COMPILER": "/usr/local/cuda/bin/nvcc", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ROCE_VERSION_NUM": "2",
    "NCCL_CROSS_NIC": "1", "NCCL_CUMEM_ENABLE": "0", "NCCL_IGNORE_CPU_AFFINITY": "1", "NCCL_DEBUG": "WARN",
    "NCCL_NVLS_ENABLE": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "25000", "MTP_NUM_TOKENS": "6",
    "DRAFT_SAMPLE_METHOD": "probabilistic", "DEFAULT_THINKING": "low", "TP_SIZE": "2", "NNODES": "2",
    "TRITON_CACHE_DIR": "/cache/huggingface/triton-cache", "LIMIT_MM_PER_PROMPT": '{"image":8}',
}
SEED_B_RANK_ENV = {
    "head": {"NODE_RANK": "0", "HEADLESS": "", "VLLM_HOST_IP": "10.0.0.1", "NCCL_IB_HCA": "rocep1s0f1",
             "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "TP_SOCKET_IFNAME": "enp1s0f1np1",
             "GLOO_SOCKET_IFNAME": "enp1s0f1np1"},
    "worker": {"NODE_RANK": "1", "HEADLESS": "1", "VLLM_HOST_IP": "10.0.0.2", "NCCL_IB_HCA": "rocep1s0f0",
               "NCCL_SOCKET_IFNAME": "enp1s0f0np0", "TP_SOCKET_IFNAME": "enp1s0f0np0",
               "GLOO_SOCKET_IFNAME": "enp1s0f0np0"},
}


@pytest.mark.parametrize("node,rank", [("head", 0), ("worker", 1)])
def test_seed_b_serve_argv(node, rank):
    r = _plan("dspark-v4", {"API_HOST": "0.0.0.0"}).rank(node)
    argv = r.serve_argv
    assert argv[:3] == ["/usr/local/bin/vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash-Vision-Exp"]   # compose exec
    f = flags(argv[3:])
    for k, v in SEED_B_SERVE.items():
        assert f.get(k) == v, f"{k}: rendered {f.get(k)!r}, seed B {v!r}"
    assert f["--node-rank"] == str(rank)
    assert (f.get("--headless") is True) == (node == "worker")
    assert "--api-key" not in f and "--quantization" not in f and "--enforce-eager" not in f


@pytest.mark.parametrize("node", ["head", "worker"])
def test_seed_b_docker_and_env(node):
    r = _plan("dspark-v4").rank(node)
    opts, vols, envs = docker_opts(r.docker_argv)
    for o in SEED_B_DOCKER:
        assert o in opts, o
    assert ("--name", "deepseek-v4-flash-vllm-dspark-1") in opts
    # the recipe's hotfix chain runs first (bash -l like the compose's bash -lc), then execs the serve argv
    assert ("--entrypoint", "bash") in opts
    i = r.docker_argv.index("--entrypoint")
    assert r.docker_argv[i + 2] == \
        "ghcr.io/anemll/dspark-vllm-gx10:0.1.1@sha256:a83948492cf13df455170fb42885f5ef4db54fefe0feff0f841ecbff464ac9d8"
    assert r.docker_argv[i + 3:i + 5] == ["-l", "/opt/spark-runbook/entrypoint.sh"]
    assert r.docker_argv[i + 5:] == r.serve_argv
    assert f"{HOME}/.cache/huggingface:/cache/huggingface" in vols
    env = dict(e.split("=", 1) for e in envs)
    for k, v in {**SEED_B_ENV, **SEED_B_RANK_ENV[node]}.items():
        assert env.get(k) == v, f"{k}: rendered {env.get(k)!r}, seed B {v!r}"
    assert "NCCL_IB_GID_INDEX" not in env      # NCCL_IB_GID_AUTO: leave it to NCCL per HCA


def test_seed_b_capture_size_is_rounded_up_to_8():
    # "plain 42 truncates to 40 and costs 12 % at c=6": 6 x (6+1) = 42 -> 48
    assert flags(_plan("dspark-v4").head.serve_argv)["--max-cudagraph-capture-size"] == "48"
    assert flags(_plan("dspark-v4", {"MAX_NUM_SEQS": "4"}).head.serve_argv)["--max-cudagraph-capture-size"] == "32"


# ----------------------------------------------------------------------------- lab

@pytest.mark.parametrize("runtime", ["process", "docker"])
def test_lab_drops_gpu_and_rdma_and_adds_cpu_knobs(runtime):
    plan = _plan("lab", {"RUNTIME": runtime})
    assert [r.rank for r in plan.ranks] == [0, 1]
    for r in plan.ranks:
        env = r.env
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == str(r.rank)
        assert env["VLLM_HOST_IP"] == ("169.254.77.1" if r.rank == 0 else "169.254.77.2")
        for k in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):   # the lab cable's two ends
            assert env[k] == ("enp1s0f1np1" if r.rank == 0 else "enp1s0f0np0")
        assert "NCCL_IB_HCA" not in env and "NCCL_IB_GID_INDEX" not in env
        f = flags(r.serve_argv)
        assert f["--enforce-eager"] is True and f["--distributed-executor-backend"] == "mp"
        assert f["--master-addr"] == "169.254.77.1" and f["--master-port"] == "29501"
        assert f["--tool-strict-level"] == "parameter"
        if runtime == "docker":
            joined = " ".join(r.docker_argv)
            assert "--gpus" not in joined and "/dev/infiniband" not in joined and "memlock" not in joined
            assert "--network host" in joined and "stack=67108864" in joined
            # same IPC flag as on Sparks: each lab node has its own IPC namespace and /dev/shm
            assert "--ipc=host" in joined and "--shm-size 1g" in joined


def test_lab_vllm_bin_relative_parts_resolve_against_the_repo_root():
    r = _plan("lab").head
    assert r.serve_argv[:3] == [str(REPO_ROOT / ".lab/vllm-venv/bin/python"),
                                str(REPO_ROOT / "runbook/lab/vllm_cli.py"), "serve"]


def test_process_start_command_backgrounds_only_the_server():
    cmd = _plan("lab").head.start_command()
    assert " setsid nohup " in cmd and "< /dev/null & echo $! >" in cmd
    # the && chain must end before the background job, else $! would be a subshell
    assert "&& env " not in cmd and cmd.count(" & ") == 1


def test_docker_start_command_labels_the_fingerprint():
    plan = _plan("lab", {"RUNTIME": "docker"})
    cmd = plan.head.start_command()
    assert f"--label spark-runbook.fingerprint={plan.fingerprint}" in cmd
    assert cmd.index("docker rm -f spark-runbook-head") < cmd.index("docker run -d")


# ----------------------------------------------------------------------------- secrets, fingerprint, consistency

@pytest.mark.parametrize("name", ["lab", "exl3-v41", "dspark-v4", "tp3-dspark"])
def test_api_binds_loopback_by_default_and_where_api_host_says(name):
    for node in ("head", "worker"):
        assert flags(_plan(name).rank(node).serve_argv)["--host"] == "127.0.0.1"
    wide = _plan(name, {"API_HOST": "0.0.0.0"})
    assert flags(wide.head.serve_argv)["--host"] == "0.0.0.0"
    assert wide.fingerprint != _plan(name).fingerprint      # a server bound elsewhere is not reused


def test_api_key_is_a_masked_environment_reference_never_a_value():
    plan = _plan("lab", api_key_set=True)
    head = plan.head
    assert head.secret_env == ["VLLM_API_KEY"] and "VLLM_API_KEY" not in head.env
    assert "VLLM_API_KEY=***" in shlex.join(head.display_argv())
    # the remote layer exports it from stdin; the start line never names it, so no argv can carry it
    assert "VLLM_API_KEY" not in head.start_command()
    assert "--api-key" not in head.serve_argv
    assert plan.rank("worker").secret_env == []
    dplan = _plan("exl3-v41", api_key_set=True)
    assert dplan.head.docker_argv[dplan.head.docker_argv.index("VLLM_API_KEY") - 1] == "-e"
    rec = json.dumps(plan.to_record())
    assert '"VLLM_API_KEY": "***"' in rec


def test_fingerprint_is_stable_and_tracks_configuration():
    a, b = _plan("lab"), _plan("lab")
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert _plan("lab", {"MAX_NUM_SEQS": "4"}).fingerprint != a.fingerprint
    assert _plan("lab", {"RUNTIME": "docker"}).fingerprint != a.fingerprint
    assert _plan("lab", api_key_set=True).fingerprint != a.fingerprint     # presence, not value
    assert a.ranks and all(r.fingerprint == a.fingerprint for r in a.ranks)


def test_consistency_catches_a_worker_with_another_master_port():
    plan = _plan("lab", node_overrides={"worker": {"master_port": 29599}})
    assert flags(plan.rank("worker").serve_argv)["--master-port"] == "29599"   # rendered honestly
    problems = check_consistency(plan)
    assert problems == ["worker --master-port 29599 but head --master-port 29501"]
    assert check_consistency(_plan("lab")) == []
    with pytest.raises(ValueError):
        _plan("lab", node_overrides={"worker": {"tp": 3}})


def test_gid_index_pinned_or_from_the_network_step():
    plan = _plan("exl3-v41", {"HEAD_GID": "auto", "WORKER_GID": "5"},
                 facts={"head": NodeFacts(home=HOME, gid_index=4), "worker": NodeFacts(home=HOME, gid_index=9)})
    assert plan.head.env["NCCL_IB_GID_INDEX"] == "4"        # auto -> resolved by step 01
    assert plan.rank("worker").env["NCCL_IB_GID_INDEX"] == "5"   # pinned wins
    plan = _plan("exl3-v41", {"HEAD_GID": "auto"})
    assert "NCCL_IB_GID_INDEX" not in plan.head.env          # unresolved: not pinned, visible in the plan


def test_capacity_sizes_scale_in_the_lab():
    sizes = launch.lab_scaled_sizes(load_profile(ENV / "lab.env"))
    assert [n for _, n in sizes] == [128, 781, 1953, 4096]
    assert [n for _, n in launch.lab_scaled_sizes(load_profile(ENV / "dspark-v4.env"))] == \
        [32768, 200000, 500000, 1048576]


# ----------------------------------------------------------------------------- golden files

CASES = [("exl3-v41", {}), ("dspark-v4", {}), ("lab", {}), ("lab", {"RUNTIME": "docker"})]


def _golden_record(r) -> dict:
    rec = {"serve_argv": r.serve_argv, "env": r.env, "secret_env": r.secret_env, "docker_argv": r.docker_argv,
           "entry_argv": r.entry_argv, "entry_path": r.entry_path, "recipe_markers": r.recipe_markers}
    return json.loads(json.dumps(rec).replace(str(REPO_ROOT), "<repo>"))


@pytest.mark.parametrize("name,ov", CASES, ids=[f"{n}-{o.get('RUNTIME', 'default')}" for n, o in CASES])
@pytest.mark.parametrize("node", ["head", "worker"])
def test_golden(name, ov, node):
    plan = _plan(name, ov)
    got = _golden_record(plan.rank(node))
    check_golden(GOLDEN / f"{name}-{ov.get('RUNTIME', 'default')}-{node}.json", json.dumps(got, indent=1) + "\n")


SCRIPT_CASES = [("exl3-v41", {}, False), ("dspark-v4", {}, True), ("tp3-dspark", {}, False)]


@pytest.mark.parametrize("name,ov,keyed", SCRIPT_CASES, ids=[c[0] for c in SCRIPT_CASES])
@pytest.mark.parametrize("node", ["head", "worker"])
def test_golden_entrypoint_scripts(name, ov, keyed, node):
    """The generated seed entrypoints, kept as reviewable shell files."""
    facts = {n: NodeFacts(home=HOME) for n in ("head", "worker", "worker2")}
    script = _plan(name, ov, facts=facts, api_key_set=keyed).rank(node).entry_script
    assert script.startswith("#!/bin/bash") and script.rstrip().endswith('exec "$@"')
    check_golden(GOLDEN / f"{name}-{node}.entrypoint.sh", script)


# ----------------------------------------------------------------------------- pure helpers of the actions

def test_image_plan():
    from runbook.facts.system import plan_image
    from runbook.facts.system import ImageInfo
    lab = load_profile(ENV / "lab.env", {"RUNTIME": "docker"})
    a, b = ImageInfo("sha256:" + "a" * 64, ["sha256:l1"]), ImageInfo("sha256:" + "b" * 64, ["sha256:l1"])
    assert plan_image(lab, {"head": a, "worker": b}).action == "none"        # same layers, different .Id
    p = plan_image(lab, {"head": a, "worker": None})
    assert (p.action, p.targets) == ("ship", ["worker"])
    assert plan_image(lab, {"head": None, "worker": a}).action == "fail"      # the lab never pulls
    seed_b = load_profile(ENV / "dspark-v4.env")                               # digest-pinned
    assert plan_image(seed_b, {"head": None, "worker": None}).action == "pull"
    seed_a = load_profile(ENV / "exl3-v41.env")          # a moving tag: pulled once on the head, then shipped
    moving = plan_image(seed_a, {"head": None, "worker": None})
    assert moving.action == "pull-head" and moving.targets == ["head", "worker"] and "digest" in moving.reason
    assert plan_image(seed_a, {"head": a, "worker": ImageInfo(a.image_id, ["sha256:l2"])}).action == "ship"


PS = ("  10    10 Sl   /v/bin/python /repo/runbook/lab/vllm_cli.py serve /m --port 8000\n"
      "  11    10 Sl   VLLM::EngineCore\n"
      "  12    10 S    /v/bin/python -c from multiprocessing.resource_tracker import main;main(31)\n"
      "  13    13 Z    [python] <defunct>\n"
      "  20    20 S    /v/bin/python -m runbook.lab.tinymodel --out /tmp/x   (vllm-venv, not a server)\n"
      "  30    30 S    vllm serve /model --port 8888\n")


@pytest.mark.parametrize("pid,expected", [("10", [10, 11, 12, 30]), ("", [10, 11, 30])])
def test_rank_state_matches_vllm_processes_and_our_process_group(pid, expected):
    """rank_state reads the pid file, fingerprint, record, container and process table in one command:
    with our pid file its whole process group counts (the resource tracker too); without it only what looks
    like vLLM; zombies and non-servers never."""
    from runbook.facts import ranks
    answer = f"{pid}\n@@\nfp-123\n@@\n\n@@\n\n@@\n{PS}"
    node = FakeNode("head", 0, read_only=True, rules=[(r"^cat \S+/head\.pid 2>/dev/null; .*" + re.escape(ranks.PS_CMD) + "$", answer)])
    st = ranks.rank_state(node, load_profile(ENV / "lab.env"), home="/root")
    assert [int(p.split()[0]) for p in st.processes] == expected
    assert (st.running, st.runtime, st.fingerprint) == ((True, "process", "fp-123") if pid else (False, "", ""))


@pytest.mark.parametrize("status,running", [("running", True), ("restarting", True), ("created", False),
                                            ("exited", False)])
def test_rank_state_a_created_or_exited_container_is_a_leftover_not_a_rank(status, running):
    """A failed `docker run` leaves our container "created": it is not a running rank (the next start would
    refuse it as stale), but it is still reported so stop removes it."""
    from runbook.facts import ranks
    answer = f"\n@@\n\n@@\n\n@@\n{status} fp-9\n@@\n"
    node = FakeNode("worker", 1, read_only=True, rules=[(r"^cat \S+/worker\.pid 2>/dev/null; ", answer)])
    st = ranks.rank_state(node, load_profile(ENV / "lab.env", {"RUNTIME": "docker"}), home="/root")
    assert st.container_status == status
    assert (st.running, st.runtime) == ((True, "docker") if running else (False, ""))


def test_start_progress_is_a_non_periodic_log_line():
    from runbook.facts import ranks
    W = ranks.RankWatch
    assert ranks.log_progressed(W(True, 10, ["a"] * 10), W(True, 11, ["a"] * 10 + ["Loading weights took 1 s"]))
    assert not ranks.log_progressed(W(True, 10, ["x"]), W(True, 11, ["x", 'INFO: 1.2.3.4 - "GET /health HTTP/1.1" 200']))
    assert not ranks.log_progressed(W(True, 10, []), W(True, 10, []))


def test_gids_from_the_network_record_and_api_host():
    from runbook.launch.plan import gid_indexes
    from runbook.records import NetworkRecord
    from runbook.api import endpoint
    profile = load_profile(ENV / "exl3-v41.env")
    # 01's record answers; no node is read (the cluster would refuse any read)
    assert gid_indexes(None, profile, NetworkRecord(gid_index={"head": 3})) == {"head": 3}
    assert gid_indexes(None, load_profile(ENV / "lab.env"), None) == {}          # EXPECT_RDMA=0, no 01
    assert endpoint.api_host(load_profile(ENV / "exl3-v41.env")) == "spark1"
    assert endpoint.api_host(load_profile(ENV / "lab.env", {"HEAD_SSH": "root@10.1.2.3:2222", "SSH_CONFIG": ""})) \
        == "10.1.2.3"


@pytest.mark.parametrize("answers,expected", [
    (["alive"], set()),                                 # alive at once: one read, no wait
    (["dead", "alive"], set()),                         # a container between created and running
    (["dead", "dead"], {"worker"}),                     # never came up: named, with its log tail
])
def test_workers_not_running_before_the_head_starts(monkeypatch, answers, expected):
    from runbook.facts import ranks
    from runbook.launch import server
    from support.doubles import FakeCluster
    monkeypatch.setattr(server.time, "sleep", lambda s: None)
    plan = _plan("lab")
    replies = iter(answers)
    watch = re.escape(ranks.rank_watch_cmd(plan.rank("worker")))
    worker = FakeNode("worker", 1, read_only=True,
                      rules=[(watch, lambda cmd: f"1000\nsome avg10=0.00 avg60=0.00 avg300=0.00 total=0 full avg10=0.00 "
                                                f"avg60=0.00 avg300=0.00 total=0 \n{next(replies)}\n2\nstarting\n"
                                                "env: 'vllm': No such file")])
    gone = server._workers_not_running(FakeCluster([FakeNode("head", 0, read_only=True), worker]), plan)
    assert set(gone) == expected
    assert len(worker.reads()) == len(answers)
    if expected:
        assert "No such file" in gone["worker"] and "not running 2 s after its start" in gone["worker"]


def test_server_rows_name_a_heads_orphaned_children_and_the_ranks_left_running():
    """The head's API server died (its pid gone) but its EngineCore / TP worker processes did not, and the
    worker's rank still runs: each rank's row, and one "no orphaned ranks" row naming both with the stop command."""
    from runbook.api import health
    from support.doubles import FakeCluster
    profile = load_profile(ENV / "lab.env", {"PORT": "1", "API_HOST": "0.0.0.0"})   # nothing answers there
    head_ps = ("  11    10 Sl   VLLM::EngineCore\n"
               "  12    10 Sl   /v/bin/python -c from multiprocessing.spawn import spawn_main; VLLM::Worker_TP0\n")
    worker_ps = "  20    20 Sl   /v/bin/python /repo/runbook/lab/vllm_cli.py serve /m --headless\n"
    cluster = FakeCluster([rank_node("head", 0, pid=10, fingerprint="fp-1", ps=head_ps),
                           rank_node("worker", 1, pid=20, fingerprint="fp-1", ps=worker_ps)])
    rows = {(r.name, r.node): r for r in health.server_rows(cluster, profile)}
    assert rows[("server answers /health", "head")].failed
    assert rows[("rank running", "head")].failed and not rows[("rank running", "worker")].failed
    orphans = [r for (name, _), r in rows.items() if name == "no orphaned ranks"]
    assert len(orphans) == 1 and orphans[0].failed
    assert "head (2 vLLM process(es) without their server: 11, 12)" in orphans[0].observed
    assert "worker" in orphans[0].observed and "runbook stop" in orphans[0].fix


# ----------------------------------------------------------------------------- issue #22: what the seeds' scripts set

def test_seed_a_passes_its_exl3_kernel_settings_and_glm53_switches():
    """Defect 7: start.sh passes EXL3_* (serve_env) and GLM53_* (nccl_common) into both containers, with the values
    .env.example @ 503b482 gives them; without them the ranks ran the overlay's legacy kernels."""
    want = {"EXL3_FUSED_MOE": "1", "EXL3_MOE_ROW_TILE": "0", "EXL3_TEMP_ROWS_FUSED": "16", "EXL3_FAT_SORTED": "0",
            "EXL3_FAT_BATCHED": "0", "EXL3_FAT_KERNEL": "0", "EXL3_FAT_GROUPED": "1",
            "GLM53_SUPPRESS_STOPS_IN_REASONING": "1", "GLM53_MIXED_PREFILL_CHUNK": "0",
            "GLM53_INDEXER_WORKSPACE": "stock", "GLM53_SPINWAIT_MS": "stock"}
    for node in ("head", "worker"):
        env = dict(e.split("=", 1) for e in docker_opts(_plan("exl3-v41").rank(node).docker_argv)[2])
        assert {k: env.get(k) for k in want} == want, node


@pytest.mark.parametrize("name", ["dspark-v4", "tp3-dspark"])
def test_seed_b_passes_its_compose_only_environment(name):
    """Defect 7: the compose's environment (01eed1e) sets the b12x kernel knobs and every DSPARK_* switch; the
    chain and the b12x kernels read them in the container, so a start without them ran other code paths."""
    want = {"VLLM_B12X_W4A16_FORCE_BLOCKS_PER_SM": "0", "VLLM_B12X_W4A16_FORCE_BLOCKS_MAX_M": "16",
            "B12X_W4A16_TC_DECODE": "0", "DSPARK_ASYNC_SCHEDULING": "1", "DSPARK_SKIP_HOTFIX": "0",
            "DSPARK_SP_INDEXER_MIN_KEYS": "8192", "DSPARK_ISSUE191_TOOLCALL_MODE": "failclosed",
            "DSPARK_ENABLE_ISSUE141_SPARSE_MLA_CHUNK": "0", "DSV4_ABLATE_LAYERS": "10-42"}
    plan = _plan(name, facts={n: NodeFacts(home=HOME) for n in ("head", "worker", "worker2")})
    for r in plan.ranks:
        env = dict(e.split("=", 1) for e in docker_opts(r.docker_argv)[2])
        assert {k: env.get(k) for k in want} == want, r.node


@pytest.mark.parametrize("name", ["dspark-v4", "tp3-dspark"])
def test_dspark_gpu_memory_utilization_is_the_vision_exp_start_value_and_the_plan_figure_matches(name):
    """Defect 6: the compose @ 01eed1e starts Vision-Exp at --gpu-memory-utilization 0.835 and its published boot
    (17.04 GiB KV, 2,331,430 tokens) was taken there; both dspark profiles said 0.80 (~25 % less KV) while `plan`
    printed the 0.835 figure "at 0.80"."""
    from runbook.fit.figures import RECIPES
    plan = _plan(name, facts={n: NodeFacts(home=HOME) for n in ("head", "worker", "worker2")})
    assert {flags(r.serve_argv)["--gpu-memory-utilization"] for r in plan.ranks} == {"0.835"}
    boot = RECIPES["dspark-v4"].util_boot
    assert boot.util == load_profile(ENV / f"{name}.env").gpu_mem_util == 0.835
    assert "0.835" in boot.note and "0.80" not in boot.note


def test_restart_policy_is_the_recipes():
    """Risk: seed B's compose restarts its ranks (`restart: unless-stopped`, stop grace 10 s), so dockerd brings
    them back after a reboot; seed A's `docker run` has no restart policy (--stop-timeout 60)."""
    b = docker_opts(_plan("dspark-v4").head.docker_argv)[0]
    assert ("--restart", "unless-stopped") in b and ("--stop-timeout", "10") in b
    a = docker_opts(_plan("exl3-v41").head.docker_argv)[0]
    assert not any(o == "--restart" for o, _ in a) and ("--stop-timeout", "60") in a
    lab = docker_opts(_plan("lab", {"RUNTIME": "docker"}).head.docker_argv)[0]
    assert not any(o == "--restart" for o, _ in lab)


def test_a_rank_dockerd_restored_after_a_reboot_is_already_running_exit_3(monkeypatch):
    """Risk (issue #22): with seed B's `--restart unless-stopped` dockerd brings both ranks back after a reboot; the
    runbook's pid/record files say nothing (the record may be stale, the pid gone), only the container runs with
    the fingerprint label. A start then reuses it and exits 3 ("already running"), as the seed's start script does
    (#72); nothing is relaunched."""
    from runbook.errors import ALREADY_RUNNING
    from runbook.launch import ranks, server
    profile = load_profile(ENV / "dspark-v4.env")
    plan = render(profile, FACTS)
    assert ("--restart", "unless-stopped") in docker_opts(plan.head.docker_argv)[0]
    restored = f"\n@@\n\n@@\n\n@@\nrunning {plan.fingerprint}\n@@\n"      # no pid, no fingerprint file, no record
    nodes = [FakeNode(n, i, read_only=True, rules=[
        (re.escape('printf %s "$HOME"'), HOME),
        (r"^cat \S+/" + n + r"\.pid 2>/dev/null; .*" + re.escape(ranks.PS_CMD) + "$", restored)])
        for i, n in enumerate(("head", "worker"))]
    from support.doubles import FakeCluster
    monkeypatch.setattr(server, "base_url", lambda p: "http://127.0.0.1:8888")  # no SSH forward in a unit test
    monkeypatch.setattr(server, "_recipe_checkout", lambda *a, **k: True)       # read-only checkout rows
    monkeypatch.setattr(server, "_readiness", lambda cluster, profile, plan, result, *a, **k: result)
    result = server.start(FakeCluster(nodes), profile, plan, api_key="", raise_on_failure=False)
    assert result.reused and server.exit_code(result) == ALREADY_RUNNING
    assert all(not c.startswith("docker") for n in nodes for c in n.commands)    # nothing started or removed


@pytest.mark.parametrize("state,fresh,alive", [("true 0", True, True), ("true 3", True, False), ("false 3", True, False),
                                               ("true 3", False, True), ("false 0", False, False)])
def test_a_fresh_container_that_docker_restarted_is_a_crash_not_a_live_rank(tmp_path, state, fresh, alive):
    """With seed B's restart policy a rank that crashes while booting is restarted by dockerd and looks alive
    between crashes; the start's watch counts a container it created as dead once docker restarted it (a
    restored, reused server keeps its restart count)."""
    import subprocess
    from runbook.launch import ranks
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\ncase \"$1\" in inspect) echo '{state}';; logs) echo booting;; esac\n")
    (bin_dir / "docker").chmod(0o755)
    cmd = ranks.rank_watch_cmd(_plan("dspark-v4").rank("worker"), fresh=fresh)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout.splitlines()
    assert out[0] == ("alive" if alive else "dead")
