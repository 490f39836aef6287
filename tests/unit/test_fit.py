"""Fit planner: golden figures of both recipes, DOES NOT FIT cases naming the knob, disk per filesystem,
real facts of this host, the preflight sidecar, and the plan command."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from runbook.checks import Status
from runbook.errors import RunbookError
from runbook.facts import system
from runbook.fit import budget, cli, facts as ff, figures, fit_checks, plan, plan_text
from runbook.fit.figures import GIB, PUBLISHED_CHECKS
from runbook.preflight.verify import preflight_record
from runbook.profile import load_profile
from runbook.records import PreflightRecord, RecordError, record_to_sidecar

A, B, LAB = "env/exl3-v41.env", "env/dspark-v4.env", "env/lab.env"


def nominal_plan(path, **overrides):
    profile = load_profile(path, overrides={k: str(v) for k, v in overrides.items()})
    return profile, plan(profile, ff.nominal_facts(profile), origin="nominal")


def rows(p, name):
    found = [r for r in p.rows if r.name == name]
    assert found, f"no row {name!r} in {[r.name for r in p.rows]}"
    return found


# ------------------------------------------------------------------------------------------------
# golden: the seeds' published budgets
# ------------------------------------------------------------------------------------------------
def test_recipe_a_reproduces_seed_a_budget():
    profile, p = nominal_plan(A)
    assert p.verdict == budget.FITS, plan_text(p)
    assert p.weights.per_rank.gib == pytest.approx(99.5)            # weight_budget.py --tp 2
    for boot in rows(p, "boot: MemAvailable at launch"):
        # seed A's gate: 99.5 GiB weights + 12 GiB margin must be free, and is on a GB10
        assert boot.need / GIB == pytest.approx(99.5 + 12)
        assert boot.headroom > 0
        # what the boot allocates (weights + pinned pool + runtime) against the operator's measurement
        alloc = sum(f.value for _, f in boot.terms) / GIB
        lo = min(PUBLISHED_CHECKS["exl3-v41 boot consumption GiB"])
        hi = max(PUBLISHED_CHECKS["exl3-v41 boot consumption GiB"])
        assert lo <= alloc <= hi
    for steady in rows(p, "steady state: MemTotal"):
        # predicted MemAvailable after warm-up: never above what the head showed, and within 1 GiB of it
        lo, hi = PUBLISHED_CHECKS["exl3-v41 MemAvailable after warm-up GiB"]
        assert 0 < steady.headroom / GIB <= hi
        assert lo - steady.headroom / GIB < 1.0
    for kv in rows(p, "KV pool holds MAX_MODEL_LEN"):
        assert kv.status is Status.PASS and kv.have == 774_400 and kv.need == 600_000
    head_items = [i for i in p.items if i.node == "head"]
    assert head_items
    download = sum(i.size.gib for i in head_items if i.label in ("weights", "Engram source"))
    assert download == pytest.approx(PUBLISHED_CHECKS["exl3-v41 download GiB"], rel=0.01)
    packed = [i for i in p.items if i.label == "packed Engram"]
    assert [i.node for i in packed] == ["head", "worker"]
    assert all(i.size.gib == pytest.approx(94.4) for i in packed)        # 2 layers x 47.2 GiB per rank
    # with WEIGHT_SYNC=nfs the worker holds no weights and no Engram source
    assert not [i for i in p.items if i.node == "worker" and i.label in ("weights", "Engram source")]


def test_recipe_b_reproduces_seed_b_kv_pool():
    profile, p = nominal_plan(B)
    assert p.verdict == budget.FITS, plan_text(p)
    kv_rows = rows(p, "KV pool holds MAX_MODEL_LEN")
    for kv in kv_rows:
        pool = next(f for label, f in kv.terms if label == "KV pool")
        assert pool.gib == pytest.approx(17.04, abs=0.05)                  # 'Available KV cache memory'
        assert kv.have == pytest.approx(2_331_430, rel=0.005)              # 'GPU KV cache size'
        assert round(kv.have / profile.max_model_len, 2) == PUBLISHED_CHECKS["dspark-v4 concurrency at 1M"]
    # the older 0731 boot (same KV layout) gives the same bytes per token within 1 %
    pool_0731, tokens_0731 = PUBLISHED_CHECKS["dspark-v4 0731 boot"]
    assert budget.kv_bytes_per_token(profile).value == pytest.approx(pool_0731 / tokens_0731, rel=0.01)
    # seed B's shipped margin (12 GiB) is below what the boot allocates: the planner's boot need is stricter
    boot = rows(p, "boot: MemAvailable at launch")[0]
    assert boot.need > (profile.weight_budget_gib + profile.boot_margin_gib) * GIB


# ------------------------------------------------------------------------------------------------
# DOES NOT FIT names the knob, and the suggested value fits
# ------------------------------------------------------------------------------------------------
def test_gpu_mem_util_too_high_names_the_knob_and_its_value_fits():
    profile, p = nominal_plan(B, GPU_MEM_UTIL=0.97)
    assert p.verdict == budget.DOES_NOT_FIT
    assert "GPU_MEM_UTIL" in p.knobs()
    failed = [r for r in p.failures() if r.knob == "GPU_MEM_UTIL"]
    assert failed and all("GPU_MEM_UTIL to <=" in r.fix for r in failed)
    # the lowest suggestion is a value that fits
    suggested = min(float(r.fix.split("GPU_MEM_UTIL to <= ")[1].split()[0].rstrip(",")) for r in failed)
    _, again = nominal_plan(B, GPU_MEM_UTIL=suggested)
    assert again.verdict == budget.FITS, plan_text(again)


def test_max_model_len_beyond_the_pinned_pool_names_max_model_len():
    profile, p = nominal_plan(A, MAX_MODEL_LEN=1048576)
    kv = rows(p, "KV pool holds MAX_MODEL_LEN")
    assert kv and all(r.status is Status.FAIL and r.knob == "MAX_MODEL_LEN" for r in kv)
    assert "lower MAX_MODEL_LEN to <= 774,400" in kv[0].fix
    _, again = nominal_plan(A, MAX_MODEL_LEN=774400)
    assert again.verdict == budget.FITS


def test_pinned_pool_too_big_names_kv_cache_memory_bytes():
    profile, p = nominal_plan(A, KV_CACHE_MEMORY_BYTES=12 * GIB)
    steady = rows(p, "steady state: MemTotal")
    assert steady and all(r.status is Status.FAIL and r.knob == "KV_CACHE_MEMORY_BYTES" for r in steady)
    value = int(steady[0].fix.split("KV_CACHE_MEMORY_BYTES to <= ")[1].split()[0])
    _, again = nominal_plan(A, KV_CACHE_MEMORY_BYTES=value)
    steady = rows(again, "steady state: MemTotal")
    assert steady and all(r.status is Status.PASS for r in steady)


def test_weights_too_big_for_tp_names_tp():
    # the native V4.1 checkpoint (~475 GiB) split over two Sparks
    profile, p = nominal_plan(A, WEIGHTS_GIB=475.3, WEIGHT_BUDGET_GIB=0, KV_CACHE_MEMORY_BYTES=0)
    assert p.weights.per_rank.gib == pytest.approx(475.3 / 2)
    assert p.verdict == budget.DOES_NOT_FIT
    boot = rows(p, "boot: MemAvailable at launch")
    assert boot and all(r.knob == "TP" and "WORKER2_SSH" in r.fix for r in boot)


def test_weight_budget_below_the_even_split_names_weight_budget_gib():
    profile, p = nominal_plan(A, WEIGHT_BUDGET_GIB=90)
    row = rows(p, "weights per rank")[0]
    assert row.status is Status.FAIL and row.knob == "WEIGHT_BUDGET_GIB"
    assert p.weights.per_rank.gib == pytest.approx(196.2 / 2)     # the plan goes on with the even split


# ------------------------------------------------------------------------------------------------
# disk per filesystem
# ------------------------------------------------------------------------------------------------
def _fs(path, mount, device, avail_gib, inodes=10_000_000):
    df = system.parse_disk_free(f"{path}\n{int(avail_gib * GIB)} {int(2000 * GIB)} {mount}\n")
    ino = system.parse_disk_inodes(f"{path}\n{inodes} {inodes * 2} {mount}\n{device}\n")
    return {"df": df, "inodes": ino, "used": 0}


def _gathered(profile, placement, host=None):
    """placement: node -> {label: (mount, device, avail GiB)}; every other path on a roomy disk."""
    out = {}
    for n in profile.nodes:
        paths = {}
        for label, path in ff.probe_paths(profile, n.name).items():
            mount, device, avail = placement.get(n.name, {}).get(label, ("/", "64769", 3000))
            paths[path] = _fs(path, mount, device, avail)
        out[n.name] = {"mem": {"MemTotal": int(121.6 * GIB), "MemAvailable": int(115 * GIB)},
                       "docker": "28.1", "image": None, "fit": {"boot_id": host or n.name, "paths": paths}}
    return out


def test_two_paths_on_one_filesystem_are_summed():
    profile = load_profile(A)
    same = {"head": {"weights": ("/mnt/nvme", "66306", 300), "engram_src": ("/mnt/nvme", "66306", 300)}}
    p = plan(profile, ff.node_facts_from_gather(profile, _gathered(profile, same)))
    row = next(r for r in p.rows if r.section == "disk" and r.node == "head" and "/mnt/nvme" in r.name)
    sizes = {i.label: i.need for i in p.items if i.node == "head" and i.label in ("weights", "Engram source")}
    assert sizes and all(size < 300 * GIB for size in sizes.values())      # each alone would fit
    assert row.status is Status.FAIL and row.need == pytest.approx(sum(sizes.values()))
    assert row.knob in ("WEIGHTS_DIR", "ENGRAM_SRC_DIR") and "another filesystem" in row.fix
    assert p.verdict == budget.DOES_NOT_FIT
    # the same free space on two filesystems: both fit
    apart = {"head": {"weights": ("/mnt/nvme", "66306", 300), "engram_src": ("/data", "66307", 300)}}
    p2 = plan(profile, ff.node_facts_from_gather(profile, _gathered(profile, apart)))
    disk = [r for r in p2.rows if r.section == "disk" and r.node == "head"]
    assert len(disk) >= 2 and all(r.status is Status.PASS for r in disk)


def test_same_device_under_two_mounts_is_one_filesystem():
    # a bind mount shows another mount point but the same device: still one disk
    profile = load_profile(A)
    bind = {"head": {"weights": ("/mnt/nvme", "66306", 300), "engram_src": ("/srv/engram", "66306", 300)}}
    p = plan(profile, ff.node_facts_from_gather(profile, _gathered(profile, bind)))
    assert [r for r in p.failures() if r.section == "disk" and "weights" in r.name and "Engram source" in r.name]


def test_worker_copy_suggests_nfs_first():
    profile = load_profile(A, overrides={"WEIGHT_SYNC": "rsync"})
    small = {"worker": {"weights": ("/", "64769", 250), "engram_src": ("/", "64769", 250),
                        "engram_packed": ("/", "64769", 250), "image": ("/", "64769", 250),
                        "cache": ("/", "64769", 250)}}
    p = plan(profile, ff.node_facts_from_gather(profile, _gathered(profile, small)))
    failed = [r for r in p.failures() if r.section == "disk" and r.node == "worker"]
    assert failed and failed[0].knob == "WEIGHT_SYNC"


def test_lab_nodes_on_one_host_share_memory_and_disk():
    profile = load_profile(LAB)
    p = plan(profile, ff.node_facts_from_gather(profile, _gathered(profile, {}, host="one-kernel")))
    boot = rows(p, "boot: MemAvailable at launch")
    assert [r.node for r in boot] == ["head+worker"]
    disk = [r for r in p.rows if r.section == "disk"]
    assert [r.node for r in disk] == ["head+worker"]
    assert rows(p, "vLLM startup check")[0].status is Status.NA      # CPU vLLM: no such check


def test_inodes_are_counted_per_filesystem():
    profile = load_profile(A)
    facts = ff.node_facts_from_gather(profile, _gathered(profile, {}))
    for f in facts.values():
        for fs in f.paths.values():
            fs.avail_inodes = figures.Figure(1000, figures.MEASURED)
    p = plan(profile, facts)
    ino = [r for r in p.rows if r.section == "inodes"]
    assert ino and all(r.status is Status.FAIL and r.knob for r in ino)


def test_btrfs_without_inode_limit_is_not_applicable():
    assert system.parse_disk_inodes("/data\n- - /data\n44\n").total_inodes == 0
    profile = load_profile(A)
    gathered = _gathered(profile, {})
    for f in gathered.values():
        for entry in f["fit"]["paths"].values():
            entry["inodes"] = system.parse_disk_inodes("/data\n- - /data\n44\n")
    p = plan(profile, ff.node_facts_from_gather(profile, gathered))
    ino = [r for r in p.rows if r.section == "inodes"]
    assert ino and all(r.status is Status.NA for r in ino)


# ------------------------------------------------------------------------------------------------
# real facts of this host
# ------------------------------------------------------------------------------------------------
def test_gather_node_reads_this_host_for_real(tmp_path):
    weights, src = tmp_path / "w", tmp_path / "src"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"\0" * 300_000)
    profile = load_profile(LAB, overrides={"WEIGHTS_DIR": str(weights), "ENGRAM_SRC_DIR": str(src),
                                           "ENGRAM_PACKED_DIR": str(tmp_path / "packed"),
                                           "CACHE_DIR": str(tmp_path / "cache")})
    got = ff.gather_node(ff.LocalHost("head"), profile)
    assert got["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    entries = got["paths"]
    assert set(entries) == {str(weights), str(src), str(tmp_path / "packed"), str(tmp_path / "cache")}
    dev = str(os.stat(tmp_path).st_dev)
    for entry in entries.values():
        assert isinstance(entry["df"], system.DiskFree) and entry["inodes"].device == dev
    assert entries[str(weights)]["used"] >= 300_000
    assert entries[str(src)]["used"] == 0 and entries[str(src)]["df"].existing_path == str(tmp_path)
    # the plan puts all four on one filesystem and subtracts what is already there
    facts = ff.local_facts(profile)
    p = plan(profile, facts)
    disk = [r for r in p.rows if r.section == "disk"]
    assert len(disk) == 1 and disk[0].node == "head+worker"
    assert facts["head"].mem_available.source == figures.MEASURED
    size = ff.parse_checkpoint_size(ff.LocalHost().read(ff.checkpoint_size_cmd(str(weights))).stdout)
    assert size == 300_000


def test_checkpoint_size_from_an_index(tmp_path):
    index = {"metadata": {"total_size": 210664148992}, "weight_map": {"a": "model-00001-of-00039.safetensors"}}
    (tmp_path / ff.INDEX_NAME).write_text(json.dumps(index))
    out = ff.LocalHost().read(ff.checkpoint_size_cmd(str(tmp_path))).stdout
    assert ff.parse_checkpoint_size(out) == 210664148992
    ckpt = cli.local_checkpoint(str(tmp_path / ff.INDEX_NAME))
    profile = load_profile(A, overrides={"WEIGHT_BUDGET_GIB": "0"})
    p = plan(profile, ff.nominal_facts(profile), checkpoint=ckpt)
    assert p.weights.per_rank.value == 210664148992 / 2 and p.weights.per_rank.source == figures.DERIVED
    assert ff.parse_checkpoint_size("") is None and ff.parse_checkpoint_size("files\n") is None


def test_bad_index_names_the_file_and_the_fix(tmp_path):
    bad = tmp_path / ff.INDEX_NAME
    bad.write_text('{"weight_map": {}}')
    with pytest.raises(RunbookError) as err:
        cli.local_checkpoint(str(bad))
    assert str(bad) in str(err.value) and "metadata.total_size" in str(err.value) and err.value.fix
    with pytest.raises(RunbookError):
        cli.local_checkpoint(str(tmp_path / "missing"))


def test_parse_used_bytes():
    assert ff.parse_used_bytes("4096\n") == 4096
    with pytest.raises(ValueError):
        ff.parse_used_bytes("du: cannot access\n")


# ------------------------------------------------------------------------------------------------
# preflight integration and the sidecar
# ------------------------------------------------------------------------------------------------
def test_fit_checks_for_preflight():
    profile = load_profile(A, overrides={"GPU_MEM_UTIL": "0.99"})
    checks = fit_checks(profile, _gathered(profile, {}))
    assert checks and all(c.name.startswith("fit: ") for c in checks)
    failed = [c for c in checks if c.status is Status.FAIL]
    assert failed and all(c.fix and c.data["knob"] for c in failed)
    assert {c.data["sources"]["have"] for c in failed} == {"measured"}


def _preflight_sidecar(capacity=None):
    """What runbook.preflight writes: its record (records.PreflightRecord) beside the data, here without a fit plan
    (a server of the runbook's held the memory): MemAvailable and each probed path's free bytes per node."""
    nodes = {n: {"hostname": n, "mem_available": int(113.2 * GIB), "docker": "28.1", "image_id": None,
                 "disk_free": {"weights": {"mount": "/mnt/nvme", "free_bytes": int(812.4 * GIB)}}}
             for n in ("head", "worker")}
    data = {"nodes": nodes, **({"fit": {"facts": capacity}} if capacity else {})}
    rec = preflight_record(data)
    return {"step": "00_preflight", "status": "passed", "checks": [], "data": data,
            "record": record_to_sidecar("00_preflight", rec)}


def test_a_record_without_a_plan_gives_measured_memory_and_free_bytes():
    profile = load_profile(A)
    facts = ff.node_facts_from_sidecar(profile, _preflight_sidecar(), "x.json")
    assert facts["head"].mem_available.source == figures.MEASURED
    assert facts["head"].mem_available.gib == pytest.approx(113.2)
    assert facts["head"].mem_total.source == figures.NOMINAL
    weights_path = ff.probe_paths(profile, "head")["weights"]
    assert facts["head"].paths[weights_path].mount == "/mnt/nvme"
    p = plan(profile, facts)
    disk = [r for r in p.rows if r.section == "disk" and "/mnt/nvme" in r.name]
    assert disk and disk[0].have_figure.source == figures.MEASURED
    # paths preflight did not probe are shown as not placed, never as fitting
    na = [r for r in p.rows if r.section == "disk" and r.status is Status.NA]
    assert na


def test_a_record_round_trips_the_plan_facts():
    profile = load_profile(A)
    first = plan(profile, ff.node_facts_from_gather(profile, _gathered(profile, {})))
    side = _preflight_sidecar(capacity=first.to_dict()["facts"])
    again = plan(profile, ff.node_facts_from_sidecar(profile, side, "x.json"))
    assert [r.to_dict() for r in again.rows] == [r.to_dict() for r in first.rows]


def test_a_record_without_nodes_is_refused():
    profile = load_profile(A)
    side = {"step": "00_preflight", "status": "passed", "data": {},
            "record": record_to_sidecar("00_preflight", PreflightRecord(nodes={}))}
    with pytest.raises(RunbookError) as err:
        ff.node_facts_from_sidecar(profile, side, "x.json")
    assert "00_preflight" in err.value.fix


def test_a_sidecar_without_its_record_is_refused_naming_preflight():
    """A preflight sidecar of a runbook before records (data.nodes and the `disk free at` rows only) is not read
    by its row names any more: re-run 00_preflight."""
    profile = load_profile(A)
    old = {k: v for k, v in _preflight_sidecar().items() if k != "record"}
    with pytest.raises(RecordError, match="00_preflight's sidecar holds no PreflightRecord") as err:
        ff.node_facts_from_sidecar(profile, old, "x.json")
    assert "re-run 00_preflight" in err.value.fix


def _run(root, run_id, profile_name, created):
    run = root / run_id
    (run / "steps").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"profile": profile_name, "created": created}))
    (run / "steps" / "00_preflight.json").write_text(json.dumps(_preflight_sidecar()))
    return run


def test_facts_latest_picks_the_newest_run_of_the_profile(tmp_path):
    profile = load_profile(A)
    _run(tmp_path, "20261201-010000-exl3-v41", "exl3-v41", "2026-12-01T01:00:00")
    newest = _run(tmp_path, "20261201-020000-exl3-v41", "exl3-v41", "2026-12-01T02:00:00")
    _run(tmp_path, "20261201-030000-lab", "lab", "2026-12-01T03:00:00")
    assert ff.find_preflight(profile, "latest", tmp_path) == newest / "steps" / "00_preflight.json"
    assert ff.find_preflight(profile, str(newest), tmp_path) == newest / "steps" / "00_preflight.json"
    with pytest.raises(RunbookError) as err:
        ff.find_preflight(load_profile(B), "latest", tmp_path)
    assert "dspark-v4" in str(err.value) and err.value.fix


# ------------------------------------------------------------------------------------------------
# the plan command
# ------------------------------------------------------------------------------------------------
def _plan_cmd(*argv):
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


@pytest.mark.parametrize("profile", [A, B])
def test_plan_command_prints_the_verdict(profile, capsys):
    assert _plan_cmd("--profile", profile) == 0
    out = capsys.readouterr().out
    assert out.startswith("fit plan: ") and " -- FITS" in out.splitlines()[0]
    assert "[nominal]" in out and "[published]" in out and "[profile]" in out


def test_plan_command_does_not_fit_exit_and_knob(capsys):
    assert _plan_cmd("--profile", A, "-p", "GPU_MEM_UTIL=0.97") == 5
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out and "GPU_MEM_UTIL" in captured.err


def test_plan_command_json_and_cached_facts(tmp_path, capsys):
    run = _run(tmp_path, "20261201-010000-exl3-v41", "exl3-v41", "2026-12-01T01:00:00")
    assert _plan_cmd("--profile", A, "--facts", "latest", "--results", str(tmp_path), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "FITS" and str(run) in doc["origin"]
    assert doc["rows"] and doc["facts"]["head"]["mem_available"]["source"] == "measured"
    with pytest.raises(RunbookError):
        _plan_cmd("--profile", A, "--facts", str(tmp_path / "nope.json"))
    with pytest.raises(RunbookError):
        _plan_cmd("--profile", A, "-p", "GPU_MEM_UTIL")


def test_a_node_without_facts_makes_the_verdict_unknown_never_fits():
    profile = load_profile(A)
    gathered = _gathered(profile, {})
    gathered["worker"] = RuntimeError("ssh: connection refused")      # what Cluster.each returns for a dead node
    p = plan(profile, ff.node_facts_from_gather(profile, gathered))
    assert p.verdict == budget.UNKNOWN and p.missing == ["worker"]
    assert [r.node for r in p.rows if r.name == "node facts"] == ["worker"]
    assert not [r for r in p.rows if r.node == "worker" and r.name != "node facts"]


class _Recorder(ff.LocalHost):
    """This host, recording the commands gather_node sends."""
    def __init__(self, name):
        super().__init__(name)
        self.commands = []

    def read(self, command, *, timeout=ff.READ_TIMEOUT):
        self.commands.append(command)
        return super().read(command, timeout=timeout)


def test_gather_node_never_sizes_docker_data_root_with_du():
    profile = load_profile(A)
    node = _Recorder("head")
    got = ff.gather_node(node, profile)
    assert node.commands
    root = got["paths"][figures.DOCKER_ROOT]
    assert "used" not in root and isinstance(root["df"], system.DiskFree)
    assert not [c for c in node.commands if "du -sb" in c and figures.DOCKER_ROOT in c]
    # every other path was sized
    others = [e for p_, e in got["paths"].items() if p_ != figures.DOCKER_ROOT]
    assert others and all("used" in e for e in others)
