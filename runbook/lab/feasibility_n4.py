"""Feasibility measurement for issue 39: CPU vLLM across four namespace nodes on one switch.

    sudo python -m runbook.lab.feasibility_n4 [--configs tp4,tp2pp2,ray,rayv2] [--work DIR] [--model DIR]

For each configuration, one at a time, on a fresh four-node switch (:mod:`runbook.lab.switchlab`, bridge
``fn4sw0`` MTU 9000 on 10.78.0.0/24, namespaces ``fn4-n1..n4``; the embedded lab's nl-* / 10.77.0.0/24 is never
touched):

- ``tp4``: ``vllm serve --tensor-parallel-size 4 --nnodes 4 --node-rank k --master-addr 10.78.0.11`` in each
  namespace, vLLM's own multi-node ``mp`` launcher (``--headless`` on ranks 1-3, started first, as the lab starts
  them: docs/lab-vllm.md), each rank with the lab's environment (``vllm_lab.serve_env``: ``VLLM_HOST_IP`` = the
  node's address, ``GLOO/TP/NCCL_SOCKET_IFNAME`` = its port, ``VLLM_CPU_OMP_THREADS_BIND`` head alone on CPU 0,
  the others on the rest, ``VLLM_CPU_KVCACHE_SPACE``);
- ``tp2pp2``: the same with ``--tensor-parallel-size 2 --pipeline-parallel-size 2`` (``--enforce-eager``, as the lab
  serves); ``tp2pp2c``: the same without ``--enforce-eager`` (compiled);
- ``ray`` / ``rayv2``: ``ray start --head`` in n1 and ``ray start --address`` in n2-n4 (each with its own node IP),
  ``ray status`` until four nodes, then ``vllm serve --tensor-parallel-size 4 --distributed-executor-backend ray``
  on the head alone (``rayv2``: with ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1``). Ray comes from ``--ray-site``
  (``pip install --target``), put on ``PYTHONPATH`` for these runs only.

Measured per configuration: launch to ``/health`` 200 (from the first rank's start and from the head's), RSS and
PSS per rank (the sum over the rank's processes, from /proc; PSS splits shared pages, so its sum is the real total),
the peak of the summed PSS while booting, host MemAvailable before / when ready / after the stop, one completion's
latency (and a second, warm one), each rank's ``world_size=… rank=…`` line, and the stop times. Every process is
started inside a namespace of this switch; the switch's teardown (also on SIGTERM/SIGINT/SIGHUP) kills whatever is
left in them, by pid, and the script checks that nothing is. Results: ``<work>/results.json`` and a printed table.
Needs root, the lab's CPU vLLM venv (``LAB_VLLM_VENV`` or ``--venv``), and for Ray ``--ray-site``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..facts import ray as ray_facts
from ..errors import LabError
from . import switchlab
from .netlab.host import netns_pids, tail_text
from .vllm_lab import VllmServer, http_json, lab_python, lab_vllm_venv, serve_command, serve_env

CONFIGS = ("tp4", "tp2pp2", "tp2pp2c", "ray", "rayv2")
NODES = 4
PORT = 8000
MASTER_PORT = 29501
RAY_PORT = 6379
RAY_OBJECT_STORE = 100 * 1024 * 1024     # bytes per Ray node (Ray's floor is 75 MiB); /dev/shm is shared here
PROMPT = "def fibonacci(n):"
RANK_LINE = re.compile(r"world_size=\d+ rank=\d+[^\n]*")


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise LabError("no MemAvailable in /proc/meminfo")


def proc_mem_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB from /proc/<pid>/smaps_rollup; (0, 0) when it is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def group_mem(pids: list[int]) -> dict:
    """Summed RSS/PSS (MiB) of ``pids`` with a per-process breakdown."""
    procs = []
    for pid in pids:
        rss, pss = proc_mem_kib(pid)
        if rss:
            procs.append({"pid": pid, "comm": _comm(pid), "rss_mib": round(rss / 1024, 1),
                          "pss_mib": round(pss / 1024, 1)})
    return {"rss_mib": round(sum(p["rss_mib"] for p in procs), 1),
            "pss_mib": round(sum(p["pss_mib"] for p in procs), 1), "processes": procs}


def ns_mem(sw: switchlab.Switch, k: int) -> dict:
    """Memory of everything running in node k's namespace (a Ray node's daemons, a rank's processes)."""
    return group_mem(netns_pids(sw.netns(k)))


def rank_lines(log: Path) -> list[str]:
    try:
        return sorted(set(RANK_LINE.findall(log.read_text(errors="replace"))))[:4]
    except OSError:
        return []


def error_lines(log: Path, n: int = 12) -> list[str]:
    """The log's last error-looking lines (exceptions, ERROR records), for the report."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    hits = [l for l in lines if re.search(r"(Error|Exception|error:|ERROR)", l)]
    return hits[-n:]


def complete(base: str, model: str = "tiny") -> dict:
    t0 = time.monotonic()
    try:
        status, body = http_json(f"{base}/v1/completions",
                                 {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}, timeout=300)
    except ConnectionError as exc:       # the server went away (its engine died on an earlier request)
        return {"status": None, "latency_s": round(time.monotonic() - t0, 3), "body": str(exc)[:300]}
    dt = time.monotonic() - t0
    out = {"status": status, "latency_s": round(dt, 3)}
    if status == 200 and isinstance(body, dict):
        out["usage"] = body.get("usage")
        out["text"] = body["choices"][0]["text"][:60]
    else:
        out["body"] = str(body)[:300]
    return out


def omp_binds(ranks: int) -> list[str]:
    """The lab's rule: the head alone on CPU 0, the other ranks in turn on the remaining CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    rest = cpus[1:] or cpus
    return [str(cpus[0])] + [str(rest[i % len(rest)]) for i in range(ranks - 1)]


def wait_health(base: str, ranks: list[VllmServer], started: float, timeout: float, peak: dict) -> float:
    """Poll /health until 200 while every rank lives; track the peak summed PSS. Seconds since ``started``."""
    deadline = started + timeout
    while time.monotonic() < deadline:
        dead = [r for r in ranks if not r.alive()]
        if dead:
            raise LabError(f"rank {ranks.index(dead[0])} exited with {dead[0].proc.returncode} before /health",
                           observed=tail_text(dead[0].log_tail(40), 3000), expected="every rank alive",
                           evidence=str(dead[0].log_path))
        total = sum(group_mem(r.processes())["pss_mib"] for r in ranks)
        peak["pss_mib"] = max(peak.get("pss_mib", 0), round(total, 1))
        try:
            status, _ = http_json(f"{base}/health", timeout=5)
            if status == 200:
                return time.monotonic() - started
        except (ConnectionError, OSError):
            pass
        time.sleep(2)
    raise LabError(f"/health not 200 after {timeout:.0f} s", observed=ranks[0].log_tail(20), expected="200",
                   evidence=str(ranks[0].log_path))


def run_mp(sw, cfg: str, model: Path, work: Path, venv: Path, kv_gib: int, timeout: float) -> dict:
    tp, pp = (4, 1) if cfg == "tp4" else (2, 2)
    eager = cfg != "tp2pp2c"     # tp2pp2c: compiled, so the CPU runner's warm-up run happens (see docs/four-nodes.md)
    binds = omp_binds(NODES)
    res: dict = {"config": cfg, "tp": tp, "pp": pp, "enforce_eager": eager, "omp_binds": binds, "kv_gib_per_rank": kv_gib,
                 "mem_available_before_mib": mem_available_kib() // 1024}
    servers: dict[int, VllmServer] = {}
    commands = {}
    try:
        t_first = None
        for rank in list(range(NODES - 1, 0, -1)) + [0]:           # workers first (3, 2, 1), then the head
            k = rank + 1
            cmd = serve_command(model, python=lab_python(venv), host="0.0.0.0", port=PORT, tools=False, tp=tp,
                                enforce_eager=eager, nnodes=NODES, node_rank=rank, master_addr=sw.node_ip(1), master_port=MASTER_PORT,
                                headless=rank != 0,
                                extra=["--pipeline-parallel-size", str(pp)] if pp > 1 else [])
            env = serve_env(host_ip=sw.node_ip(k), kvcache_gib=kv_gib, omp_bind=binds[rank],
                            socket_ifname=sw.port_name)
            commands[rank] = " ".join(cmd)
            servers[rank] = VllmServer.start(switchlab.node_argv(sw, k, cmd), env, work / f"{cfg}-rank{rank}.log")
            t_first = t_first or servers[rank].started
        head = servers[0]
        peak: dict = {}
        ready = wait_health(f"http://{sw.node_ip(1)}:{PORT}", [servers[r] for r in range(NODES)], head.started,
                            timeout, peak)
        res["ready_from_head_s"] = round(ready, 1)
        res["ready_from_first_rank_s"] = round(ready + head.started - t_first, 1)
        res["peak_boot_pss_mib"] = peak.get("pss_mib")
        res["mem_available_ready_mib"] = mem_available_kib() // 1024
        res["ranks"] = {r: {"node": sw.netns(r + 1), "ip": sw.node_ip(r + 1), **group_mem(servers[r].processes()),
                            "rank_lines": rank_lines(servers[r].log_path)} for r in range(NODES)}
        base = f"http://{sw.node_ip(1)}:{PORT}"
        res["completion_first"] = complete(base)
        res["completion_second"] = complete(base)
        res["mem_available_after_completion_mib"] = mem_available_kib() // 1024
        if res["completion_first"]["status"] != 200:
            res["error"] = f"first completion: HTTP {res['completion_first']['status']}"
            res["error_lines"] = {r: error_lines(s.log_path) for r, s in servers.items()}
    except (LabError, ConnectionError, OSError) as exc:
        res["error"] = str(exc)
        res["error_lines"] = {r: error_lines(s.log_path) for r, s in servers.items()}
    finally:
        res["commands"] = commands
        res["stop_s"] = {}
        for rank in sorted(servers):                             # head first, then each worker
            try:
                res["stop_s"][rank] = round(servers[rank].stop(grace=20), 1)
            except LabError as exc:
                res["stop_s"][rank] = f"error: {exc.what}"
        res["left_in_namespaces"] = {sw.netns(k): netns_pids(sw.netns(k)) for k in range(1, NODES + 1)}
        res["mem_available_after_stop_mib"] = mem_available_kib() // 1024
    return res


def _ray_temp(sw, k: int) -> str:
    """Node k's Ray --temp-dir: the namespaces share this host's /tmp, so each node gets its own (short: Ray's
    unix socket paths live under it)."""
    return f"/tmp/{sw.netns(k)}-ray"


def _ray_env(sw, k: int, ray_site: Path, extra: dict | None = None) -> dict:
    env = serve_env(host_ip=sw.node_ip(k), socket_ifname=sw.port_name)
    env.update({"PYTHONPATH": os.pathsep.join(p for p in (str(ray_site), env.get("PYTHONPATH", "")) if p),
                "RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0",
                "RAY_ADDRESS": f"{sw.node_ip(1)}:{RAY_PORT}", **(extra or {})})
    return env


def _ray(sw, k: int, venv: Path, ray_site: Path, args: list[str], timeout: float = 180) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run(switchlab.node_argv(sw, k, [str(lab_python(venv)), str(ray_site / "bin" / "ray"), *args]),
                          env=_ray_env(sw, k, ray_site), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return proc.returncode, (proc.stdout + proc.stderr), time.monotonic() - t0


def ray_node_count(status_text: str) -> int:
    """Active nodes in ``ray status`` output (facts/ray.py's parser, the launcher's own)."""
    return len(ray_facts.parse_status(status_text).active)


def run_ray(sw, cfg: str, model: Path, work: Path, venv: Path, ray_site: Path, timeout: float) -> dict:
    res: dict = {"config": cfg, "mem_available_before_mib": mem_available_kib() // 1024, "ray_start_s": {}}
    common = ["--num-gpus", "0", "--num-cpus", "1", "--object-store-memory", str(RAY_OBJECT_STORE),
              "--disable-usage-stats"]
    rc, out, dt = _ray(sw, 1, venv, ray_site, ["start", "--head", "--node-ip-address", sw.node_ip(1), "--port",
                                                str(RAY_PORT), "--include-dashboard", "false",
                                                "--temp-dir", _ray_temp(sw, 1), *common])
    res["ray_start_s"][1] = round(dt, 1)
    (work / f"{cfg}-ray-start-n1.log").write_text(out)
    if rc != 0:
        res["error"] = f"ray start --head rc={rc}: {tail_text(out, 1500)}"
        return _ray_down(sw, venv, ray_site, res)
    for k in range(2, NODES + 1):
        rc, out, dt = _ray(sw, k, venv, ray_site, ["start", "--address", f"{sw.node_ip(1)}:{RAY_PORT}",
                                                    "--node-ip-address", sw.node_ip(k),
                                                    "--temp-dir", _ray_temp(sw, k), *common])
        res["ray_start_s"][k] = round(dt, 1)
        (work / f"{cfg}-ray-start-n{k}.log").write_text(out)
        if rc != 0:
            res["error"] = f"ray start --address on n{k} rc={rc}: {tail_text(out, 1500)}"
            return _ray_down(sw, venv, ray_site, res)
    t0, nodes, out = time.monotonic(), 0, ""
    while time.monotonic() - t0 < 120:
        rc, out, _ = _ray(sw, 1, venv, ray_site, ["status", "--address", f"{sw.node_ip(1)}:{RAY_PORT}"], timeout=60)
        nodes = ray_node_count(out) if rc == 0 else 0
        if nodes >= NODES:
            break
        time.sleep(2)
    res["ray_status_nodes"] = nodes
    res["ray_status"] = out
    (work / f"{cfg}-ray-status.txt").write_text(out)
    res["ray_node_mem"] = {sw.netns(k): ns_mem(sw, k) for k in range(1, NODES + 1)}
    res["mem_available_ray_up_mib"] = mem_available_kib() // 1024
    if nodes < NODES:
        res["error"] = f"ray status shows {nodes} nodes, not {NODES}"
        return _ray_down(sw, venv, ray_site, res)
    cmd = serve_command(model, python=lab_python(venv), host="0.0.0.0", port=PORT, tools=False, tp=NODES,
                        extra=["--distributed-executor-backend", "ray"])
    extra = {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1" if cfg == "rayv2" else "0"}
    env = _ray_env(sw, 1, ray_site, extra)
    env["VLLM_CPU_OMP_THREADS_BIND"] = omp_binds(NODES)[0]
    res["command"] = " ".join(cmd)
    res["env"] = {k: env[k] for k in ("RAY_ADDRESS", "VLLM_HOST_IP", "GLOO_SOCKET_IFNAME",
                                      "VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "VLLM_CPU_OMP_THREADS_BIND")}
    srv = VllmServer.start(switchlab.node_argv(sw, 1, cmd), env, work / f"{cfg}-head.log")
    try:
        peak: dict = {}
        res["ready_from_head_s"] = round(wait_health(f"http://{sw.node_ip(1)}:{PORT}", [srv], srv.started,
                                                     timeout, peak), 1)
        res["head_mem"] = group_mem(srv.processes())
        res["completion_first"] = complete(f"http://{sw.node_ip(1)}:{PORT}")
    except (LabError, ConnectionError, OSError) as exc:
        res["error"] = f"vllm serve (ray) failed after {time.monotonic() - srv.started:.1f} s"
        res["exit_code"] = srv.proc.returncode
        res["error_lines"] = error_lines(srv.log_path, 25)
        res["log_tail"] = srv.log_tail(40)
        res["detail"] = getattr(exc, "what", str(exc))
    finally:
        try:
            res["serve_stop_s"] = round(srv.stop(grace=20), 1)
        except LabError as exc:
            res["serve_stop_s"] = f"error: {exc.what}"
    return _ray_down(sw, venv, ray_site, res)


def _ray_down(sw, venv: Path, ray_site: Path, res: dict) -> dict:
    """End the Ray nodes by pid (everything in our namespaces). Not `ray stop`: it kills every Ray process on the
    machine by name, other users' included."""
    t0 = time.monotonic()
    res["ray_killed_pids"] = len(switchlab.kill_processes(sw, timeout=15))
    for k in range(1, NODES + 1):               # each node's --temp-dir (sessions, logs, sockets)
        shutil.rmtree(_ray_temp(sw, k), ignore_errors=True)
    res["ray_down_s"] = round(time.monotonic() - t0, 1)
    res["left_in_namespaces"] = {sw.netns(k): netns_pids(sw.netns(k)) for k in range(1, NODES + 1)}
    res["mem_available_after_stop_mib"] = mem_available_kib() // 1024
    return res


def summary(results: list[dict]) -> str:
    rows = ["config | ready (head / first rank) s | PSS per rank MiB | RSS per rank MiB | completion s (1st/2nd) | "
            "MemAvailable before/ready/after MiB | error"]
    for r in results:
        ranks = r.get("ranks") or {}
        pss = "/".join(str(ranks[k]["pss_mib"]) for k in sorted(ranks)) or "-"
        rss = "/".join(str(ranks[k]["rss_mib"]) for k in sorted(ranks)) or "-"
        c1, c2 = r.get("completion_first", {}), r.get("completion_second", {})
        rows.append(f"{r['config']} | {r.get('ready_from_head_s', '-')} / {r.get('ready_from_first_rank_s', '-')} | "
                    f"{pss} | {rss} | {c1.get('latency_s', '-')}/{c2.get('latency_s', '-')} | "
                    f"{r.get('mem_available_before_mib')}/{r.get('mem_available_ready_mib', r.get('mem_available_ray_up_mib', '-'))}"
                    f"/{r.get('mem_available_after_stop_mib')} | {(r.get('error') or '')[:160]}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.lab.feasibility_n4", description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--work", help="directory for logs and results.json (default: a new temp dir)")
    ap.add_argument("--model", help="a model from `python -m runbook.lab.tinymodel_tp4` (default: made in --work)")
    ap.add_argument("--venv", default=str(lab_vllm_venv()), help="the lab's CPU vLLM venv")
    ap.add_argument("--ray-site", default="/work/fn4/ray-site", help="`pip install --target` dir holding ray[default]")
    ap.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per rank (the lab's default 1)")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--prefix", default="fn4")
    ap.add_argument("--subnet", default="10.78.0")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    venv, ray_site = Path(args.venv), Path(args.ray_site)
    problems = ([f"unknown config(s) {bad}: choose from {', '.join(CONFIGS)}"] if bad else []) + \
        ([] if os.geteuid() == 0 else ["needs root (network namespaces)"]) + \
        ([] if lab_python(venv).exists() else [f"no {lab_python(venv)}: pass --venv or set LAB_VLLM_VENV"]) + \
        ([f"no {ray_site / 'bin' / 'ray'}: pip install --target {ray_site} 'ray[default]'"]
         if any(c.startswith("ray") for c in configs) and not (ray_site / "bin" / "ray").exists() else [])
    if problems:
        print("refused before anything ran:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    sw = switchlab.Switch(args.prefix, args.subnet)
    work = Path(args.work or tempfile.mkdtemp(prefix="feasibility-n4-"))
    work.mkdir(parents=True, exist_ok=True)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)
    results: list[dict] = []
    doc: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                 "mem_total_mib": int(Path("/proc/meminfo").read_text().split()[1]) // 1024, "results": results}
    t_all = time.monotonic()
    try:
        if args.model:
            model = Path(args.model)
        else:
            t0 = time.monotonic()
            model = work / "tiny-tp4"
            subprocess.run([str(lab_python(venv)), "-m", "runbook.lab.tinymodel_tp4", "--out", str(model)],
                           check=True, capture_output=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
            doc["model_made_s"] = round(time.monotonic() - t0, 1)
        doc["model"] = str(model)
        for cfg in configs:
            switchlab.down(sw)
            t0 = time.monotonic()
            switchlab.up(sw, NODES)
            rows = switchlab.pair_checks(sw, NODES)
            net = {"up_s": round(time.monotonic() - t0, 2), "failed": [r.name for r in rows if r.failed],
                   "paths": {r.name: r.observed for r in rows if r.name.startswith("switch.path.")}}
            print(f"[{cfg}] switch up + {len(net['paths'])} DF pings in {net['up_s']} s; failed: {net['failed']}",
                  flush=True)
            if net["failed"]:
                results.append({"config": cfg, "switch": net, "error": f"switch pairs failed: {net['failed']}"})
                continue
            if cfg.startswith("ray"):
                r = run_ray(sw, cfg, model, work, venv, ray_site, args.ready_timeout)
            else:
                r = run_mp(sw, cfg, model, work, venv, args.kv_gib, args.ready_timeout)
            r["switch"] = net
            results.append(r)
            print(f"[{cfg}] " + json.dumps({k: r.get(k) for k in ("ready_from_head_s", "ready_from_first_rank_s",
                                                                     "completion_first", "error")}), flush=True)
            (work / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    except Interrupted as exc:
        doc["interrupted"] = str(exc)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        doc["teardown"] = switchlab.down(sw)
        doc["wall_s"] = round(time.monotonic() - t_all, 1)
        (work / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    print(summary(results))
    print(f"results: {work / 'results.json'}")
    return 0 if all("error" not in r for r in results if not r["config"].startswith("ray")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
