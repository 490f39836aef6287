"""Run folders in the real formats, for the report, drift and verdict tests.

Shapes are copied from archived lab runs: 00/01/02/03 sidecars, iperf3 ``-J`` client JSON, ping text,
ib_write_bw text, Engram tool JSON written by the library's own ``record()``, the launch plan's
``rendered.json``, and a real benchmark output produced against the reference server
(:func:`bench_output`).

    run = build_run(results, "20261201-040000-lab", bench=bench_output(tmp))
    run = build_full_run(results, "20261201-040000-exl3", p := recipe_profile(), bench=seed_bench_output(tmp, p))
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.result import BenchConfig, BenchResult
from runbook.benchmark.runner import run_benchmark
from runbook.bench.config import config_from_profile
from runbook.engram.read_probe import probe_checks
from runbook.engram import record
from runbook.evidence import RunDir
from runbook.profile import Profile, load_profile

__all__ = ["HF", "API", "PROFILE", "chk", "iperf_json", "ping_text", "ib_bw_text", "write", "build_run",
           "bench_output", "RawRecorder", "edit_sidecar", "add_sidecar", "recipe_profile", "seed_bench_output",
           "build_full_run", "edit_bench_config", "REPO", "RECIPE_PIN", "SMOKE_CHECKS", "QUALITY_CHECKS", "TOOL_CHECKS"]

REPO = Path(__file__).resolve().parents[2]

HF = "hf_" + "Q" * 30
API = "sk-live-planted-api-key-0123456789"


# ------------------------------------------------------------------------------------------------
# builders (real file formats)
# ------------------------------------------------------------------------------------------------

def chk(name, node="head", status="PASS", observed="", expected="", evidence=(), data=None, fix=""):
    return {"name": name, "node": node, "status": status, "observed": observed, "expected": expected, "fix": fix,
            "evidence": list(evidence), "data": dict(data or {})}


def iperf_json(recv_bps: float, sent_bps: float) -> str:
    return json.dumps({"start": {"connected": [{"socket": 5, "local_host": "10.0.0.1", "local_port": 40407,
                                                "remote_host": "10.0.0.2", "remote_port": 5302}],
                                 "version": "iperf 3.12", "test_start": {"protocol": "TCP", "num_streams": 1,
                                                                         "reverse": 0}},
                       "intervals": [],
                       "end": {"sum_sent": {"start": 0, "end": 3.0, "seconds": 3.0, "bytes": 1, "bits_per_second": sent_bps,
                                            "retransmits": 0, "sender": True},
                               "sum_received": {"start": 0, "end": 3.0, "seconds": 3.0, "bytes": 1,
                                                "bits_per_second": recv_bps, "sender": True}}}, indent=1)


def ping_text(avg: float) -> str:
    return ("PING 10.0.0.2 (10.0.0.2) from 10.0.0.1 enp1s0f0np0: 8972(9000) bytes of data.\n"
            "8980 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.151 ms\n\n"
            "--- 10.0.0.2 ping statistics ---\n5 packets transmitted, 5 received, 0% packet loss, time 815ms\n"
            f"rtt min/avg/max/mdev = 0.064/{avg}/0.151/0.031 ms\n")


def ib_bw_text(avg: float) -> str:
    return ("---------------------------------------------------------------------------------------\n"
            "                    RDMA_Write BW Test\n Dual-port       : OFF\t\tDevice         : rocep1s0f0\n"
            " Mtu             : 4096[B]\n Link type       : Ethernet\n GID index       : 3\n"
            "---------------------------------------------------------------------------------------\n"
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            f" 65536      5000             {avg + 0.05:.2f}              {avg:.2f}  \t\t   0.176563\n"
            "---------------------------------------------------------------------------------------\n")


PROFILE = {"PROFILE_NAME": "lab", "RECIPE": "lab", "HEAD_SSH": "spark-head", "WORKER_SSH": "spark-worker",
           "HEAD_IP": "10.0.0.1", "WORKER_IP": "10.0.0.2", "MIN_TCP_GBPS": 0.1, "MAX_RTT_MS": 5.0,
           "MAX_CLOCK_OFFSET_MS": 50.0, "READY_TIMEOUT": 900, "SERVED_MODEL_NAME": "tiny", "SSH_KEY": ".lab/id_ed25519"}


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def build_run(root: Path, run_id: str, *, status: str = "passed", created: str = "2026-12-01T04:00:00+00:00",
              profile: str = "lab", tcp=(9.133, 7.765), kernel: str = "6.18.44", gpu_status: str = "N/A",
              steps=("00_preflight", "01_network", "02_weights", "03_engram", "04_launch"), bench: Path | None = None,
              plant: dict | None = None, command_flag: str = "--max-model-len 4096") -> Path:
    run = root / run_id
    (run / "steps").mkdir(parents=True)
    man = {"version": 1, "run_id": run_id, "profile": profile, "created": created, "status": status, "steps": {},
           "mode": "headless", "dry_run": False, "profile_source": "env/lab.env"}
    prof = dict(PROFILE, PROFILE_NAME=profile)
    if plant:
        prof.update(plant.get("profile", {}))
    write(run / "profile.json", json.dumps(prof, indent=2))
    write(run / "provenance.json", json.dumps({"git": {"sha": "a" * 40, "dirty": False}, "python": "3.11.2",
                                               "packages": {"papermill": "2.6"}, "host": {"hostname": "x"}}))

    def sidecar(step, checks, data, st="passed"):
        write(run / "steps" / f"{step}.json", json.dumps({"step": step, "status": st, "written": created,
                                                         "checks": checks, "data": data}, indent=2))
        counts = {s: sum(1 for c in checks if c["status"] == s) for s in ("PASS", "FAIL", "WARN", "N/A", "NO-OP")}
        man["steps"][step] = {"notebook": f"notebooks/{step}.ipynb", "status": st, "seconds": 12.5, "exit": 0,
                              "error": "", "checks": counts, "check_status": st, "sidecar": f"steps/{step}.json"}

    if "00_preflight" in steps:
        nodes = {n: {"os": "Debian GNU/Linux 12 (bookworm)", "kernel": kernel, "machine": "x86_64", "hostname": f"spark-{n}",
                     "mem_available": 24135057408 + i, "docker": "20.10.24", "gpus": [], "driver": None,
                     "image_id": "sha256:" + "e" * 64, "image_layers": [], "listening": [22]}
                 for i, n in enumerate(("head", "worker"))}
        checks = [chk("ssh reachable", "head", observed="hostname spark-head", expected="key-only SSH"),
                  chk("kernel parity", "cluster", observed=f"head={kernel}, worker={kernel}", expected="identical"),
                  chk("GPU present", "head", gpu_status, observed="profile expects no GPU", expected="none (EXPECT_GPU=0)"),
                  chk("memory available", "head", observed="MemAvailable 22.5 GiB", expected=">= 3.0 GiB",
                      data={"mem_available_bytes": nodes["head"]["mem_available"], "need_gib": 3.0}),
                  chk("clock offset between nodes", "cluster", observed="5.7 ms", expected="<= 50 ms",
                      data={"spread_ms": (0.013017416 - 0.007323503) * 1000, "uncertainty_ms": 30.4})]
        if plant:
            checks.append(chk("planted", "head", "WARN", observed=plant["observed"], expected="nothing secret",
                              fix=plant.get("fix", "")))
        sidecar("00_preflight", checks, {"nodes": nodes, "clock_offsets_s": {"head": [0.007323503, 0.0298],
                                                                              "worker": [0.013017416, 0.0303]},
                                         "duration_s": 5.7})
    if "01_network" in steps:
        checks, bw = [], []
        for (a, b), gbps in zip((("head", "worker"), ("worker", "head")), tcp):
            base = f"iperf3_rail0_{a}_to_{b}"
            write(run / "raw/01_network" / f"{base}_client.json", iperf_json(gbps * 1e9, gbps * 1e9 * 1.002))
            write(run / "raw/01_network" / f"{base}_server.json", "{}")
            write(run / "raw/01_network" / f"ping_rail0_{a}_to_{b}.txt", ping_text(0.088))
            checks.append(chk(f"net.ping.rail0.{a}->{b}", a, observed="0% loss", expected="0% loss",
                              evidence=[f"raw/01_network/ping_rail0_{a}_to_{b}.txt"],
                              data={"rtt_avg_ms": 0.088, "rtt_max_ms": 0.151}))
            data = {"kind": "tcp", "rail": "rail0", "direction": f"{a}->{b}", "gbps": gbps * 1e9 / 1e9,
                    "threshold_gbps": 0.1, "sender_gbps": gbps * 1.002}
            checks.append(chk(f"net.tcp.rail0.{a}->{b}", a, observed=f"{gbps:.2f} Gb/s received",
                              expected=">= 0.1 Gb/s (MIN_TCP_GBPS)",
                              evidence=[f"raw/01_network/{base}_client.json", f"raw/01_network/{base}_server.json"],
                              data=data))
            bw.append({**{k: data[k] for k in ("kind", "rail", "direction", "gbps", "threshold_gbps")}, "status": "PASS"})
        write(run / "raw/01_network/ib_write_bw_rail0_head_to_worker_client.txt", ib_bw_text(92.57))
        checks.append(chk("net.rdma.bw.rail0.head->worker", "head", observed="92.57 Gb/s", expected=">= 90 Gb/s",
                          evidence=["raw/01_network/ib_write_bw_rail0_head_to_worker_client.txt"],
                          data={"kind": "rdma", "rail": "rail0", "direction": "head->worker", "gbps": 92.57,
                                "threshold_gbps": 90.0, "gid_index": 3, "mtu": 4096}))
        checks.append(chk("net.rdma.bw.total.head->worker", "cluster", observed="92.57 Gb/s", expected=">= 90",
                          data={"kind": "rdma_total", "direction": "head->worker", "gbps": 92.57, "threshold_gbps": 90.0}))
        checks.append(chk("net.gid", "head", observed="index 3", expected="RoCE v2", data={"resolved": 3}))
        checks.append(chk("net.gid", "worker", observed="index 3", expected="RoCE v2", data={"resolved": 3}))
        sidecar("01_network", checks, {"bandwidth": bw, "duration_s": 13.0})
    if "02_weights" in steps:
        checks = [chk("weights.verified", n, observed="7/7 files ok", expected="7/7 files",
                      data={"bytes_hashed": 9048126, "files_hashed": 7, "seconds": s, "gbps": round(9048126 / s / 1e9, 4),
                            "revision": "708253b", "failed": []})
                  for n, s in (("head", 0.2701), ("worker", 0.3923))]
        sidecar("02_weights", checks, {"repo": "spark-runbook/tiny", "revision": "708253b", "files": 7,
                                       "total_bytes": 9048126, "mode": "rsync"})
    if "03_engram" in steps:
        results = {}
        for n, ops in (("head", 12529), ("worker", 12554)):
            results[n] = {
                "pack": {"ok": True, "exit": 0, "tool": "engram-pack", "files": [], "bytes_written": 104857600,
                         "seconds": 2.5, "mb_s": round(104857600 / 2.5 / 1e6, 1), "peak_rss_bytes": 15 << 20, "wall_s": 2.7},
                "check": {"ok": True, "tool": "engram-check", "files": [{"path": "/x/engram-l1-r0of2.bin", "ok": True,
                                                                          "rows_checked": 257, "problems": []}]},
                "probe": {"ok": True, "tool": "engram-probe", "mode": "direct", "file": "/x/engram-l1-r0of2.bin",
                          "results": [{"qd": 1, "ops": ops, "seconds": 3.001, "iops": round(ops / 3.0007, 1),
                                       "lat_us": {"p50": 63.1, "p99": 3555.4}, "errors": []}]}}

        st = RawRecorder(run, "03_engram")      # record() writes the sidecar data + raw JSON as the step does
        record(st, results)
        checks = [c.to_record() for n in results for c in probe_checks(n, results[n]["probe"])]
        sidecar("03_engram", checks, st.data)
    if "04_launch" in steps:
        ranks = [{"node": n, "rank": r, "headless": r == 1, "runtime": "process", "env": {"VLLM_HOST_IP": ip},
                  "secret_env": ["VLLM_API_KEY"], "serve_argv": ["vllm", "serve"],
                  "display": f"env VLLM_HOST_IP={ip} VLLM_API_KEY=*** vllm serve /m {command_flag} --tensor-parallel-size 2"
                             + (" --headless" if r else "")}
                 for n, r, ip in (("head", 0, "10.0.0.1"), ("worker", 1, "10.0.0.2"))]
        write(run / "raw/04_launch/rendered.json", json.dumps({"profile": profile, "recipe": "lab", "runtime": "process",
                                                               "fingerprint": "f" * 64, "ranks": ranks}))
        ready = {"port_open": 20.5, "health": 21.0, "models": 21.2, "first_token": 23.75}
        checks = [chk(f"ready: {ph.replace('_', ' ')}", "head", observed=f"{s:.1f} s from launch",
                      expected="within READY_TIMEOUT=900 s", data={"seconds": s}) for ph, s in ready.items()]
        sidecar("04_launch", checks, {"launch": {"base_url": "http://10.0.0.1:8000", "fingerprint": "f" * 64,
                                                 "runtime": "process", "reused": False, "readiness_s": ready,
                                                 "head_started_s": 1.2, "startup_log": {}, "capacity": []}})
    if bench is not None:
        dest = run / "raw/07_bench"
        shutil.copytree(bench, dest)
        res = BenchResult.load(dest / "result.json")
        sidecar("07_bench", [c.to_record() for c in res.checks()], {"result": "raw/07_bench/result.json"})
    write(run / "manifest.json", json.dumps(man, indent=2))
    return run


class RawRecorder:
    """What ``runbook.engram.packing.record`` needs of a Step: ``data`` and ``raw(name, text)`` archiving
    under ``raw/<step>/`` of the run (the real ``RunDir`` writer); nothing else."""
    __slots__ = ("data", "_run", "_step")

    def __init__(self, run: Path, step: str):
        self.data: dict = {}
        self._run, self._step = RunDir(run), step

    def raw(self, name: str, text: str) -> str:
        return self._run.write_raw(self._step, name, text)


def edit_sidecar(run: Path, step: str, change) -> dict:
    """Apply ``change(sidecar)`` to ``steps/<step>.json`` of ``run`` and write it back."""
    path = run / "steps" / f"{step}.json"
    sc = json.loads(path.read_text())
    change(sc)
    path.write_text(json.dumps(sc, indent=2))
    return sc


def bench_output(out: Path, **config) -> Path:
    """A real benchmark output (result.json + requests/chunks/metrics JSONL) against the reference server."""
    cfg = dict(prompt_tokens=64, decode_tokens=24, concurrency=(1, 2), prefill_tokens=(256,), repeats=2,
               warmup_requests=1, recipe="exl3-v41")
    cfg.update(config)
    with serve_in_thread(RefConfig(ttft_s=0.02, interval_s=0.004, prefill_tok_s=20000.0)) as srv:
        run_benchmark(srv.base_url, "ref-model", BenchConfig(**cfg), out)
    return out


# ------------------------------------------------------------------------------------------------
# full runs (every step 00-07) for the verdict
# ------------------------------------------------------------------------------------------------

#: the recipe checkout keys a recipe profile needs (given as overrides: the shipped profile's own values
#: are not what the tests are about)
RECIPE_PIN = {"RECIPE_REPO": "https://github.com/example/exl3-recipe", "RECIPE_COMMIT": "c0ffee" + "1" * 34,
              "RECIPE_DIR": "~/recipes/exl3-recipe"}
# the names 05/06 record (from an archived lab run); quality.* are the gate's rows
SMOKE_CHECKS = ("server.reachable", "health", "version", "models.served_name", "models.max_model_len", "metrics",
                "chat.response", "chat.answer", "chat.stream", "concurrency", "context.near_max", "context.past_max")
QUALITY_CHECKS = ("quality.arithmetic", "quality.word_problems", "quality.needle", "quality.json_format",
                  "quality.garble")
TOOL_CHECKS = ("tools.single", "tools.nested", "tools.multi_turn", "tools.parallel", "tools.forced_named",
               "tools.forced_required")


def recipe_profile(env: str = "env/exl3-v41.env", **overrides) -> Profile:
    """A shipped profile loaded (and validated) as the runner loads it; recipe profiles get RECIPE_PIN."""
    extra = {} if env.endswith("lab.env") else dict(RECIPE_PIN)
    return load_profile(REPO / env, {**extra, **{k: str(v) for k, v in overrides.items()}})


def seed_bench_output(out: Path, profile: Profile) -> Path:
    """A real benchmark against the reference server with the step's own config for ``profile``
    (``config_from_profile``: recipe profiles measure at their seed's published conditions and sizes;
    one repeat, no soak, no class panel, to stay short)."""
    cfg = dataclasses.replace(config_from_profile(profile, repeats=1, soak_seconds=0), classes=())
    with serve_in_thread(RefConfig(ttft_s=0.01, interval_s=0.0005, prefill_tok_s=1e8)) as srv:
        run_benchmark(srv.base_url, "ref-model", cfg, out)
    return out


def add_sidecar(run: Path, step: str, checks: list[dict], data: dict, status: str = "passed") -> None:
    """``steps/<step>.json`` and the step's manifest entry, as Step.finish writes them."""
    rd = RunDir(run)
    rd.write_sidecar(step, checks, data, status)
    counts = {s: sum(1 for c in checks if c["status"] == s) for s in ("PASS", "FAIL", "WARN", "N/A", "NO-OP")}
    rd.record_step(step, notebook=f"notebooks/{step}.ipynb", status=status, seconds=3.0, exit=0, error="",
                   checks=counts, check_status=status, sidecar=rd.sidecar_rel(step))


def build_full_run(root: Path, run_id: str, profile: Profile, *, bench: Path, recipe: bool = True,
                   quality_status: str = "PASS", **kwargs) -> Path:
    """Every step 00-07 with ``profile`` as the run's profile.json: 00-04 from :func:`build_run`, the
    revisions 02 fetched, 04's recipe record (``recipe``: the pinned commit and patch markers found on
    each rank), the 05 smoke + quality gate rows, the 06 tool rows and the 07 bench at ``bench``."""
    run = build_run(root, run_id, profile=profile.profile_name, bench=bench, **kwargs)
    prof = profile.redacted()
    (run / "profile.json").write_text(json.dumps(prof, indent=2))
    engram = ({"enabled": True, "repo": prof["HF_ENGRAM_REPO"], "revision": prof["HF_ENGRAM_REVISION"]}
              if prof["ENGRAM"] and not profile.is_lab else {"enabled": bool(prof["ENGRAM"])})
    edit_sidecar(run, "02_weights", lambda sc: sc["data"].update(repo=prof["HF_MODEL_REPO"],
                                                                 revision=prof["HF_REVISION"], engram=engram))
    if recipe:
        edit_sidecar(run, "04_launch", lambda sc: sc["data"].update(recipe={
            "repo": prof.get("RECIPE_REPO"), "commit": prof.get("RECIPE_COMMIT"),
            "markers": {n: [f"[{n}] recipe start chain: 3/3 steps done"] for n in ("head", "worker")}}))
    add_sidecar(run, "05_smoke", [chk(n, observed="ok", expected="ok") for n in SMOKE_CHECKS]
                + [chk(n, status=quality_status, observed="score 1.0", expected=">= threshold") for n in QUALITY_CHECKS],
                {"server": {"base_url": "http://10.0.0.1:8000"}})
    add_sidecar(run, "06_vision_tools", [chk("vision.disabled", observed="VISION=0", expected="no image input")]
                + [chk(n, observed="tool call parsed", expected="strict") for n in TOOL_CHECKS], {})
    return run


def edit_bench_config(run: Path, **fields) -> dict:
    """Change fields of the recorded bench config (``result.json`` the 07 sidecar names)."""
    path = run / json.loads((run / "steps/07_bench.json").read_text())["data"]["result"]
    res = json.loads(path.read_text())
    res["config"].update(fields)
    path.write_text(json.dumps(res, indent=1))
    return res
