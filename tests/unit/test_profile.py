"""Profile loading and validation (runbook/profile/)."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from runbook.errors import ProfileError
from runbook.profile import (KEYS, absent_node_keys, OVERRIDE, NodeSpec, Profile, ProfileWarning, load_profile,
                             parse_env_text, round_up)

REPO = Path(__file__).resolve().parents[2]
ENV_FILES = ["lab.env", "exl3-v41.env", "dspark-v4.env"]
NO_ENV: dict[str, str] = {}


def write(tmp_path: Path, text: str, name: str = "p.env") -> Path:
    d = tmp_path / "env"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(text)
    return p


def lab_with(tmp_path: Path, **changes: str) -> Path:
    """env/lab.env with some keys replaced in place (line numbers kept); value None drops the line."""
    lines = (REPO / "env" / "lab.env").read_text().splitlines()
    out = []
    for line in lines:
        key = line.split("=", 1)[0] if "=" in line and not line.startswith("#") else None
        if key in changes:
            if changes[key] is None:
                out.append("# (removed)")
            else:
                out.append(f"{key}={changes.pop(key)}")
        else:
            out.append(line)
    out += [f"{k}={v}" for k, v in changes.items() if v is not None]
    return write(tmp_path, "\n".join(out) + "\n")


def line_of(path: Path, key: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith(f"{key}="):
            return i
    raise AssertionError(key)


def issues(path: Path, overrides=None) -> list:
    with pytest.raises(ProfileError) as ei:
        load_profile(path, overrides, environ=NO_ENV)
    return ei.value.issues


# ----------------------------------------------------------------------------- the shipped files

@pytest.mark.parametrize("name", ENV_FILES)
def test_env_file_loads_and_sets_every_key(name):
    p = load_profile(REPO / "env" / name, environ=NO_ENV)
    # every key but the per-node keys of nodes the profile does not have (WORKER3_* ... WORKER7_*)
    optional = set(absent_node_keys(p.node_count))
    assert optional and set(KEYS) - optional <= set(p.key_lines) <= set(KEYS), set(KEYS) - optional - set(p.key_lines)
    assert p.source == REPO / "env" / name


@pytest.mark.parametrize("name", ENV_FILES)
def test_env_file_every_key_has_comment_above(name):
    lines = (REPO / "env" / name).read_text().splitlines()
    assert lines, name
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert i > 0 and lines[i - 1].startswith("# "), f"{name}:{i + 1} {line} has no comment above"


def test_shipped_values():
    lab = load_profile(REPO / "env" / "lab.env", environ=NO_ENV)
    assert lab.is_lab and lab.lab and lab.runtime == "process" and lab.tool_call_parser == "hermes"
    assert (lab.head_ip, lab.worker_ip, lab.port, lab.master_port) == ("169.254.77.1", "169.254.77.2", 8000, 29501)
    assert lab.bench_concurrency == [1, 2, 4] and lab.bench_prefill_tokens == [1024, 3072]
    assert lab.head_cx7_ib == [] and lab.head_gid == "auto" and lab.min_tcp_gbps == 0.1

    a = load_profile(REPO / "env" / "exl3-v41.env", environ=NO_ENV)
    assert (a.max_model_len, a.max_num_seqs, a.max_num_batched_tokens, a.long_prefill_token_threshold) == \
        (600000, 2, 1536, 1280)
    assert a.kv_cache_memory_bytes == 2684354560 and a.gpu_mem_util == 0.88 and a.kv_block_size == 64
    assert a.limit_mm == {"image": 100} and a.head_gid == 3 and a.head_cx7_ib == ["rocep1s0f1"]
    assert a.speculative_config == {"method": "dspark", "num_speculative_tokens": 3}
    assert not a.is_lab and a.master_addr == "10.0.0.1"

    b = load_profile(REPO / "env" / "dspark-v4.env", environ=NO_ENV)
    assert b.hf_revision == "86f746b36186f0e567729a5c06a8c918caba82a9"
    assert b.image.endswith("@sha256:a83948492cf13df455170fb42885f5ef4db54fefe0feff0f841ecbff464ac9d8")
    assert (b.max_model_len, b.spec_tokens, b.master_port, b.expect_kv_tokens) == (1048576, 6, 25000, 2331430)
    assert b.cudagraph_capture_size == 48 and b.limit_mm == {"image": 8} and b.default_thinking == "low"


# ----------------------------------------------------------------------------- acceptance: 3 problems

def test_unknown_key_wrong_type_and_conflict_reported_together(tmp_path):
    text = (REPO / "env" / "lab.env").read_text()
    text = text.replace("MAX_MODEL_LEN=4096", "MAX_MODL_LEN=4096")          # unknown key
    text = text.replace("MAX_NUM_SEQS=8", "MAX_NUM_SEQS=abc")               # wrong type
    text = text.replace("MASTER_PORT=29501", "MASTER_PORT=8000")            # PORT == MASTER_PORT
    path = write(tmp_path, text)
    found = issues(path)
    assert len(found) == 3, [str(i) for i in found]
    by_key = {i.key: i for i in found}
    assert set(by_key) == {"MAX_MODL_LEN", "MAX_NUM_SEQS", "MASTER_PORT"}

    unk = by_key["MAX_MODL_LEN"]
    assert (unk.path, unk.line) == (str(path), line_of(path, "MAX_MODL_LEN"))
    assert "did you mean MAX_MODEL_LEN?" in unk.message and "MAX_MODEL_LEN" in unk.fix

    typ = by_key["MAX_NUM_SEQS"]
    assert typ.line == line_of(path, "MAX_NUM_SEQS")
    assert typ.message == "expected an integer, got 'abc'" and typ.fix

    conf = by_key["MASTER_PORT"]  # MASTER_PORT comes after PORT in the file: the second key
    assert line_of(path, "MASTER_PORT") > line_of(path, "PORT")
    assert conf.line == line_of(path, "MASTER_PORT") and "8000" in conf.message and conf.fix

    text_msg = str(ProfileError(found))
    assert f"{path}:{line_of(path, 'MAX_NUM_SEQS')}: MAX_NUM_SEQS: expected an integer, got 'abc' (fix: " in text_msg


def test_issues_sorted_by_line(tmp_path):
    path = lab_with(tmp_path, SOAK_SECONDS="x", PORT="0")
    lines = [i.line for i in issues(path)]
    assert lines == sorted(lines) and len(lines) == 2


# ----------------------------------------------------------------------------- parsing

def test_parser_quotes_comments_export():
    entries, probs = parse_env_text(
        "# c\n\nexport A=1\nB='x # y'\nC=\"q\\\"z\"  # trailing\nD=v # c\nE={\"image\":8}\nF=\n", "f")
    assert probs == []
    assert [(e.key, e.value, e.line) for e in entries] == [
        ("A", "1", 3), ("B", "x # y", 4), ("C", 'q"z', 5), ("D", "v", 6), ("E", '{"image":8}', 7), ("F", "", 8)]


def test_parser_reports_bad_lines():
    _, probs = parse_env_text("OK=1\nnot a line\nX='open\n1BAD=2\n", "f.env")
    assert [(p.line, p.key) for p in probs] == [(2, "<syntax>"), (3, "X"), (4, "1BAD")]


def test_duplicate_key_rejected_at_second_line(tmp_path):
    path = lab_with(tmp_path)
    path.write_text(path.read_text() + "PORT=8001\n")
    (iss,) = issues(path)
    assert iss.key == "PORT" and iss.line == len(path.read_text().splitlines())
    assert f"first at line {line_of(path, 'PORT')}" in iss.message


def test_missing_required_key(tmp_path):
    path = lab_with(tmp_path, HEAD_IP=None)
    (iss,) = issues(path)
    assert iss.key == "HEAD_IP" and "required" in iss.message and iss.line == 0 and iss.path == str(path)


def test_missing_file():
    with pytest.raises(ProfileError, match="profile not found"):
        load_profile("/nonexistent/x.env", environ=NO_ENV)


# ----------------------------------------------------------------------------- keys and types

@pytest.mark.parametrize("wrong,suggest", [("MAX_NUM_SEQ", "MAX_NUM_SEQS"), ("GPU_MEM_UTILL", "GPU_MEM_UTIL"),
                                           ("MTP_NUM_TOKENS", "SPEC_TOKENS"), ("DSPARK_TOKENS", "SPEC_TOKENS"),
                                           ("max_model_len", "MAX_MODEL_LEN")])
def test_closest_key_suggestion(tmp_path, wrong, suggest):
    path = lab_with(tmp_path, **{wrong: "1"})
    (iss,) = issues(path)
    assert iss.key == wrong and suggest in iss.message + iss.fix


def test_unknown_key_without_close_match(tmp_path):
    (iss,) = issues(lab_with(tmp_path, ZZZ_QQQ="1"))
    assert iss.message == "unknown key"


@pytest.mark.parametrize("key,value,expect", [
    ("PORT", "70000", "out of range"), ("PORT", "0", "out of range"), ("GPU_MEM_UTIL", "0", "out of range"),
    ("GPU_MEM_UTIL", "1.01", "out of range"), ("MAX_MODEL_LEN", "1048577", "out of range"),
    ("MAX_NUM_SEQS", "4097", "out of range"), ("MAX_NUM_BATCHED_TOKENS", "8388609", "out of range"),
    ("TP", "0", "out of range"), ("NNODES", "0", "out of range"), ("GPU_MEM_UTIL", "high", "expected a number"),
    ("ENFORCE_EAGER", "yes", "expected 0/1/true/false"), ("RUNTIME", "podman", "expected one of docker|process"),
    ("SPEC_METHOD", "mtp", "expected one of none|dspark"), ("HEAD_IP", "10.0.0.300", "expected an IPv4"),
    ("HEAD_GID", "-1", "expected 'auto' or a GID"), ("HEAD_GID", "256", "out of range"),
    ("LIMIT_MM", "image=8", "expected a JSON object"), ("LIMIT_MM", '{"image":"8"}', "modality -> count"),
    ("BENCH_CONCURRENCY", "1,two", "list of integers"), ("KV_BLOCK_SIZE", "48", "power of two"),
    ("WEIGHTS_DIR", "models/tiny", "absolute or ~/ path"), ("HEAD_CX7_IF", "a-very-long-interface0", "interface"),
    ("EXTRA_ARGS", "--x 'open", "cannot split"), ("WEIGHT_SYNC", "zfs", "nfs|rsync|download-both"),
])
def test_type_and_range_errors(tmp_path, key, value, expect):
    path = lab_with(tmp_path, **{key: value})
    found = issues(path)
    assert [i.key for i in found] == [key], [str(i) for i in found]
    assert expect in found[0].message and found[0].line == line_of(path, key) and found[0].fix


@pytest.mark.parametrize("key,value,attr,expect", [
    ("PORT", "65535", "port", 65535), ("GPU_MEM_UTIL", "1", "gpu_mem_util", 1.0),
    ("ENFORCE_EAGER", "true", "enforce_eager", True), ("ENFORCE_EAGER", "0", "enforce_eager", False),
    ("HEAD_GID", "7", "head_gid", 7), ("HEAD_CX7_IB", "rocep1s0f0, roceP2p1s0f0", "head_cx7_ib",
                                         ["rocep1s0f0", "roceP2p1s0f0"]),
    ("BENCH_CONCURRENCY", "1,8", "bench_concurrency", [1, 8]), ("LIMIT_MM", '{"image":2}', "limit_mm", {"image": 2}),
])
def test_valid_values_parse(tmp_path, key, value, attr, expect):
    p = load_profile(lab_with(tmp_path, **{key: value}), environ=NO_ENV)
    assert getattr(p, attr) == expect


# ----------------------------------------------------------------------------- secrets in a profile

@pytest.mark.parametrize("key", ["HF_TOKEN", "VLLM_API_KEY", "GHCR_TOKEN", "MY_API_KEYS", "HUGGING_FACE_HUB_TOKEN"])
def test_secret_keys_rejected(tmp_path, key):
    path = lab_with(tmp_path, **{key: "s3cretvalue"})
    (iss,) = issues(path)
    assert iss.key == key and iss.line == line_of(path, key)
    assert "secrets never live in a profile" in iss.message
    assert "~/.config/spark-runbook/secrets.env" in iss.message
    assert "s3cretvalue" not in str(ProfileError([iss]))


def test_token_shaped_value_rejected_without_echo(tmp_path):
    tok = "hf_" + "a1B2" * 8
    path = lab_with(tmp_path, EXTRA_ARGS=f"--x {tok}")
    (iss,) = issues(path)
    assert iss.key == "EXTRA_ARGS" and tok not in str(ProfileError([iss]))


def test_api_key_flag_in_extra_args_rejected(tmp_path):
    (iss,) = issues(lab_with(tmp_path, EXTRA_ARGS="--api-key abc"))
    assert iss.key == "EXTRA_ARGS" and "secrets never live in a profile" in iss.message


def test_secret_override_rejected(tmp_path):
    (iss,) = issues(REPO / "env" / "lab.env", {"HF_TOKEN": "x"})
    assert (iss.key, iss.path, iss.line) == ("HF_TOKEN", OVERRIDE, 0)


# ----------------------------------------------------------------------------- cross-field rules
# Each case: (changes that are valid, changes that are invalid, key the issue is reported at)

CROSS = {
    "vision_mnbt": ({"VISION": "1", "MAX_NUM_BATCHED_TOKENS": "1025"},
                    {"VISION": "1", "MAX_NUM_BATCHED_TOKENS": "1024"}, "VISION"),  # VISION is the later line
    "same_ip": ({"WORKER_IP": "169.254.77.3"}, {"WORKER_IP": "169.254.77.1"}, "WORKER_IP"),
    "same_ssh": ({"WORKER_SSH": "spark-worker"}, {"WORKER_SSH": "spark-head"}, "WORKER_SSH"),
    "ports": ({"MASTER_PORT": "29502"}, {"MASTER_PORT": "8000"}, "MASTER_PORT"),
    "tp_nnodes": ({"TP": "2"}, {"TP": "1"}, "NNODES"),  # NNODES is the later line: the second key
    "nnodes_count": ({"NNODES": "2", "TP": "2"}, {"NNODES": "3", "TP": "3"}, "NNODES"),
    "three_nodes": ({"WORKER2_SSH": "spark-worker2", "WORKER2_IP": "169.254.77.3", "WORKER2_CX7_IF": "enp1s0f0np0",
                     "NNODES": "3", "TP": "3"},
                    {"WORKER2_SSH": "spark-worker2", "WORKER2_IP": "169.254.77.3", "WORKER2_CX7_IF": "enp1s0f0np0"}, "NNODES"),
    "worker2_needs_ip": ({"WORKER2_SSH": "w2", "WORKER2_IP": "169.254.77.3", "WORKER2_CX7_IF": "eth1",
                          "NNODES": "3", "TP": "3"},
                         {"WORKER2_SSH": "w2", "WORKER2_CX7_IF": "eth1", "NNODES": "3", "TP": "3"},
                         "WORKER2_SSH"),
    "long_prefill": ({"MAX_NUM_BATCHED_TOKENS": "1536", "LONG_PREFILL_TOKEN_THRESHOLD": "1280"},
                     {"MAX_NUM_BATCHED_TOKENS": "1536", "LONG_PREFILL_TOKEN_THRESHOLD": "1281"},
                     "LONG_PREFILL_TOKEN_THRESHOLD"),
    "mnbt_seqs": ({"MAX_NUM_SEQS": "8", "MAX_NUM_BATCHED_TOKENS": "8"},
                  {"MAX_NUM_SEQS": "8", "MAX_NUM_BATCHED_TOKENS": "7"}, "MAX_NUM_BATCHED_TOKENS"),
    "lab_dspark": ({"SPEC_METHOD": "none"}, {"SPEC_METHOD": "dspark", "SPEC_TOKENS": "3"}, "SPEC_METHOD"),
    "bench_fits": ({"BENCH_PREFILL_TOKENS": "4032"}, {"BENCH_PREFILL_TOKENS": "4033"}, "BENCH_PREFILL_TOKENS"),
    "rdma_needs_hca": ({"EXPECT_RDMA": "1", "HEAD_CX7_IB": "mlx5_0", "WORKER_CX7_IB": "mlx5_0"},
                       {"EXPECT_RDMA": "1", "HEAD_CX7_IB": "mlx5_0"}, "WORKER_CX7_IB"),
    "process_needs_bin": ({"VLLM_BIN": "vllm"}, {"VLLM_BIN": ""}, "VLLM_BIN"),
}


@pytest.mark.parametrize("rule", sorted(CROSS))
def test_cross_field_rule_both_ways(tmp_path, rule):
    ok, bad, at = CROSS[rule]
    load_profile(lab_with(tmp_path, **dict(ok)), environ=NO_ENV)
    path = lab_with(tmp_path, **dict(bad))
    found = issues(path)
    assert [i.key for i in found] == [at], [str(i) for i in found]
    expected_line = line_of(path, at) if at in path.read_text() else 0
    assert found[0].line == expected_line and found[0].fix


def _recipe_file(tmp_path, name, **changes):
    lines = (REPO / "env" / name).read_text().splitlines()
    out = [f"{l.split('=', 1)[0]}={changes.pop(l.split('=', 1)[0])}"
           if "=" in l and not l.startswith("#") and l.split("=", 1)[0] in changes else l for l in lines]
    out += [f"{k}={v}" for k, v in changes.items()]
    return write(tmp_path, "\n".join(out) + "\n", name)


@pytest.mark.parametrize("k,valid", [(6, True), (9, True), (5, False), (4, False), (3, False), (7, False)])
def test_dspark_v4_spec_tokens(tmp_path, k, valid):
    path = _recipe_file(tmp_path, "dspark-v4.env", SPEC_TOKENS=str(k))
    if valid:
        load_profile(path, environ=NO_ENV)
    else:
        (iss,) = issues(path)
        assert iss.key == "SPEC_TOKENS" and iss.line == line_of(path, "SPEC_TOKENS")
        assert "divisible by 3" in iss.message


def test_dspark_rule_only_for_dspark_v4(tmp_path):
    # exl3-v41 ships k=3, which the dspark-v4 rule would reject
    assert load_profile(_recipe_file(tmp_path, "exl3-v41.env", SPEC_TOKENS="3"), environ=NO_ENV).spec_tokens == 3
    # and with SPEC_METHOD=none the dspark-v4 rule does not apply
    load_profile(_recipe_file(tmp_path, "dspark-v4.env", SPEC_METHOD="none", SPEC_TOKENS="4"), environ=NO_ENV)


def test_accept_new_host_keys_only_in_lab(tmp_path):
    load_profile(REPO / "env" / "lab.env", environ=NO_ENV)  # lab ships 1
    path = _recipe_file(tmp_path, "exl3-v41.env", SSH_ACCEPT_NEW_HOST_KEYS="1")
    (iss,) = issues(path)
    assert iss.key == "SSH_ACCEPT_NEW_HOST_KEYS" and iss.line == line_of(path, "SSH_ACCEPT_NEW_HOST_KEYS")


def test_lab_flag_needs_lab_recipe(tmp_path):
    path = _recipe_file(tmp_path, "exl3-v41.env", LAB="1")
    assert [i.key for i in issues(path)] == ["LAB"]


def test_exl3_block_size_rule(tmp_path):
    load_profile(_recipe_file(tmp_path, "exl3-v41.env", KV_BLOCK_SIZE="32"), environ=NO_ENV)
    (iss,) = issues(_recipe_file(tmp_path, "exl3-v41.env", KV_BLOCK_SIZE="128"))
    assert iss.key == "KV_BLOCK_SIZE" and "128 dies on first decode" in iss.fix


def test_engram_only_v41_or_lab(tmp_path):
    (iss,) = issues(_recipe_file(tmp_path, "dspark-v4.env", ENGRAM="1", HF_ENGRAM_REPO="a/b",
                                 ENGRAM_SRC_DIR="/mnt/e", HF_ENGRAM_REVISION="d" * 40))
    assert iss.key == "ENGRAM"
    # the lab packs a synthetic V4.1-style source (03_engram); exl3-v41 ships ENGRAM=1
    assert load_profile(lab_with(tmp_path, ENGRAM="1", HF_ENGRAM_REPO="a/b", ENGRAM_SRC_DIR="/mnt/e"),
                        environ=NO_ENV).engram is True
    assert load_profile(REPO / "env" / "exl3-v41.env", environ=NO_ENV).engram is True


def test_conflict_skipped_when_a_key_is_already_invalid(tmp_path):
    # MAX_NUM_BATCHED_TOKENS invalid: report the type error only, not a VISION conflict on a default
    found = issues(lab_with(tmp_path, VISION="1", MAX_NUM_BATCHED_TOKENS="lots"))
    assert [i.key for i in found] == ["MAX_NUM_BATCHED_TOKENS"] and "integer" in found[0].message


# ----------------------------------------------------------------------------- overrides

def test_overrides_applied_and_recorded():
    p = load_profile(REPO / "env" / "lab.env", {"MAX_NUM_SEQS": "4", "VISION": "1"}, environ=NO_ENV)
    assert p.max_num_seqs == 4 and p.vision is True
    assert p.overrides == {"MAX_NUM_SEQS": "4", "VISION": "1"}
    assert p.key_lines["MAX_NUM_SEQS"] > 0  # still the file's line
    assert p.with_overrides({"MAX_NUM_SEQS": 2}).max_num_seqs == 2


def test_overrides_validated_like_the_file():
    found = issues(REPO / "env" / "lab.env", {"MAX_NUM_SEQS": "many", "MAX_MODEL_LENN": "1", "MASTER_PORT": "8000"})
    assert {(i.key, i.path, i.line) for i in found} == {
        ("MAX_NUM_SEQS", OVERRIDE, 0), ("MAX_MODEL_LENN", OVERRIDE, 0), ("MASTER_PORT", OVERRIDE, 0)}
    assert any("did you mean MAX_MODEL_LEN" in i.message for i in found)
    assert "<override>: MAX_NUM_SEQS: expected an integer, got 'many'" in str(ProfileError(found))


def test_override_conflict_reported_at_override(tmp_path):
    # VISION from the file, MNBT from an override: the override is "second"
    path = lab_with(tmp_path, VISION="1", MAX_NUM_BATCHED_TOKENS="2048")
    (iss,) = issues(path, {"MAX_NUM_BATCHED_TOKENS": "1000"})
    assert (iss.key, iss.path) == ("MAX_NUM_BATCHED_TOKENS", OVERRIDE)


# ----------------------------------------------------------------------------- derived values

@pytest.mark.parametrize("seqs,k,method,expect", [(6, 6, "dspark", 48), (2, 3, "dspark", 8), (6, 5, "dspark", 40),
                                                  (1, 3, "dspark", 8), (8, 0, "none", 8), (9, 7, "none", 16)])
def test_cudagraph_capture_size(tmp_path, seqs, k, method, expect):
    path = _recipe_file(tmp_path, "exl3-v41.env", MAX_NUM_SEQS=str(seqs), SPEC_TOKENS=str(k), SPEC_METHOD=method)
    assert load_profile(path, environ=NO_ENV).cudagraph_capture_size == expect


def test_round_up():
    assert [round_up(n, 8) for n in (1, 8, 9, 42)] == [8, 8, 16, 48]


def test_nodes_ordered(tmp_path):
    a = load_profile(REPO / "env" / "exl3-v41.env", environ=NO_ENV)
    assert a.nodes == [NodeSpec("head", 0, "spark1", "10.0.0.1", "enp1s0f1np1", ["rocep1s0f1"], 3),
                       NodeSpec("worker", 1, "spark2", "10.0.0.2", "enp1s0f0np0", ["rocep1s0f0"], 3)]
    three = load_profile(lab_with(tmp_path, WORKER2_SSH="spark-worker2", WORKER2_IP="169.254.77.3",
                                  WORKER2_CX7_IF="enp1s0f0np0", NNODES="3", TP="3"), environ=NO_ENV)
    assert [(n.name, n.rank, n.fabric_ip) for n in three.nodes] == [
        ("head", 0, "169.254.77.1"), ("worker", 1, "169.254.77.2"), ("worker2", 2, "169.254.77.3")]
    assert three.node_count == 3 and three.node("worker2").rank == 2


def test_resolve_path_relative_to_repo_root(tmp_path):
    p = load_profile(REPO / "env" / "lab.env", environ=NO_ENV)
    assert p.root == REPO
    assert p.resolve_path(p.ssh_config) == REPO / ".lab" / "ssh_config"
    assert p.resolve_path("/abs/x") == Path("/abs/x")
    q = load_profile(lab_with(tmp_path), environ=NO_ENV)
    assert q.resolve_path(".lab/id_ed25519") == tmp_path / ".lab" / "id_ed25519"


def test_redacted_has_every_key_and_masks_tokens():
    p = load_profile(REPO / "env" / "dspark-v4.env", environ=NO_ENV)
    red = p.redacted()
    assert list(red) == list(KEYS) and red["LIMIT_MM"] == {"image": 8} and red["BENCH_CONCURRENCY"] == [1, 2, 4, 6]
    tok = "hf_" + "Z9" * 15
    leaked = p.model_copy(update={"extra_args": f"--foo {tok}"})
    assert tok not in str(leaked.redacted()) and "***" in leaked.redacted()["EXTRA_ARGS"]


def test_model_forbids_extra_fields():
    with pytest.raises(Exception):
        Profile.model_validate({"recipe": "lab", "bogus": 1})


# ----------------------------------------------------------------------------- environment warnings

def test_unknown_runbook_env_warns():
    with pytest.warns(ProfileWarning, match="RUNBOOK_MAX_MODEL_LEN.*-p MAX_MODEL_LEN"):
        load_profile(REPO / "env" / "lab.env", environ={"RUNBOOK_MAX_MODEL_LEN": "1", "RUNBOOK_RUN_DIR": "x"})


def test_known_runbook_env_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_profile(REPO / "env" / "lab.env", environ={"RUNBOOK_RUN_DIR": "x", "OTHER": "1"})


def test_repo_relative_profile_path_works_from_another_directory(tmp_path, monkeypatch):
    # JupyterLab starts a notebook's kernel in notebooks/: "env/lab.env" must still resolve
    monkeypatch.chdir(tmp_path)
    profile = load_profile("env/lab.env")
    assert profile.source.is_file() and profile.source.name == "lab.env"


# ----------------------------------------------------------------------------- three nodes / TP3 keys

def test_bootstrap_keys_drive_host_ip_socket_if_and_master_addr(tmp_path):
    p = load_profile(lab_with(tmp_path, WORKER2_SSH="spark-worker2", WORKER2_IP="169.254.77.3",
                              WORKER2_CX7_IF="enp1s0f0np0", TP="3", NNODES="3",
                              BOOTSTRAP_IF="eth0", HEAD_BOOTSTRAP_IP="10.77.0.11",
                              WORKER_BOOTSTRAP_IP="10.77.0.12", WORKER2_BOOTSTRAP_IP="10.77.0.13"), environ=NO_ENV)
    assert p.master_addr == "10.77.0.11"
    assert [(n.host_ip, n.socket_if, n.fabric_ip) for n in p.nodes] == [
        ("10.77.0.11", "eth0", "169.254.77.1"), ("10.77.0.12", "eth0", "169.254.77.2"),
        ("10.77.0.13", "eth0", "169.254.77.3")]
    two = load_profile(REPO / "env" / "lab.env", environ=NO_ENV)
    assert [(n.host_ip, n.socket_if) for n in two.nodes] == [("169.254.77.1", "enp1s0f1np1"),
                                                             ("169.254.77.2", "enp1s0f0np0")]
    assert NodeSpec("x", 0, "h", "10.0.0.1", "eth1").host_ip == "10.0.0.1"


def test_bootstrap_if_lo_and_missing_addresses_are_reported_at_their_lines(tmp_path):
    path = lab_with(tmp_path, BOOTSTRAP_IF="lo", HEAD_BOOTSTRAP_IP="127.0.0.1")
    with pytest.raises(ProfileError) as ei:
        load_profile(path, environ=NO_ENV)
    got = {(i.key, i.line) for i in ei.value.issues}
    assert ("BOOTSTRAP_IF", line_of(path, "BOOTSTRAP_IF")) in got
    assert ("WORKER_BOOTSTRAP_IP", line_of(path, "WORKER_BOOTSTRAP_IP")) in got


def test_lab_cpu_bind_validated_per_rank(tmp_path):
    with pytest.raises(ProfileError) as ei:
        load_profile(lab_with(tmp_path, LAB_CPU_BIND="0,1,1"), environ=NO_ENV)
    assert [i.key for i in ei.value.issues] == ["LAB_CPU_BIND"] and "3 item(s) for 2 ranks" in ei.value.issues[0].message
    assert load_profile(lab_with(tmp_path, LAB_CPU_BIND="1,0"), environ=NO_ENV).cpu_bind(0, cpus=2) == "1"


def test_lab_nodes_is_a_retired_key_named_at_its_line(tmp_path):
    """The lab has as many nodes as the profile names; a copied profile that still sets LAB_NODES is told so."""
    path = tmp_path / "old.env"
    path.write_text((REPO / "env" / "lab.env").read_text().replace("LAB=1\n", "LAB=1\n# old\nLAB_NODES=2\n"))
    with pytest.raises(ProfileError) as ei:
        load_profile(path, environ=NO_ENV)
    (issue,) = ei.value.issues
    assert (issue.key, issue.line) == ("LAB_NODES", line_of(path, "LAB_NODES"))
    assert "retired key" in issue.message and "WORKER2_SSH" in issue.message and "delete line" in issue.fix


# ----------------------------------------------------------------------------- EXTRA_ARGS managed flags

@pytest.mark.parametrize("extra,key,fix_part", [
    ("--tensor-parallel-size 4", "TP", "set TP=4"),
    ("--tensor-parallel-size=4", "TP", "set TP=4"),
    ("-tp 4", "TP", "set TP=4"),
    ("--port 9000", "PORT", "set PORT=9000"),
    ("--max_model_len=2048", "MAX_MODEL_LEN", "set MAX_MODEL_LEN=2048"),
    ("--max-model 2048", "MAX_MODEL_LEN", "abbreviates --max-model-len"),
    ("-n2", "NNODES", "set NNODES=2"),
    ("--served-model-name 'my model'", "SERVED_MODEL_NAME", "set SERVED_MODEL_NAME=my model"),
    ("--speculative-config '{\"method\": \"dspark\"}'", "SPEC_METHOD", "SPEC_METHOD / SPEC_TOKENS"),
    ("--speculative-config.num_speculative_tokens 5", "SPEC_TOKENS", "SPEC_METHOD / SPEC_TOKENS"),
    ("--no-enforce-eager", "ENFORCE_EAGER", "set ENFORCE_EAGER=0"),
    ("--language-model-only", "VISION", "set VISION=0"),
    ("--device-memory-utilization 0.5", "GPU_MEM_UTIL", "set GPU_MEM_UTIL=0.5"),
])
def test_extra_args_managed_flag_names_the_key(tmp_path, extra, key, fix_part):
    path = lab_with(tmp_path, EXTRA_ARGS=extra)
    (iss,) = issues(path)
    assert iss.key == "EXTRA_ARGS" and iss.line == line_of(path, "EXTRA_ARGS")
    assert key in iss.message and fix_part in iss.message + iss.fix, str(iss)
    assert "remove" in iss.fix


@pytest.mark.parametrize("extra", ["--host 0.0.0.0", "--headless", "--node-rank 1", "--master-addr 10.0.0.9",
                                   "--pipeline-parallel-size 2", "--distributed-executor-backend ray",
                                   "--config /etc/vllm.yaml"])
def test_extra_args_topology_flags_rejected(tmp_path, extra):
    (iss,) = issues(lab_with(tmp_path, EXTRA_ARGS=extra))
    assert iss.key == "EXTRA_ARGS" and extra.split()[0] in iss.message and iss.fix.startswith("remove")


@pytest.mark.parametrize("extra", ["--api-key s3cretvalue", "--api-key=s3cretvalue", "--hf-token s3cretvalue"])
def test_extra_args_secret_flags_never_echo_the_value(tmp_path, extra):
    (iss,) = issues(lab_with(tmp_path, EXTRA_ARGS=extra))
    assert iss.key == "EXTRA_ARGS" and "secrets never live in a profile" in iss.message
    assert "s3cretvalue" not in str(ProfileError([iss]))


@pytest.mark.parametrize("extra", ["", "--cudagraph-capture-sizes 1 2 4", "--max-cudagraph-capture-size 16",
                                   "--tokenizer /models/tok", "--seed 7", "--override-generation-config '{\"x\": -1}'",
                                   "--swap-space 4", "-O3", "--enable-prefix-caching"])
def test_extra_args_unmanaged_flags_accepted(tmp_path, extra):
    assert load_profile(lab_with(tmp_path, EXTRA_ARGS=extra), environ=NO_ENV).extra_args == extra


def test_recipe_only_flags(tmp_path):
    # dspark-v4 renders --reasoning-config from REASONING_PARSER; the lab does not render it
    load_profile(lab_with(tmp_path, EXTRA_ARGS="--reasoning-config '{}'"), environ=NO_ENV)
    path = _recipe_file(tmp_path, "dspark-v4.env", EXTRA_ARGS="--reasoning-config '{}'")
    (iss,) = issues(path)
    assert iss.key == "EXTRA_ARGS" and "REASONING_PARSER" in iss.message
    # exl3-v41 with ENGRAM=1 passes engram_table_dir in --hf-overrides
    (iss,) = issues(_recipe_file(tmp_path, "exl3-v41.env", EXTRA_ARGS="--hf-overrides '{}'"))
    assert iss.key == "EXTRA_ARGS" and "ENGRAM" in iss.message
    load_profile(_recipe_file(tmp_path, "exl3-v41.env", EXTRA_ARGS="--hf-overrides '{}'", ENGRAM="0"),
                 environ=NO_ENV)


# ----------------------------------------------------------------------------- pinned revisions

@pytest.mark.parametrize("rev,expect", [("main", "branch or tag"), ("v1.0", "branch or tag"),
                                        ("64ba41b", "abbreviated commit id (7 of 40"),
                                        ("64BA41B6C916A587DB06EAE2E19B7845F7BE6E6B", "upper case")])
def test_moving_revision_rejected_on_real_recipes(tmp_path, rev, expect):
    path = _recipe_file(tmp_path, "exl3-v41.env", HF_REVISION=rev)
    (iss,) = issues(path)
    assert iss.key == "HF_REVISION" and iss.line == line_of(path, "HF_REVISION") and expect in iss.message
    assert "40" in iss.fix or "lower case" in iss.fix
    if expect != "upper case":
        assert "model_info('Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw', revision=" in iss.fix
        assert "Files and versions" in iss.fix


def test_engram_revision_pinned_only_when_engram_is_on(tmp_path):
    (iss,) = issues(_recipe_file(tmp_path, "exl3-v41.env", HF_ENGRAM_REVISION="main"))
    assert iss.key == "HF_ENGRAM_REVISION" and "deepseek-ai/DeepSeek-V4.1-Flash" in iss.fix
    load_profile(_recipe_file(tmp_path, "exl3-v41.env", HF_ENGRAM_REVISION="main", ENGRAM="0"), environ=NO_ENV)


def test_lab_may_use_a_branch():
    lab = load_profile(REPO / "env" / "lab.env", environ=NO_ENV)
    assert lab.engram and lab.hf_engram_revision == "main"


# ----------------------------------------------------------------------------- KV cache dtype

@pytest.mark.parametrize("dtype", ["", "auto", "fp8", "fp8_e5m2", "bfloat16", "nvfp4"])
def test_kv_cache_dtype_accepted(tmp_path, dtype):
    assert load_profile(lab_with(tmp_path, KV_CACHE_DTYPE=dtype), environ=NO_ENV).kv_cache_dtype == dtype


def test_kv_cache_dtype_ds_mla_needs_a_deepseek_recipe(tmp_path):
    (iss,) = issues(lab_with(tmp_path, KV_CACHE_DTYPE="nvfp4_ds_mla"))
    assert iss.key == "KV_CACHE_DTYPE" and "MLA" in iss.message
    assert load_profile(_recipe_file(tmp_path, "exl3-v41.env", KV_CACHE_DTYPE="fp8_ds_mla"),
                        environ=NO_ENV).kv_cache_dtype == "fp8_ds_mla"


@pytest.mark.parametrize("dtype,hint", [("fp4", ""), ("nvfp4_ds_mIa", "did you mean nvfp4_ds_mla"),
                                        ("FP8", "did you mean fp8"), ("int8", "")])
def test_kv_cache_dtype_unknown(tmp_path, dtype, hint):
    (iss,) = issues(lab_with(tmp_path, KV_CACHE_DTYPE=dtype))
    assert iss.key == "KV_CACHE_DTYPE" and "expected one of" in iss.message and hint in iss.fix


# ----------------------------------------------------------------------------- the file itself

def test_crlf_named_at_first_key_line(tmp_path):
    src = (REPO / "env" / "lab.env").read_text()
    path = write(tmp_path, src.replace("\n", "\r\n"))
    (iss,) = issues(path)
    first_key = next(i for i, ln in enumerate(src.splitlines(), 1) if ln and not ln.startswith("#"))
    assert (iss.key, iss.line) == ("PROFILE_NAME", first_key) and "CR LF" in iss.message and "sed -i" in iss.fix


def test_bom_and_invisible_characters(tmp_path):
    src = (REPO / "env" / "lab.env").read_text()
    (iss,) = issues(write(tmp_path, "\ufeff" + src))
    assert (iss.key, iss.line) == ("<file>", 1) and "byte-order mark" in iss.message
    path = write(tmp_path, src.replace("PORT=8000", "PORT=80\u200b00"))
    (iss,) = issues(path)
    assert (iss.key, iss.line) == ("PORT", line_of(path, "PORT")) and "U+200B" in iss.message


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.env"
    path.write_bytes((REPO / "env" / "lab.env").read_bytes().replace(b"PROFILE_NAME=lab", b"PROFILE_NAME=l\xe4b"))
    (iss,) = issues(path)
    assert iss.key == "PROFILE_NAME" and "0xe4 is not UTF-8" in iss.message and "iconv" in iss.fix


def test_secrets_file_still_tolerates_crlf(tmp_path):
    entries, probs = parse_env_text("HF_TOKEN=abc\r\nVLLM_API_KEY=def\r\n", "secrets.env")
    assert probs == [] and [(e.key, e.value) for e in entries] == [("HF_TOKEN", "abc"), ("VLLM_API_KEY", "def")]


def test_syntax_error_names_a_known_key():
    _, probs = parse_env_text("PORT: 8000\nHF_TOKEN hf_" + "x" * 30 + "\n", "f.env")
    assert [(p.key, p.line) for p in probs] == [("PORT", 1), ("HF_TOKEN", 2)]
    assert "write PORT=VALUE" in probs[0].fix and "hf_x" not in str(probs[1])


@pytest.mark.parametrize("key,value,expect", [
    ("HEAD_IP", "127.0.0.1", "loopback"), ("WORKER_IP", "0.0.0.0", "unspecified"),
    ("HEAD_IP", "239.1.1.1", "multicast"), ("IMAGE", "ubuntu; rm -rf /", "docker image reference"),
    ("IMAGE", "Owner/Image:1", "docker image reference"), ("MODEL_DIR", "./models/tiny", "absolute path"),
    ("MODEL_DIR", "tiny", "repo id"),
    ("VLLM_BIN", "python 'x.py", "cannot split"), ("BENCH_CONCURRENCY", "", "empty"),
    ("MAX_MODEL_LEN", "9" * 5000, "out of range"),
])
def test_more_type_errors(tmp_path, key, value, expect):
    path = lab_with(tmp_path, **{key: value})
    (iss,) = issues(path)
    assert iss.key == key and expect in iss.message and iss.fix and iss.line == line_of(path, key)


def test_rdma_thresholds_and_http_endpoint(tmp_path):
    (iss,) = issues(_recipe_file(tmp_path, "exl3-v41.env", MIN_RDMA_GBPS_TOTAL="80"))
    assert iss.key == "MIN_RDMA_GBPS_TOTAL"
    (iss,) = issues(_recipe_file(tmp_path, "exl3-v41.env", DEGRADED_GBPS="95"))
    assert iss.key == "DEGRADED_GBPS"
    (iss,) = issues(_recipe_file(tmp_path, "exl3-v41.env", HF_ENDPOINT="http://mirror.example:8080"))
    assert iss.key == "HF_ENDPOINT" and "clear text" in iss.message
    assert load_profile(REPO / "env" / "lab.env", environ=NO_ENV).hf_endpoint.startswith("http://")
