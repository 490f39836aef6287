"""Figures of steps 00–04, recomputed from the run folder (one function per step section).

Each function takes (model, run folder, sidecars), appends ``ReportFigure``s (recomputed value beside the value
the step recorded) and node facts to the model, and fills its section's data. A step without a sidecar
adds nothing. Raw files are found through the sidecar: a check's ``evidence`` (01), ``data.engram_raw``
(03); the launch plan and rank logs through ``RunDir.raw_path`` of the sidecar's step (04 archives them
without listing them).

* preflight -- ``data.nodes`` facts and ``data.clock_offsets_s`` re-derived;
* network   -- iperf3 JSON, ping text, ib_write_bw/lat text, nccl-tests log, gloo sweep JSON re-parsed
  with :mod:`runbook.facts`;
* weights   -- hash / share rates from bytes and seconds of the 02 checks;
* engram    -- the Engram tools' own JSON (pack, check, probe per node);
* launch    -- ``rendered.json`` (per-rank commands), readiness seconds, vLLM / NCCL versions.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..evidence import RunDir
from ..facts import nccl, net, rdma
from ..secrets import MASK, default_redactor
from .model import ReportFigure, ReportModel, rounding_rel_tol
from .runfiles import evidence_file, find_sidecar, first_evidence, load_json, number, read_text, relative
from .masking import secret_key

__all__ = ["preflight", "network", "weights", "engram", "launch"]

Sidecars = dict[str, dict[str, Any]]

_IPERF = re.compile(r"iperf3_.*_client\.json$")
_IBBW = re.compile(r"ib_write_bw_.*_client\.txt$")
_IBLAT = re.compile(r"ib_write_lat_.*_client\.txt$")
_PING = re.compile(r"ping_.*\.txt$")
_ENGRAM_RAW = re.compile(r"(pack|check|probe)-(.+)$")
_MISSING = "(raw file missing)"


def preflight(model: ReportModel, run: Path, sidecars: Sidecars) -> None:
    name, sc = find_sidecar(sidecars, "preflight")
    if sc is None:
        return
    src = f"steps/{name}.json"
    data = sc.get("data", {}) or {}
    nodes = data.get("nodes", {}) or {}
    for node, facts in nodes.items():
        env = model.environment.setdefault(node, {})
        for k in ("os", "kernel", "machine", "docker", "driver", "image_id", "hostname"):
            if facts.get(k) is not None:
                env[k] = facts.get(k)
        if facts.get("gpus"):
            env["gpus"] = facts.get("gpus")
    recs = sc.get("checks", []) or []
    # clock offset: spread of the per-node offsets (first element of each pair), uncertainty = max RTT/2
    offs = data.get("clock_offsets_s") or {}
    good = {n: v for n, v in offs.items() if isinstance(v, (list, tuple)) and len(v) >= 2 and number(v[0]) is not None}
    if len(good) >= 2:
        vals = [float(v[0]) for v in good.values()]
        rec = next((r for r in recs if r.get("name") == "clock offset between nodes"), {})
        model.figures.append(ReportFigure(key=f"{name}/clock_offset_ms", step=name, label="clock offset between nodes",
                                    value=(max(vals) - min(vals)) * 1000, unit="ms", source=src,
                                    recorded=number((rec.get("data") or {}).get("spread_ms")),
                                    threshold=number(model.profile.get("MAX_CLOCK_OFFSET_MS")),
                                    higher_is_better=False, node="cluster", group="clock"))
    for r in recs:
        d = r.get("data") or {}
        if r.get("name") == "memory available" and r.get("node") in nodes:
            mem = number(nodes[r["node"]].get("mem_available"))
            model.figures.append(ReportFigure(key=f"{name}/mem_available_gib/{r['node']}", step=name,
                                        label="MemAvailable", node=r["node"],
                                        value=None if mem is None else mem / 2 ** 30, unit="GiB", source=src,
                                        recorded=None if number(d.get("mem_available_bytes")) is None
                                        else number(d["mem_available_bytes"]) / 2 ** 30,
                                        threshold=number(d.get("need_gib")), group="memory"))


def network(model: ReportModel, run: Path, sidecars: Sidecars) -> None:
    name, sc = find_sidecar(sidecars, "network")
    if sc is None:
        return
    totals: dict[str, list[ReportFigure]] = {}

    def source(p: Path | None) -> str:
        return relative(run, p) if p else _MISSING

    for rec in sc.get("checks", []) or []:
        d = rec.get("data") or {}
        cname, node = str(rec.get("name", "")), str(rec.get("node", ""))
        kind = d.get("kind")
        if kind == "tcp":
            p = evidence_file(run, rec, _IPERF)
            val = net.parse_iperf3(read_text(p) or "").receiver_gbps if p is not None else None
            model.figures.append(ReportFigure(key=f"{name}/{cname}", step=name, label=f"TCP {d.get('rail', '')} {d.get('direction', '')}",
                                        value=val, unit="Gb/s", source=source(p), recorded=number(d.get("gbps")),
                                        threshold=number(d.get("threshold_gbps")), node=node, group="tcp"))
        elif kind == "rdma":
            p = evidence_file(run, rec, _IBBW)
            val = rdma.parse_ib_write_bw(read_text(p) or "").avg_gbps if p is not None else None
            fig = ReportFigure(key=f"{name}/{cname}", step=name, label=f"RDMA {d.get('rail', '')} {d.get('direction', '')}",
                         value=val, unit="Gb/s", source=source(p), recorded=number(d.get("gbps")),
                         threshold=number(d.get("threshold_gbps")), node=node, group="rdma")
            model.figures.append(fig)
            totals.setdefault(str(d.get("direction", "")), []).append(fig)
            if d.get("gid_index") is not None:
                model.environment.setdefault(node, {}).setdefault("gid_index_used", d.get("gid_index"))
        elif kind == "rdma_total":
            parts = totals.get(str(d.get("direction", "")), [])
            val = sum(f.value for f in parts) if parts and all(f.value is not None for f in parts) else None
            model.figures.append(ReportFigure(key=f"{name}/{cname}", step=name, label=f"RDMA total {d.get('direction', '')}",
                                        value=val, unit="Gb/s", source=", ".join(f.source for f in parts) or "(no rail figures)",
                                        recorded=number(d.get("gbps")), threshold=number(d.get("threshold_gbps")),
                                        node="cluster", group="rdma"))
        elif kind == "rdma_lat":
            p = evidence_file(run, rec, _IBLAT)
            val = rdma.parse_ib_write_lat(read_text(p) or "").t_typical_us if p is not None else None
            model.figures.append(ReportFigure(key=f"{name}/{cname}", step=name, label=f"RDMA latency {cname.split('.', 3)[-1]}",
                                        value=val, unit="us", source=source(p), recorded=number(d.get("t_typical_us")),
                                        higher_is_better=False, node=node, group="latency"))
        elif kind == "allreduce":
            p = first_evidence(run, rec)
            sw = nccl.parse_allreduce_sweep(read_text(p) or "") if p is not None else None
            rec_peak = max((number(x.get("busbw_gbs")) or 0.0 for x in d.get("points", []) or []), default=None)
            model.figures.append(ReportFigure(key=f"{name}/{cname}/{node}", step=name, label="gloo all-reduce peak busbw",
                                        value=sw.peak_busbw_gbs if sw else None, unit="GB/s", source=source(p),
                                        recorded=rec_peak, node=node, group="allreduce"))
        elif cname.startswith("net.ping.") and "rtt_avg_ms" in d:
            p = evidence_file(run, rec, _PING)
            val = net.parse_ping(read_text(p) or "").rtt_avg_ms if p is not None else None
            model.figures.append(ReportFigure(key=f"{name}/{cname}", step=name, label=f"ping {cname.split('.', 2)[-1]}",
                                        value=val, unit="ms", source=source(p), recorded=number(d.get("rtt_avg_ms")),
                                        threshold=number(model.profile.get("MAX_RTT_MS")), higher_is_better=False,
                                        node=node, group="ping"))
        elif cname == "net.nccl.busbw":
            p = first_evidence(run, rec)
            text = read_text(p) or "" if p is not None else ""
            res = nccl.parse_nccl_tests(text)
            log = nccl.parse_nccl_log(text)
            if log.version:
                model.environment.setdefault("cluster", {})["nccl_version"] = log.version
            if log.transport:
                model.environment.setdefault("cluster", {})["nccl_transport"] = log.transport
            model.figures.append(ReportFigure(key=f"{name}/{cname}", step=name, label="nccl-tests all_reduce avg busbw",
                                        value=res.avg_busbw_gbs, unit="GB/s", source=source(p),
                                        recorded=number(d.get("avg_busbw_gbs")),
                                        threshold=number(model.profile.get("MIN_NCCL_BUSBW_GBS")), node="cluster",
                                        group="nccl"))
        elif cname == "net.gid" and node and node != "cluster":
            idx = d.get("pinned", d.get("resolved"))
            if idx is not None:
                model.environment.setdefault(node, {})["gid_index"] = idx
        elif cname == "net.gid.plan":
            model.environment.setdefault("cluster", {})["gid_common"] = d.get("common")


def weights(model: ReportModel, run: Path, sidecars: Sidecars) -> None:
    name, sc = find_sidecar(sidecars, "weights")
    if sc is None:
        return
    src = f"steps/{name}.json"
    data = sc.get("data", {}) or {}
    model.weights = {k: data.get(k) for k in ("repo", "revision", "files", "total_bytes", "layout", "mode")
                     if data.get(k) is not None}
    if data.get("revision"):
        model.environment.setdefault("cluster", {})["weights_revision"] = data.get("revision")
    for rec in sc.get("checks", []) or []:
        d = rec.get("data") or {}
        node = str(rec.get("node", ""))
        # a re-run that reused the manifest hashed nothing: no rate to show
        if rec.get("name") == "weights.verified" and number(d.get("seconds")) and number(d.get("bytes_hashed")):
            b = float(d["bytes_hashed"])
            model.figures.append(ReportFigure(key=f"{name}/verify_gbps/{node}", step=name, label="sha256 verification rate",
                                        value=b / float(d["seconds"]) / 1e9, unit="GB/s", source=src,
                                        recorded=number(d.get("gbps")), node=node, group="verify",
                                        rel_tol=rounding_rel_tol(d.get("seconds"))))
            model.figures.append(ReportFigure(key=f"{name}/verified_bytes/{node}", step=name, label="bytes verified",
                                        value=b, unit="B", source=src,
                                        # all files re-hashed: must be the repo's size (a partial re-hash is not)
                                        recorded=(number(data.get("total_bytes"))
                                                  if d.get("files_hashed") == data.get("files") else None),
                                        node=node, group="verify", higher_is_better=None))
        elif rec.get("name") in ("weights.rsync", "weights.share") and number(d.get("seconds")):
            b = number(d.get("bytes")) or 0.0
            model.figures.append(ReportFigure(key=f"{name}/share_gbps/{node}", step=name, label=f"{rec.get('name')} rate",
                                        value=b / float(d["seconds"]) / 1e9, unit="GB/s", source=src, node=node,
                                        group="share"))
        elif rec.get("name") == "weights.parity":
            model.weights["parity_files"] = d.get("files")
            model.weights["parity_differences"] = len(d.get("differences") or [])
    hr = data.get("hash_rate") or {}
    for k, label in (("verifier", "hash rate (runbook verifier)"), ("sha256sum", "hash rate (sha256sum)")):
        secs = number(hr.get(f"{k}_seconds"))
        if secs and number(hr.get("bytes")):
            model.figures.append(ReportFigure(key=f"{name}/hash_rate/{k}", step=name, label=label,
                                        value=float(hr["bytes"]) / secs / 1e9, unit="GB/s", source=src,
                                        recorded=number(hr.get(f"{k}_gbps")), node="head", group="hash",
                                        rel_tol=rounding_rel_tol(secs)))


def engram(model: ReportModel, run: Path, sidecars: Sidecars) -> None:
    name, sc = find_sidecar(sidecars, "engram")
    if sc is None:
        return
    data = sc.get("data") or {}
    summary = data.get("engram") or {}
    raw = {k: run / v for k, v in (data.get("engram_raw") or {}).items() if isinstance(v, str)}
    for key, p in sorted(raw.items(), key=lambda kv: kv[1].name):
        m = _ENGRAM_RAW.match(key)
        if not m or not p.is_file():
            continue
        tool, node = m.groups()
        obj = load_json(p) or {}
        rec = summary.get(node, {}) or {}
        src = relative(run, p)
        if tool == "pack" and obj:
            secs = number(obj.get("seconds"))
            written = number(obj.get("bytes_written"))
            val = (written / max(secs, 1e-9) / 1e6) if (secs is not None and written is not None) else None
            model.figures.append(ReportFigure(key=f"{name}/pack_mb_s/{node}", step=name, label="pack write rate",
                                        value=val, unit="MB/s", source=src,
                                        recorded=number((rec.get("pack") or {}).get("mb_s")), node=node, group="pack",
                                        rel_tol=rounding_rel_tol(secs)))
            rss = number(obj.get("peak_rss_bytes"))
            if rss is not None:
                model.figures.append(ReportFigure(key=f"{name}/pack_rss_mib/{node}", step=name, label="pack peak RSS",
                                            value=rss / 2 ** 20, unit="MiB", source=src,
                                            recorded=number((rec.get("pack") or {}).get("peak_rss_mib")),
                                            higher_is_better=False, node=node, group="pack"))
        elif tool == "check" and obj:
            rows = sum(int(f.get("rows_checked") or 0) for f in obj.get("files", []) or [])
            ok = sum(1 for f in obj.get("files", []) or [] if f.get("ok"))
            recorded = sum(int(v.get("rows_checked") or 0) for v in ((rec.get("verify") or {}).get("files") or {}).values())
            model.figures.append(ReportFigure(key=f"{name}/verify_rows/{node}", step=name,
                                        label=f"rows verified byte-identical ({ok}/{len(obj.get('files', []) or [])} files ok)",
                                        value=float(rows), unit="rows", source=src,
                                        recorded=float(recorded) if rec.get("verify") else None, node=node,
                                        group="verify", higher_is_better=None))
        elif tool == "probe" and obj:
            for r in obj.get("results", []) or []:
                qd = r.get("qd")
                ops, secs = number(r.get("ops")), number(r.get("seconds"))
                val = ops / max(secs, 1e-9) if (ops is not None and secs is not None) else number(r.get("iops"))
                model.figures.append(ReportFigure(key=f"{name}/probe_qd{qd}_iops/{node}", step=name,
                                            label=f"random read QD{qd} ({obj.get('mode', '')})", value=val,
                                            unit="IOPS", source=src,
                                            recorded=number(((rec.get("probe") or {}).get(f"qd{qd}") or {}).get("iops")),
                                            node=node, group="probe", rel_tol=rounding_rel_tol(secs)))
                p99 = number((r.get("lat_us") or {}).get("p99"))
                if p99 is not None:
                    model.figures.append(ReportFigure(key=f"{name}/probe_qd{qd}_p99_us/{node}", step=name,
                                                label=f"random read QD{qd} p99 latency", value=p99, unit="us",
                                                source=src,
                                                recorded=number(((rec.get("probe") or {}).get(f"qd{qd}") or {}).get("p99_us")),
                                                higher_is_better=False, node=node, group="probe"))
    model.engram = {"nodes": sorted(summary), "raw_files": sorted(relative(run, p) for p in raw.values() if p.is_file())}


#: the identity table's fields (04's "ranks run one build" row) -> the node fact the report shows and drift compares
IDENTITY_FACTS = {"image": "image_layers", "python": "python", "vLLM": "vllm_build", "vLLM package tree": "vllm_tree",
                  "torch": "torch", "NCCL": "nccl_build", "driver / CUDA": "driver_cuda", "recipe files": "recipe_files"}


def launch(model: ReportModel, run: Path, sidecars: Sidecars) -> None:
    name, sc = find_sidecar(sidecars, "launch")
    if not name:      # no sidecar (the step stopped early): its plan may still be archived
        info = model.step("launch")
        name = info.name if info is not None else ""
    if not name:
        return
    raw_dir = RunDir(run).raw_path(name, "")
    rendered = RunDir(run).raw_path(name, "rendered.json")
    plan = load_json(rendered) if raw_dir.is_dir() else None
    data = (sc or {}).get("data", {}) or {}
    launch_data = data.get("launch") if isinstance(data.get("launch"), dict) else data
    for key in ("rendered", "plan"):          # the plan as the sidecar keeps it (the same record)
        if plan is None and isinstance(data.get(key), dict):
            plan = data[key]
    if plan is None and sc is None:
        return
    red = default_redactor()
    ranks = []
    for r in (plan or {}).get("ranks", []) or []:
        display = r.get("display") or " ".join(r.get("docker_argv") or r.get("serve_argv") or [])
        env = {k: (MASK if secret_key(k) else v) for k, v in (r.get("env") or {}).items()}
        ranks.append({"node": r.get("node", ""), "rank": r.get("rank"), "headless": r.get("headless"),
                      "command": red.redact(display), "env": env, "secret_env": sorted(r.get("secret_env") or [])})
        model.environment.setdefault(str(r.get("node", "")), {})["command"] = red.redact(display)
    fp = (plan or {}).get("fingerprint") or launch_data.get("fingerprint")
    if fp:
        model.environment.setdefault("cluster", {})["fingerprint"] = fp
    ready = launch_data.get("readiness_s") or {}
    readiness = []
    recs = {str(r.get("name", "")): r for r in (sc or {}).get("checks", []) or []}
    for phase, secs in ready.items():
        rec = recs.get(f"ready: {phase.replace('_', ' ')}", {})
        readiness.append({"phase": phase, "seconds": number(secs)})
        model.figures.append(ReportFigure(key=f"{name}/ready/{phase}", step=name, label=f"ready: {phase.replace('_', ' ')}",
                                    value=number(secs), unit="s from launch", source=f"steps/{name}.json",
                                    recorded=number((rec.get("data") or {}).get("seconds")) if rec else None,
                                    threshold=number(model.profile.get("READY_TIMEOUT")), higher_is_better=False,
                                    node="head", group="readiness"))
    startup = launch_data.get("startup_log") or {}
    for node, s in startup.items() if isinstance(startup, dict) else []:
        if isinstance(s, dict) and s.get("version"):
            model.environment.setdefault(node, {})["vllm_version"] = s.get("version")
    # NCCL version from any archived rank log of the step (printed by NCCL at init)
    for p in sorted(raw_dir.glob("*")) if raw_dir.is_dir() else []:
        if p.is_file() and p.suffix in (".log", ".txt") and p.stat().st_size < 50 << 20:
            version = nccl.parse_nccl_log(read_text(p) or "").version
            if version:
                model.environment.setdefault("cluster", {}).setdefault("nccl_version", version.rstrip(","))
    # each rank's build as 04 read it before the launch (launch/identity.py's row): node facts, compared run to run
    for rec in (sc or {}).get("checks", []) or []:
        ident = (rec.get("data") or {}).get("identity")
        for node, values in ((ident.get("ranks") or {}) if isinstance(ident, dict) else {}).items():
            for field_name, key in IDENTITY_FACTS.items():
                if isinstance(values, dict) and values.get(field_name):
                    model.environment.setdefault(str(node), {})[key] = values[field_name]
    model.launch = {"step": name, "source": relative(run, rendered) if plan else "",
                    "runtime": (plan or {}).get("runtime") or launch_data.get("runtime"),
                    "recipe": (plan or {}).get("recipe"), "fingerprint": fp, "ranks": ranks,
                    "readiness": readiness, "reused": launch_data.get("reused"), "base_url": launch_data.get("base_url"),
                    "head_started_s": number(launch_data.get("head_started_s")),
                    "first_token_latency_s": number(launch_data.get("first_token_latency_s")),
                    "capacity": launch_data.get("capacity") or [],
                    "memory_profile": launch_data.get("memory_profile") or {},
                    "memory_guard": launch_data.get("memory_guard") or {}}
    # the startup memory profile: the minimum MemAvailable each rank reached through the start (the memory guard's
    # samples), against the floor, beside the minimum the start recorded; the highest memory PSI the same way
    guard = launch_data.get("memory_guard") if isinstance(launch_data.get("memory_guard"), dict) else {}
    minimum = guard.get("minimum") if isinstance(guard.get("minimum"), dict) else {}
    floor = number(guard.get("floor_gib"))
    for node, samples in (launch_data.get("memory_profile") or {}).items():
        if samples:
            t_low, low = min(samples, key=lambda s: s[1])
            rec = minimum.get(node) if isinstance(minimum.get(node), dict) else {}
            recorded = number(rec.get("min_mem_available"))
            model.figures.append(ReportFigure(key=f"{name}/memory/{node}/min_available", step=name,
                                        label=f"minimum MemAvailable through the start ({t_low:.0f} s from launch)",
                                        value=low / 2**30, unit="GiB", source=f"steps/{name}.json memory_profile",
                                        recorded=recorded / 2**30 if recorded is not None else None,
                                        threshold=floor or None, higher_is_better=True, node=node, group="memory"))
    for node, samples in (launch_data.get("memory_psi") or {}).items():
        full = [number(s[2]) for s in samples or [] if isinstance(s, list) and len(s) > 2]
        full = [v for v in full if v is not None]
        if full:
            rec = minimum.get(node) if isinstance(minimum.get(node), dict) else {}
            model.figures.append(ReportFigure(key=f"{name}/memory/{node}/max_psi_full", step=name,
                                        label="highest memory PSI full avg10 through the start", value=max(full),
                                        unit="%", source=f"steps/{name}.json memory_psi",
                                        recorded=number(rec.get("max_psi_full")),
                                        threshold=number(guard.get("psi_full_max")) or None,
                                        higher_is_better=False, node=node, group="memory"))
