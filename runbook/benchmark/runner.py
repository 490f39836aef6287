"""Benchmark driver: warm-up, decode cases (N streams behind one barrier), prefill cases, soak.

Honesty rules applied to every case (A.6 / A.9 of the bench anchors):

* prompts of an exact length by the server's ``/tokenize``, unique at token 0 (run tag + nonce);
  warm-up prompts use their own nonce namespace, so they never share a prefix with measured ones;
* ``/reset_prefix_cache`` before each case when the server exposes it (vLLM: ``VLLM_SERVER_DEV_MODE=1``);
* ``/metrics`` snapshot before and after each trial (counter deltas recorded per case);
* the case **FAILS** when any request failed, any ``completion_tokens != max_tokens``,
  any ``cached_tokens > 0``, Δ``vllm:prefix_cache_hits_total > 0``, or ``usage.prompt_tokens``
  differs from the target by more than 1 %;
* it WARNS when ``cached_tokens`` is not reported (start vLLM with ``--enable-prompt-tokens-details``),
  when the server sends no continuous usage (token timing then inexact), when the steady window
  covers < 80 % of the decode span, or when /metrics is not exposed.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
import platform
import resource
import secrets
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .. import __version__, progress
from ..errors import BenchError
from . import metrics as M
from .client import (
    RequestRecord,
    ServerAPI,
    build_payload,
    clock,
    make_stream_client,
    normalize_base_url,
    request_timeout_s,
    stream_request,
)
from ..facts.prom import MetricsSnapshot, delta
from ..api.prompts import CLASSES, PromptBuilder, get_workload, request_extra
from .result import SCHEMA_VERSION, BenchConfig, BenchResult, CaseResult, write_raw


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass(frozen=True)
class _Spec:
    """How one case's requests are made: endpoint, prompt text and the extra body fields."""
    endpoint: str
    workload: str
    extra_json: str = "{}"            # request extras (chat_template_kwargs, tools) as JSON: hashable

    @property
    def extra(self) -> dict[str, Any]:
        return json.loads(self.extra_json)


def _spec(endpoint: str, workload: str, extra: dict[str, Any]) -> _Spec:
    return _Spec(endpoint, workload, json.dumps({**extra, **request_extra(workload)}, sort_keys=True))


@dataclass
class _Run:
    base_url: str
    model: str
    cfg: BenchConfig
    api_key: str | None
    tag: str = field(default_factory=lambda: secrets.token_hex(4))
    records: list[RequestRecord] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    t0: float = field(default_factory=clock)
    reset_ok: bool | None = None
    http: Any = None
    api: ServerAPI | None = None
    builders: dict[_Spec, PromptBuilder] = field(default_factory=dict)
    counted: Any = None            # the cases' requests done (runbook.progress), set after the warm-up

    @property
    def spec(self) -> _Spec:
        """The run's own request shape (decode, prefill, soak, warm-up)."""
        return _spec(self.cfg.endpoint, self.cfg.workload, self.cfg.request_extra())

    def builder(self, spec: _Spec) -> PromptBuilder:
        b = self.builders.get(spec)
        if b is None:
            assert self.api
            b = self.builders[spec] = PromptBuilder(self.api.tokenize, spec.endpoint, workload=spec.workload,
                                                    chat_template_kwargs=spec.extra.get("chat_template_kwargs"))
        return b

    def timeout(self, prompt_tokens: int) -> float:
        return self.cfg.request_timeout_s or request_timeout_s(prompt_tokens)

    async def snap(self, case: str, phase: str) -> MetricsSnapshot:
        assert self.api
        s = await self.api.metrics()
        self.snapshots.append({"case": case, "phase": phase, "t": round(s.t - self.t0, 6), "ok": s.ok,
                               "error": s.error, "counters": s.vllm_subset() if s.ok else {}})
        return s

    # ------------------------------------------------------------------ one wave of N streams
    async def wave(self, case: str, trial: int, n: int, prompt_tokens: int, max_tokens: int,
                   namespace: str, spec: _Spec | None = None) -> list[RequestRecord]:
        spec = spec or self.spec
        builder = self.builder(spec)
        built = []
        for i in range(n):
            nonce = f"{self.tag}-{namespace}-{trial}-{i}"
            built.append(await builder.build(prompt_tokens, nonce, start=trial * n + i))
        recs = [RequestRecord(id=f"{case}/t{trial}/s{i}", case=case, trial=trial, stream=i,
                              nonce=b.nonce, target_prompt_tokens=prompt_tokens, max_tokens=max_tokens)
                for i, b in enumerate(built)]
        bodies = [json.dumps(build_payload(spec.endpoint, self.model, b.prompt, max_tokens,
                                           ignore_eos=self.cfg.ignore_eos, temperature=self.cfg.temperature,
                                           extra=spec.extra)).encode() for b in built]
        go = asyncio.Event()
        ready = 0
        tmo = self.timeout(prompt_tokens)

        async def one(i: int) -> None:
            nonlocal ready
            ready += 1
            await go.wait()
            await stream_request(self.http, spec.endpoint, bodies[i], recs[i], timeout_s=tmo)
            if self.counted is not None:
                self.counted.advance()

        await self.http.warm(n)                    # n idle keep-alive connections before the barrier
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        while ready < n:
            await asyncio.sleep(0)
        go.set()                                   # the barrier: all streams released together
        await asyncio.gather(*tasks)
        self.records.extend(recs)
        return recs

    # ------------------------------------------------------------------ cases
    async def case(self, kind: str, n: int, prompt_tokens: int, max_tokens: int, *,
                   workload: str = "", thinking: str = "") -> CaseResult:
        """One case. ``kind`` decode | prefill, or ``class`` (the class panel: a decode case of one
        workload class with thinking off/on, named ``decode-<class>-think<off|on>-...`` so that every
        decode-shaped reader treats it as one, and kept apart from the run's decode cases by kind)."""
        cfg = self.cfg
        spec = None
        if kind == "class":
            name = f"decode-{workload}-think{thinking}-c{n}-p{prompt_tokens}-d{max_tokens}"
            kw = {k: v for k, v in cfg.request_extra().get("chat_template_kwargs", {}).items()
                  if k not in ("thinking", "enable_thinking")}
            kw[cfg.thinking_key] = thinking == "on"
            spec = _spec("chat", workload, {**cfg.extra_body, "chat_template_kwargs": kw})
        else:
            name = (f"decode-c{n}-p{prompt_tokens}-d{max_tokens}" if kind == "decode"
                    else f"prefill-p{prompt_tokens}")
        res = CaseResult(name=name, kind=kind, concurrency=n, prompt_tokens=prompt_tokens,
                         decode_tokens=max_tokens, repeats=cfg.repeats, workload=workload, thinking=thinking)
        if cfg.reset_prefix_cache:
            assert self.api
            ok = await self.api.reset_prefix_cache()
            self.reset_ok = ok if self.reset_ok is None else (self.reset_ok and ok)
        all_recs: list[RequestRecord] = []
        first_snap = last_snap = None
        cpu0, w0 = _cpu(), clock()
        per_trial: list[dict[str, Any]] = []
        for trial in range(cfg.repeats):
            s0 = await self.snap(name, f"before-t{trial}")
            recs = await self.wave(name, trial, n, prompt_tokens, max_tokens, name, spec)
            s1 = await self.snap(name, f"after-t{trial}")
            first_snap = first_snap or s0
            last_snap = s1
            all_recs += recs
            d = delta(s0, s1)
            tf: dict[str, Any] = {"trial": trial}
            if kind in ("decode", "class"):
                agg = M.aggregate_figures(recs)
                tf.update({k: v for k, v in agg.items() if k != "per_stream_decode_tok_s"})
            else:
                r = recs[0]
                tf["prefill_tok_s"] = M.prefill_tok_s(r)
                if d.get("server_prefill_time_s"):
                    tf["server_prefill_tok_s"] = M.server_prefill_tok_s(
                        sum(x.prompt_tokens or 0 for x in recs), d["server_prefill_time_s"])
                    tf["server_prefill_requests"] = d.get("server_prefill_requests")
            if "mean_queue_time_s" in d:
                tf["mean_queue_time_s"] = d["mean_queue_time_s"]
            tf["ttft_s"] = [M.ttft_s(r) for r in recs]
            per_trial.append(tf)
        wall = clock() - w0
        res.trials = per_trial
        res.server = delta(first_snap, last_snap)
        self._figures(res, all_recs, per_trial, cpu_pct=100.0 * (_cpu() - cpu0) / wall if wall > 0 else None)
        self._rules(res, all_recs)
        return res

    def _figures(self, res: CaseResult, recs: list[RequestRecord], trials: list[dict[str, Any]],
                 cpu_pct: float | None) -> None:
        f: dict[str, Any] = {}

        def put(key: str, vals: list[Any]) -> None:
            s = M.spread(vals)
            if s:
                f[key] = s.to_dict()

        f.update(M.request_spreads(recs, decode=res.kind in ("decode", "class")))
        if res.kind in ("decode", "class"):
            for k in ("aggregate_tok_s", "aggregate_span_tok_s", "aggregate_wall_tok_s",
                      "steady_coverage", "release_skew_s"):
                put(k, [t.get(k) for t in trials])
        else:
            put("prefill_tok_s", [t.get("prefill_tok_s") for t in trials])
            put("server_prefill_tok_s", [t.get("server_prefill_tok_s") for t in trials])
        put("mean_queue_time_s", [t.get("mean_queue_time_s") for t in trials])
        if cpu_pct is not None:
            f["client_cpu_pct"] = M.spread([cpu_pct]).to_dict()  # type: ignore[union-attr]
        for k in ("spec_acceptance_rate", "spec_mean_acceptance_length"):
            if k in res.server:
                f[k] = M.spread([res.server[k]]).to_dict()  # type: ignore[union-attr]
        res.figures = f

    def _rules(self, res: CaseResult, recs: list[RequestRecord]) -> None:
        fails, warns = res.failures, res.warnings
        bad = [r for r in recs if r.error]
        if bad:
            fails.append(f"{len(bad)}/{len(recs)} request(s) failed: {bad[0].error}")
        short = [r for r in recs if not r.error and r.completion_tokens != r.max_tokens]
        if short:
            r = short[0]
            fails.append(f"{len(short)} request(s) with completion_tokens != requested "
                         f"({r.completion_tokens} != {r.max_tokens}, finish_reason={r.finish_reason})")
        cached = [r for r in recs if (r.cached_tokens or 0) > 0]
        if cached:
            fails.append(f"{len(cached)} request(s) hit the prefix cache "
                         f"(cached_tokens={cached[0].cached_tokens})")
        if any(r.cached_tokens is None for r in recs if not r.error):
            warns.append("cached_tokens not reported (vLLM: --enable-prompt-tokens-details)")
        hits = res.server.get("prefix_cache_hit_tokens")
        if hits:
            fails.append(f"server prefix-cache hits during the case: {hits:.0f} tokens")
        far = [r for r in recs if r.prompt_tokens and abs(r.prompt_tokens - r.target_prompt_tokens)
               > 0.01 * r.target_prompt_tokens]
        if far:
            fails.append(f"prompt_tokens {far[0].prompt_tokens} differs > 1% from target {far[0].target_prompt_tokens}")
        elif any(r.prompt_tokens and r.prompt_tokens != r.target_prompt_tokens for r in recs):
            warns.append("prompt_tokens not exactly the target (tokenizer boundary)")
        if any(not r.continuous_usage for r in recs if not r.error):
            warns.append("no continuous usage stats: per-chunk token timing inexact")
        if not res.server.get("available"):
            warns.append("/metrics not available: no server-side figures")
        cov = res.figures.get("steady_coverage", {}).get("min")
        if res.kind in ("decode", "class") and res.concurrency > 1 and cov is not None and cov < self.cfg.steady_min_coverage:
            warns.append(f"steady window covers {cov:.0%} of the decode span (< {self.cfg.steady_min_coverage:.0%})")
        res.status = "FAIL" if fails else ("WARN" if warns else "PASS")

    # ------------------------------------------------------------------ soak
    async def soak(self) -> dict[str, Any]:
        cfg = self.cfg
        levels = list(cfg.soak_concurrency or cfg.concurrency)
        P = cfg.soak_prompt_tokens or cfg.prompt_tokens
        D = cfg.soak_decode_tokens or cfg.decode_tokens
        base = await self.builder(self.spec).build(P, f"{self.tag}-soak-00000-00")
        deadline = clock() + cfg.soak_seconds
        windows: list[dict[str, Any]] = []
        failures: list[str] = []
        recs: list[RequestRecord] = []
        inflight: dict[str, list[float]] = {}      # id -> [last progress time, last cum]
        counter = {"tokens": 0.0, "w_start": 0.0, "w_end": 0.0}
        stop = asyncio.Event()
        seq = 0

        def on_event(r: RequestRecord, t: float) -> None:
            st = inflight.get(r.id)
            c = r.ev_cum[-1]
            if st is None or c is None:
                return
            if c > st[1]:
                if counter["w_start"] <= t <= counter["w_end"]:
                    counter["tokens"] += c - st[1]
                st[0], st[1] = t, c

        async def worker(w: int, until: float) -> None:
            nonlocal seq
            while clock() < until and not stop.is_set():
                seq += 1
                nonce = f"{self.tag}-soak-{seq:05d}-{w:02d}"
                prompt = (base.prompt.replace(base.nonce, nonce, 1) if isinstance(base.prompt, str)
                          else [{**base.prompt[0], "content": nonce}] + base.prompt[1:])
                body = json.dumps(build_payload(cfg.endpoint, self.model, prompt, D, ignore_eos=cfg.ignore_eos,
                                                temperature=cfg.temperature, extra=cfg.request_extra())).encode()
                r = RequestRecord(id=f"soak/{seq}", case="soak", stream=w, nonce=nonce,
                                  target_prompt_tokens=base.tokens, max_tokens=D)
                inflight[r.id] = [clock(), 0]
                await stream_request(self.http, cfg.endpoint, body, r, timeout_s=self.timeout(P),
                                     on_event=on_event, keep_events=False)
                inflight.pop(r.id, None)
                recs.append(r)
                if r.error:
                    failures.append(f"request {r.id} failed: {r.error}")
                    stop.set()
                elif r.completion_tokens != D:
                    failures.append(f"request {r.id}: completion_tokens {r.completion_tokens} != {D}")
                    stop.set()
                elif (r.cached_tokens or 0) > 0:
                    failures.append(f"request {r.id}: cached_tokens {r.cached_tokens} > 0")
                    stop.set()

        async def watchdog() -> None:
            while not stop.is_set():
                now = clock()
                for rid, (t_last, _) in list(inflight.items()):
                    if now - t_last > cfg.soak_stall_s:
                        failures.append(f"stall: {rid} produced no token for {now - t_last:.1f} s "
                                        f"(> {cfg.soak_stall_s} s)")
                        stop.set()
                        return
                try:
                    await asyncio.wait_for(stop.wait(), timeout=min(1.0, cfg.soak_stall_s / 4))
                except asyncio.TimeoutError:
                    pass

        s0 = await self.snap("soak", "before")
        wd = asyncio.create_task(watchdog())
        first_by_c: dict[int, float] = {}
        w = 0
        try:
            while clock() < deadline and not stop.is_set():
                c = levels[w % len(levels)]
                start = clock()
                end = min(start + cfg.soak_window_s, deadline)
                counter.update(tokens=0.0, w_start=start, w_end=end)
                tasks = [asyncio.create_task(worker(i, end)) for i in range(c)]
                grace = self.timeout(P) + 5
                _, pending = await asyncio.wait(tasks, timeout=(end - start) + grace)
                for t in pending:
                    t.cancel()
                    failures.append("a soak request outlived its timeout (bounded wait hit)")
                    stop.set()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
                rate = counter["tokens"] / (end - start) if end > start else 0.0
                win = {"window": w, "concurrency": c, "t_start": round(start - self.t0, 3),
                       "seconds": round(end - start, 3), "tokens": counter["tokens"], "tok_s": rate}
                windows.append(win)
                if (end - start) >= 0.5 * cfg.soak_window_s and not stop.is_set():
                    ref = first_by_c.setdefault(c, rate)
                    win["ratio_to_first"] = rate / ref if ref else None
                    if ref and rate < cfg.soak_min_ratio * ref:
                        failures.append(f"throughput collapse at window {w} (C={c}): {rate:.1f} tok/s "
                                        f"< {cfg.soak_min_ratio:.0%} of first window {ref:.1f}")
                        stop.set()
                w += 1
        finally:
            stop.set()
            await asyncio.gather(wd, return_exceptions=True)
        s1 = await self.snap("soak", "after")
        self.records.extend(recs)
        return {"status": "FAIL" if failures else "PASS", "failures": failures, "levels": levels,
                "seconds": cfg.soak_seconds, "window_s": cfg.soak_window_s, "stall_s": cfg.soak_stall_s,
                "min_ratio": cfg.soak_min_ratio, "windows": windows, "windows_n": len(windows),
                "requests": len(recs), "server": delta(s0, s1)}


def _environment(info: dict[str, Any], api_key_env: str) -> dict[str, Any]:
    try:
        aff = sorted(os.sched_getaffinity(0))
    except AttributeError:
        aff = []
    return {"client": {"host": socket.gethostname(), "python": platform.python_version(),
                       "platform": platform.platform(), "httpx": httpx.__version__,
                       "runbook": __version__, "cpus": os.cpu_count(), "affinity": aff,
                       "clock": "time.perf_counter (CLOCK_MONOTONIC)"},
            "server": info, "api_key_env": api_key_env or None}


async def arun_benchmark(base_url: str, model: str, config: BenchConfig | None = None,
                         out_dir: str | os.PathLike[str] | None = None, *,
                         api_key: str | None = None) -> BenchResult:
    """Async form of :func:`run_benchmark`."""
    cfg = config or BenchConfig()
    if api_key is None and cfg.api_key_env:
        api_key = os.environ.get(cfg.api_key_env)
        if not api_key:
            raise BenchError("API key environment variable is empty", observed=f"${cfg.api_key_env} unset",
                             expected="the server's API key", fix=f"export {cfg.api_key_env}=...")
    if cfg.endpoint not in ("completions", "chat"):
        raise BenchError("unknown endpoint", observed=cfg.endpoint, expected="completions | chat")
    get_workload(cfg.workload)
    bad = [c for c in cfg.classes if c not in CLASSES] + [t for t in cfg.class_thinking if t not in ("off", "on")]
    if bad:
        raise BenchError("unknown class panel entry", observed=f"classes={list(cfg.classes)}, "
                         f"class_thinking={list(cfg.class_thinking)}",
                         expected=f"classes from {', '.join(CLASSES)}; class_thinking from off, on",
                         fix=f"drop {bad} from BenchConfig.classes / class_thinking")
    if cfg.chat_template_kwargs and cfg.endpoint != "chat":
        raise BenchError("chat_template_kwargs need the chat endpoint",
                         observed=f"endpoint={cfg.endpoint}, chat_template_kwargs={cfg.chat_template_kwargs}",
                         expected="endpoint='chat'", fix="set BenchConfig.endpoint='chat' or drop chat_template_kwargs")
    run = _Run(normalize_base_url(base_url), model, cfg, api_key)
    started = _now()
    import gc
    gc.collect()
    gc.freeze()                                  # fewer GC pauses inside timed windows (as vLLM's bench)
    run.api = ServerAPI(run.base_url, model, api_key)
    try:
        run.http = make_stream_client(run.base_url, api_key)
        info = await run.api.info()
        env_guard = await _guard(run.api, info, model, cfg)
        try:
            await run.api.tokenize(prompt="probe")
        except Exception as e:
            raise BenchError("server /tokenize is not usable; exact-length prompts cannot be built",
                             observed=str(e)[:200], expected="POST /tokenize -> {count}",
                             fix="use a vLLM OpenAI server (it exposes /tokenize)") from e
        # warm-up: disjoint nonce namespace, opens max(C) keep-alive connections
        nw = cfg.warmup_requests or max(cfg.concurrency or (1,))
        warm = await run.wave("warmup", 0, nw, cfg.warmup_prompt_tokens, cfg.warmup_decode_tokens, "warmup")
        warm_err = [r.error for r in warm if r.error]
        if warm_err:
            raise BenchError("warm-up requests failed", observed=warm_err[0][:300],
                             expected="HTTP 200 streams with usage", fix="check the server log")
        cases: list[CaseResult] = []
        run.counted = progress.count("bench requests", case_requests(cfg), "requests")
        for c in cfg.concurrency:
            cases.append(await run.case("decode", c, cfg.prompt_tokens, cfg.decode_tokens))
        for p in cfg.prefill_tokens:
            cases.append(await run.case("prefill", 1, p, 1))
        for wl in cfg.classes:                 # the class panel: each class and thinking on its own
            for th in cfg.class_thinking:
                cases.append(await run.case("class", cfg.class_concurrency, cfg.class_prompt_tokens or
                                            cfg.prompt_tokens, cfg.class_decode_tokens or cfg.decode_tokens,
                                            workload=wl, thinking=th))
        run.counted.close()
        soak = await run.soak() if cfg.soak_seconds > 0 else None
        await run.http.close()
    finally:
        run.api.close()
        if run.counted is not None:
            run.counted.close()
    gc.unfreeze()
    env = _environment(info, cfg.api_key_env)
    env["reset_prefix_cache"] = run.reset_ok
    env["guard"] = env_guard
    env["run_tag"] = run.tag
    env["t0_perf_counter"] = run.t0     # raw record times are relative to this (CLOCK_MONOTONIC)
    _cross_checks(cases)
    statuses = [c.status for c in cases] + ([soak["status"]] if soak else [])
    result = BenchResult(schema_version=SCHEMA_VERSION, run_id=run.tag, base_url=run.base_url, model=model,
                         config=cfg.to_dict(), environment=env, cases=cases, soak=soak, started=started,
                         finished=_now(), status="FAIL" if "FAIL" in statuses else "PASS")
    if out_dir is not None:
        out = Path(out_dir)
        write_raw(out, run.records, run.t0, run.snapshots, keep_chunks=cfg.keep_chunks)
        result.save(out / "result.json")
    return result


def case_requests(cfg: BenchConfig) -> int:
    """The requests of the cases (each case's waves: repeats x concurrency; no warm-up, no soak): the total the
    bench counts done."""
    decode = sum(cfg.concurrency) + len(cfg.prefill_tokens)
    panel = len(cfg.classes) * len(cfg.class_thinking) * cfg.class_concurrency
    return cfg.repeats * (decode + panel)


def served_models(info: dict[str, Any]) -> list[str] | None:
    """Model ids listed by ``/v1/models`` (None when the server did not answer it)."""
    models = info.get("models")
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return None
    return [str(m.get("id")) for m in models["data"] if isinstance(m, dict)]


async def _guard(api: ServerAPI, info: dict[str, Any], model: str, cfg: BenchConfig,
                 resample: int = 4, pause_s: float = 0.5) -> dict[str, Any]:
    """Refuse to measure the wrong model or a server other clients are using; returns what was seen.

    Busy = ``vllm:num_requests_running`` or ``vllm:num_requests_waiting`` > 0 (summed over models
    and engines). A request just finishing can still count: re-sampled ``resample`` times,
    ``pause_s`` apart, before refusing."""
    ids = served_models(info)
    seen: dict[str, Any] = {"served_models": ids, "requested_model": model}
    if ids is not None and model not in ids:
        if not cfg.allow_other_model:
            raise BenchError("the server does not serve the requested model", observed=f"/v1/models lists {ids}",
                             expected=f"model id {model!r}",
                             fix="pass the served id as the model (or point base_url at the right server); "
                                 "to measure anyway (an alias the listing omits): BenchConfig(allow_other_model=True) "
                                 "/ --allow-other-model")
        seen["model_mismatch_allowed"] = True
    busy: tuple[float, float] | None = None
    for i in range(resample + 1):
        snap = await api.metrics()
        if not snap.ok:
            seen["busy_check"] = f"/metrics not available ({snap.error}): not checked"
            return seen
        running = snap.total("vllm:num_requests_running")
        waiting = snap.total("vllm:num_requests_waiting")
        if running is None and waiting is None:
            seen["busy_check"] = "no vllm:num_requests_running/waiting in /metrics: not checked"
            return seen
        busy = (running or 0.0, waiting or 0.0)
        if busy == (0.0, 0.0):
            seen["busy_check"] = "idle"
            return seen
        if i < resample:
            await asyncio.sleep(pause_s)
    assert busy is not None
    seen["busy_check"] = f"busy: {busy[0]:.0f} running, {busy[1]:.0f} waiting"
    if not cfg.allow_busy:
        raise BenchError("the server is busy with other requests; figures would include their load",
                         observed=f"/metrics: {busy[0]:.0f} running, {busy[1]:.0f} waiting "
                                  f"(sampled {resample + 1} times over {resample * pause_s:.1f} s)",
                         expected="0 running, 0 waiting before the benchmark",
                         fix="stop the other clients or wait until the server is idle; to measure anyway "
                             "(figures then include their load): BenchConfig(allow_busy=True) / --allow-busy")
    return seen


def _cross_checks(cases: list[CaseResult]) -> None:
    """A.9 validation: aggregate at C streams should not exceed C x the single-stream rate."""
    single = next((c.median("decode_tok_s") for c in cases if c.kind == "decode" and c.concurrency == 1), None)
    if not single:
        return
    for c in cases:
        agg = c.median("aggregate_tok_s")
        if c.kind == "decode" and c.concurrency > 1 and agg and agg > 1.05 * c.concurrency * single:
            c.warnings.append(f"aggregate {agg:.1f} > {c.concurrency} x single-stream {single:.1f}")
            if c.status == "PASS":
                c.status = "WARN"


def run_benchmark(base_url: str, model: str, config: BenchConfig | None = None,
                  out_dir: str | os.PathLike[str] | None = None, *, api_key: str | None = None) -> BenchResult:
    """Run the benchmark against an OpenAI-compatible server and return a ``BenchResult``.

    Writes ``result.json``, ``requests.jsonl``, ``chunks.jsonl`` and ``metrics.jsonl`` under ``out_dir``
    when given. Safe to call from a notebook (a running event loop): it then runs on its own loop in
    a worker thread.
    """
    coro = arun_benchmark(base_url, model, config, out_dir, api_key=api_key)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["r"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            box["e"] = e

    th = threading.Thread(target=target, name="bench")
    th.start()
    th.join()
    if "e" in box:
        raise box["e"]
    return box["r"]
