"""Step 05 (smoke): is the server that 04 launched really serving the recipe's model, correctly?

    client = runbook.api.server_info.connect(profile, run_dir, dry_run=dry_run, base_url=base_url, model=model)
    rec = runbook.api.server_info.Archive("raw/05_smoke")
    rows = runbook.smoke.cases.run_smoke(client, profile, rec, dry_run=dry_run, concurrency=0, long_context=True)
    # the step's run() adds rows, writes rec.files through step.archive and merges rec.data

One row per case; every request/response pair is kept in ``rec`` for ``raw/05_smoke/<case>.json`` (API key
never stored, secrets masked when the step writes it) and named in the row's evidence.

Cases (names are the check names):
- ``server.reachable`` GET /health answers at all (else nothing else runs; one clear failure);
- ``health``, ``version`` (recorded), ``models.served_name``, ``models.max_model_len`` (== configured),
  ``metrics`` (Prometheus text with ``vllm:`` series);
- ``chat.response``: the recipe's probe at temperature 0 with thinking off (the recipe's
  ``chat_template_kwargs``): HTTP 200, non-empty content, a valid finish_reason, usage consistent;
- ``chat.answer``: the probe's answer (17×19 → 323) -- real weights only; N/A on the lab;
- ``chat.stream``: same request streamed with ``stream_options.include_usage``: usage in the last chunk,
  counts (and text) equal to the non-streamed answer;
- ``concurrency``: N parallel requests all succeed (recipe B's smoke: 6; lab: MAX_NUM_SEQS);
- ``context.near_max`` / ``context.past_max``: an exact-length prompt (built with POST /tokenize) of
  max_model_len - 1 tokens is accepted; one of max_model_len + 1 is refused with HTTP 400 quickly;
- ``context.needle.<L>``: needle in a haystack at growing exact lengths, TTFT per length (answer judged
  on real weights only);
- ``spec_decode.acceptance``: draft/accepted token counters from /metrics before and after a
  decode-heavy request (N/A when SPEC_METHOD=none);
- ``auth.api_key``: with VLLM_API_KEY set, a request without it gets 401 and with it 200 (N/A without a key).
"""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from ..api.prompts import WORDS, BuiltPrompt, build_exact_prompt
from ..facts.prom import parse_prometheus
from ..api.guards import check_refused, guard, precheck, reachable
from ..answers.recipes import LAB_REASON, RECIPES, RecipeSpec, answer_matches, recipe_spec
from ..api.server_info import (
    ApiClient,
    Archive,
    Exchange,
    archive,
    content_of,
    finish_of,
    first_choice,
    reasoning_of,
    usage_problems,
)

__all__ = [
    "RECIPES",
    "BuiltPrompt",
    "RecipeSpec",
    "api_key_check",
    "exact_prompt",
    "chat_checks",
    "check_answer",
    "check_chat_response",
    "check_refused",
    "check_stream",
    "concurrency_check",
    "context_lengths_for",
    "context_limit_checks",
    "endpoint_checks",
    "engram_prefill_check",
    "expected_engram_prefill",
    "guard",
    "needle_checks",
    "parse_metrics",
    "precheck",
    "reachable",
    "recipe_spec",
    "run_smoke",
    "spec_decode_check",
]

FINISH_REASONS = ("stop", "length")


# ------------------------------------------------------------------------------------------------
# recipes
# ------------------------------------------------------------------------------------------------

def context_lengths_for(profile, spec: RecipeSpec | None = None, max_model_len: int = 0,
                        reserve: int = 64) -> list[int]:
    """Needle lengths: the recipe's (capped to the context minus ``reserve``), or, on the lab,
    1/8, 1/4, 1/2 of the context and the context minus ``reserve``."""
    spec = spec or recipe_spec(profile)
    mml = max_model_len or profile.max_model_len
    cap = mml - reserve
    if spec.hardware:
        lengths = [min(x, cap) for x in spec.context_lengths]
    else:
        lengths = [mml // 8, mml // 4, mml // 2, cap]
    return sorted({x for x in lengths if x > 0})


# ------------------------------------------------------------------------------------------------
# pure pass rules (unit-tested against recorded responses)
# ------------------------------------------------------------------------------------------------

def check_chat_response(name: str, ex: Exchange, *, max_tokens: int | None = None,
                        prompt_tokens: int | None = None, finish: tuple[str, ...] = FINISH_REASONS,
                        evidence: list[str] = (), request: str = "") -> Check:
    """HTTP 200, a choice with non-empty content, a valid finish_reason, usage consistent."""
    problems: list[str] = []
    if not ex.ok:
        problems.append(f"{ex.summary()}: {ex.error_message()[:200]}")
    else:
        body = ex.json
        if not first_choice(body):
            problems.append("no choices in the response")
        if not content_of(body).strip():
            problems.append("empty content" + (" (reasoning only)" if reasoning_of(body) else ""))
        if finish_of(body) not in finish:
            problems.append(f"finish_reason={finish_of(body)!r} not in {list(finish)}")
        problems += usage_problems(body.get("usage"), max_tokens=max_tokens, prompt_tokens=prompt_tokens)
    usage = ex.json.get("usage") if isinstance(ex.json.get("usage"), dict) else {}
    observed = "; ".join(problems) if problems else (
        f"{ex.summary()}, finish={finish_of(ex.json)}, usage {usage.get('prompt_tokens')}+"
        f"{usage.get('completion_tokens')}={usage.get('total_tokens')}, content {content_of(ex.json)[:60]!r}")
    return check(name, not problems, node="head", observed=observed,
                 expected=f"200, non-empty content, finish_reason in {list(finish)}, usage consistent"
                          + (f", completion <= {max_tokens}" if max_tokens else ""),
                 fix="see the raw request/response in the evidence; check the server log (04_launch)",
                 evidence=evidence, data={"request": request, "latency_s": round(ex.latency_s, 4),
                                          "usage": usage, "finish_reason": finish_of(ex.json)})


def check_answer(name: str, ex: Exchange, expected: str, *, hardware: bool, reason: str = LAB_REASON,
                 evidence: list[str] = (), request: str = "", require_stop: bool = True) -> Check:
    """The answer on real weights contains ``expected`` (and finished with ``stop``); N/A on the lab."""
    if not hardware:
        c = not_applicable(name, f"{reason} (answer was {content_of(ex.json)[:40]!r})", node="head",
                           expected=f"contains {expected!r} on real weights")
        c.evidence, c.data = list(evidence), {"request": request, "latency_s": round(ex.latency_s, 4)}
        return c
    text = content_of(ex.json)
    ok = ex.ok and answer_matches(text, expected) and (not require_stop or finish_of(ex.json) == "stop")
    observed = (f"{ex.summary()}: {ex.error_message()[:200]}" if not ex.ok else
                f"content {text[:120]!r}, finish={finish_of(ex.json)}")
    return check(name, ok, node="head", observed=observed,
                 expected=f"contains {expected!r}" + (", finish_reason=stop" if require_stop else ""),
                 fix="wrong answer on real weights: check weights revision/parity (03), quantization and the "
                     "chat template (thinking must be off via chat_template_kwargs)",
                 evidence=evidence, data={"request": request, "latency_s": round(ex.latency_s, 4),
                                          "content": text[:500]})


def check_stream(name: str, streamed: Exchange, reference: Exchange, *, strict_text: bool,
                 evidence: list[str] = (), request: str = "", max_tokens: int | None = None) -> Check:
    """Streamed with include_usage: [DONE] seen, usage in the last chunk and consistent, counts equal to
    the non-streamed reference (same seed, temperature 0). ``strict_text``: completion count and text
    must match too (else a mismatch there is only a WARN)."""
    hard: list[str] = []
    soft: list[str] = []
    body = streamed.json
    if streamed.status != 200 or streamed.error:
        hard.append(f"{streamed.summary()}: {streamed.error_message()[:200]}")
    else:
        usage = body.get("usage")
        if not usage:
            hard.append("no usage chunk in the stream (stream_options.include_usage ignored)")
        else:
            if not body.get("usage_in_last_chunk"):
                hard.append("usage not in the last chunk")
            hard += usage_problems(usage, max_tokens=max_tokens)
            ref = reference.json.get("usage") or {}
            if ref and usage.get("prompt_tokens") != ref.get("prompt_tokens"):
                hard.append(f"prompt_tokens {usage.get('prompt_tokens')} != non-streamed {ref.get('prompt_tokens')}")
            diff = []
            if ref and usage.get("completion_tokens") != ref.get("completion_tokens"):
                diff.append(f"completion_tokens {usage.get('completion_tokens')} != non-streamed "
                            f"{ref.get('completion_tokens')}")
            if content_of(body) != content_of(reference.json):
                diff.append("text differs from the non-streamed answer")
            if finish_of(body) != finish_of(reference.json):
                diff.append(f"finish_reason {finish_of(body)} != {finish_of(reference.json)}")
            (hard if strict_text else soft).extend(diff)
        if streamed.ttft_s is None:
            hard.append("no content delta in the stream")
    usage = body.get("usage") or {}
    status = Status.FAIL if hard else (Status.WARN if soft else Status.PASS)
    observed = "; ".join(hard + soft) or (
        f"{body.get('n_events')} chunks, TTFT {streamed.ttft_s:.3f} s, usage "
        f"{usage.get('prompt_tokens')}+{usage.get('completion_tokens')} in the last chunk, equal to non-streamed")
    return Check(name, node="head", status=status, observed=observed,
                 expected="usage in the last chunk; prompt/completion tokens and text equal to the non-streamed "
                          "answer" + ("" if strict_text else " (text/count mismatch = WARN on GPUs)"),
                 fix="" if status is Status.PASS else "check that the server honours stream_options.include_usage; "
                     "count tokens from usage, never from chunks (DSpark packs several tokens per chunk)",
                 evidence=list(evidence), data={"request": request, "ttft_s": streamed.ttft_s,
                                                "latency_s": round(streamed.latency_s, 4), "usage": usage,
                                                "n_events": body.get("n_events")})


# ------------------------------------------------------------------------------------------------
# exact-length prompts
# ------------------------------------------------------------------------------------------------

def exact_prompt(client: ApiClient, target: int, *, needle: str = "", depth: float = 0.5,
                 question: str = "Reply with OK.", chat_template_kwargs: dict | None = None,
                 seed: int = 0) -> BuiltPrompt:
    """Chat messages of exactly ``target`` tokens as the server counts them (``/tokenize`` with the request's
    chat_template_kwargs), built by the one exact-length builder (:func:`runbook.api.prompts.build_exact_prompt`);
    a header unique to ``seed`` keeps the prefix cold."""
    nonce = f"[smoke {uuid.UUID(int=random.Random(seed).getrandbits(128)).hex[:12]}]"
    return build_exact_prompt(
        lambda msgs: client.count_chat_tokens(msgs, chat_template_kwargs=chat_template_kwargs,
                                              timeout=120 + target / 20_000),
        target, nonce, endpoint="chat", workload="filler", seed=seed,
        instruction="Read the text, then answer the question at the end.\n", tail=f"\n\nQuestion: {question}",
        needle=needle, depth=depth)


# ------------------------------------------------------------------------------------------------
# metrics
# ------------------------------------------------------------------------------------------------


SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text (parsed by the project's one parser, ``facts.prom``) -> {name: sum over label sets};
    per-position spec counters are kept as ``name{position=N}``."""
    out: dict[str, float] = {}
    for (name, labels), value in parse_prometheus(text or "").items():
        if name == SPEC_PER_POS:
            name = f"{name}{{position={dict(labels).get('position', '?')}}}"
        out[name] = out.get(name, 0.0) + value
    return out


# ------------------------------------------------------------------------------------------------
# the cases
# ------------------------------------------------------------------------------------------------

@dataclass
class _Ctx:
    rec: Archive
    client: ApiClient
    spec: RecipeSpec
    max_model_len: int

    def archive(self, name: str, exchanges, **extra: Any) -> list[str]:
        return archive(self.rec, name, exchanges, **extra)


def _ctx(client: ApiClient, profile, rec: Archive) -> _Ctx:
    spec = recipe_spec(profile)
    mml = client.server.max_model_len or profile.max_model_len
    return _Ctx(rec, client, spec, mml)


def endpoint_checks(client: ApiClient, profile, rec: Archive) -> list[Check]:
    c = _ctx(client, profile, rec)
    out: list[Check] = []
    h = client.get("/health", timeout=30)
    out.append(check("health", h.status == 200, node="head", observed=h.summary(), expected="HTTP 200",
                     fix="the engine is not healthy: read the head log (04_launch)",
                     evidence=c.archive("health", h), data={"request": "GET /health", "latency_s": round(h.latency_s, 4)}))
    v = client.get("/version", timeout=30)
    version = v.json.get("version", "")
    rec.data["server_version"] = version
    out.append(check("version", v.ok and bool(version), node="head",
                     observed=f"{v.summary()}, version {version!r}", expected="HTTP 200 with a version",
                     fix="GET /version must answer (vLLM OpenAI server)", evidence=c.archive("version", v),
                     data={"request": "GET /version", "version": version, "latency_s": round(v.latency_s, 4)}))
    m = client.get("/v1/models", timeout=30)
    ev = c.archive("models", m)
    models = [x for x in (m.json.get("data") or []) if isinstance(x, dict)]
    ids = [x.get("id") for x in models]
    mine = next((x for x in models if x.get("id") == client.model), None)
    out.append(check("models.served_name", m.ok and mine is not None, node="head",
                     observed=f"{m.summary()}, served {ids}" + ("" if m.ok else f": {m.error_message()[:120]}"),
                     expected=f"{client.model!r} listed",
                     fix="SERVED_MODEL_NAME and --served-model-name must agree (04_launch); a 401 means the "
                         "server has an API key: export VLLM_API_KEY", evidence=ev, data={"request": "GET /v1/models", "ids": ids,
                                                  "latency_s": round(m.latency_s, 4)}))
    got = (mine or {}).get("max_model_len")
    out.append(check("models.max_model_len", got == c.max_model_len, node="head",
                     observed=f"max_model_len={got}", expected=f"{c.max_model_len} (as configured)",
                     fix="the server runs with a different --max-model-len than the profile's MAX_MODEL_LEN",
                     evidence=ev, data={"request": "GET /v1/models", "max_model_len": got}))
    rec.data["served_max_model_len"] = got
    mt = client.get("/metrics", timeout=30)
    text = mt.body if isinstance(mt.body, str) else ""
    series = parse_metrics(text)
    n_vllm = sum(1 for k in series if k.startswith("vllm:"))
    mt_arch = Exchange(mt.method, mt.path, None, mt.status, f"<{len(text)} chars, {n_vllm} vllm: series>",
                       mt.latency_s, mt.error, mt.auth)
    out.append(check("metrics", mt.status == 200 and n_vllm > 0, node="head",
                     observed=f"{mt.summary()}, {n_vllm} vllm: series", expected="HTTP 200 with vllm: series",
                     fix="GET /metrics must serve Prometheus text (needed for the spec-decode and bench checks)",
                     evidence=[rec.raw("metrics.txt", text)] + c.archive("metrics", mt_arch),
                     data={"request": "GET /metrics", "vllm_series": n_vllm, "latency_s": round(mt.latency_s, 4)}))
    return out


def _probe_payload(spec: RecipeSpec, seed: int = 1234) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": spec.probe}], "max_tokens": spec.probe_max_tokens,
            "temperature": 0, "seed": seed, "chat_template_kwargs": dict(spec.thinking_off)}


def chat_checks(client: ApiClient, profile, rec: Archive) -> list[Check]:
    """chat.response, chat.answer, chat.stream."""
    c = _ctx(client, profile, rec)
    payload = _probe_payload(c.spec)
    req = (f"POST /v1/chat/completions {c.spec.probe!r} temperature=0 seed=1234 "
           f"max_tokens={c.spec.probe_max_tokens} chat_template_kwargs={c.spec.thinking_off}")
    ex = client.chat(payload)
    ev = c.archive("chat.probe", ex)
    out = [check_chat_response("chat.response", ex, max_tokens=c.spec.probe_max_tokens, evidence=ev, request=req),
           check_answer("chat.answer", ex, c.spec.expected, hardware=c.spec.hardware, evidence=ev, request=req)]
    st = client.stream_chat(payload)
    ev2 = c.archive("chat.stream", [st, ex])
    out.append(check_stream("chat.stream", st, ex, strict_text=not c.spec.hardware, evidence=ev2,
                            request=req + " stream=true include_usage", max_tokens=c.spec.probe_max_tokens))
    rec.data["chat"] = {"latency_s": round(ex.latency_s, 4), "stream_ttft_s": st.ttft_s,
                         "usage": ex.json.get("usage")}
    return out


def concurrency_check(client: ApiClient, profile, rec: Archive, n: int = 0) -> Check:
    c = _ctx(client, profile, rec)
    n = n or c.spec.concurrency or profile.max_num_seqs
    mt = c.spec.reply_max_tokens

    def one(i: int) -> Exchange:
        return client.chat({"messages": [{"role": "user", "content": f"Reply with OK and the number {i}."}],
                            "temperature": 0, "max_tokens": mt,
                            "chat_template_kwargs": dict(c.spec.thinking_off)}, timeout=180)

    t0 = time.perf_counter()
    exs = client.parallel(one, n)
    wall = time.perf_counter() - t0
    bad = []
    for i, ex in enumerate(exs):
        row = check_chat_response("x", ex, max_tokens=mt)
        if row.failed:
            bad.append(f"#{i}: {row.observed}")
    lat = [round(e.latency_s, 3) for e in exs]
    return check("concurrency", not bad, node="head",
                 observed="; ".join(bad)[:400] if bad else f"{n}/{n} OK in {wall:.2f} s (latency max {max(lat):.2f} s)",
                 expected=f"{n} parallel requests all HTTP 200 with a choice and usage",
                 fix="requests failed under concurrency: check MAX_NUM_SEQS, KV cache size and the server log",
                 evidence=c.archive("concurrency", exs), data={"request": f"{n} x chat 'Reply with OK and the number i.' "
                                                                          f"temperature=0 max_tokens={mt}", "n": n, "wall_s": round(wall, 3), "latency_s": lat,
                                                               "max_tokens": mt})


def context_limit_checks(client: ApiClient, profile, rec: Archive) -> list[Check]:
    """context.near_max (max_model_len - 1 prompt tokens, max_tokens 1: accepted with exactly that
    usage.prompt_tokens) and context.past_max (max_model_len + 1 prompt tokens: HTTP 400, quickly)."""
    c = _ctx(client, profile, rec)
    mml = c.max_model_len
    kw = dict(c.spec.thinking_off)
    out: list[Check] = []
    near = exact_prompt(client, mml - 1, chat_template_kwargs=kw, seed=11)
    req = f"chat, prompt {near.tokens} tokens (/tokenize), max_tokens=1"
    ex = client.chat({"messages": near.prompt, "max_tokens": 1, "temperature": 0, "chat_template_kwargs": kw},
                     timeout=300 + mml / 300)
    ev = c.archive("context.near_max", ex, built={"target": near.target, "tokens": near.tokens,
                                                  "tokenize_calls": near.tokenize_calls})
    problems = []
    if not near.exact:
        problems.append(f"built {near.tokens} tokens, not {near.target}")
    if not ex.ok:
        problems.append(f"{ex.summary()}: {ex.error_message()[:200]}")
    else:
        problems += usage_problems(ex.json.get("usage"), max_tokens=1, prompt_tokens=near.tokens)
    out.append(check("context.near_max", not problems, node="head",
                     observed="; ".join(problems) or f"{ex.summary()}, prompt_tokens={near.tokens} accepted",
                     expected=f"a {mml - 1}-token prompt (max_model_len - 1) accepted, usage.prompt_tokens equal",
                     fix="the server cannot take a prompt at its configured context: KV cache too small for "
                         "MAX_MODEL_LEN, or a different --max-model-len", evidence=ev,
                     data={"request": req, "latency_s": round(ex.latency_s, 3), "prompt_tokens": near.tokens}))
    past = exact_prompt(client, mml + 1, chat_template_kwargs=kw, seed=12)
    ex2 = client.chat({"messages": past.prompt, "max_tokens": 1, "temperature": 0, "chat_template_kwargs": kw},
                      timeout=120)
    ev2 = c.archive("context.past_max", ex2, built={"target": past.target, "tokens": past.tokens})
    row = check_refused("context.past_max", ex2, evidence=ev2,
                        request=f"chat, prompt {past.tokens} tokens (max_model_len + 1), max_tokens=1",
                        expected_text="maximum context length")
    if ex2.status == 400 and past.tokens <= mml:
        row.status, row.observed = Status.FAIL, f"built only {past.tokens} tokens (<= {mml}): " + row.observed
    out.append(row)
    return out


def needle_checks(client: ApiClient, profile, rec: Archive, lengths: list[int] | None = None) -> list[Check]:
    """Needle in a haystack at growing exact lengths; TTFT per length (streamed). On the lab only the
    request path and lengths are checked; on real weights the passphrase must come back."""
    c = _ctx(client, profile, rec)
    lengths = list(lengths or context_lengths_for(profile, c.spec, c.max_model_len))
    kw = dict(c.spec.thinking_off)
    mt = 24 if c.spec.hardware else 8
    out: list[Check] = []
    ttft: dict[str, Any] = {}
    for i, L in enumerate(lengths):
        name = f"context.needle.{L}"

        def case(L=L, i=i, name=name) -> Check:
            rng = random.Random(1000 + i)
            code = f"{rng.choice(WORDS)}-{rng.randint(1000, 9999)}"
            needle = f"The secret passphrase is {code}."
            built = exact_prompt(client, L, needle=needle, depth=(0.25, 0.5, 0.75)[i % 3],
                                 question="What is the secret passphrase? Reply with the passphrase only.",
                                 chat_template_kwargs=kw, seed=100 + i)
            ex = client.stream_chat({"messages": built.prompt, "max_tokens": mt, "temperature": 0,
                                     "chat_template_kwargs": kw}, timeout=300 + L / 300)
            ev = c.archive(name, ex, built={"target": L, "tokens": built.tokens, "needle": needle})
            usage = ex.json.get("usage") or {}
            problems = []
            if not built.exact:
                problems.append(f"built {built.tokens} tokens, not {L}")
            if not ex.ok:
                problems.append(f"{ex.summary()}: {ex.error_message()[:200]}")
            elif usage.get("prompt_tokens") != built.tokens:
                problems.append(f"usage.prompt_tokens={usage.get('prompt_tokens')} != {built.tokens}")
            answer = content_of(ex.json)
            judged = c.spec.hardware
            if judged and ex.ok and code not in answer:
                problems.append(f"passphrase {code!r} not in the answer {answer[:80]!r}")
            ttft[str(L)] = ex.ttft_s
            prefill = (built.tokens / ex.ttft_s) if ex.ttft_s else None
            observed = "; ".join(problems) or (
                f"{ex.summary()}, prompt_tokens={usage.get('prompt_tokens')}, TTFT {ex.ttft_s:.3f} s"
                + (f", answer {answer[:40]!r}" if judged else " (answer not judged on the lab)"))
            return check(name, not problems, node="head", observed=observed,
                         expected=f"HTTP 200, usage.prompt_tokens = {L}" + (
                             ", answer contains the passphrase" if judged else
                             "; lab: request path and length only (random weights)"),
                         fix="long prompts fail or lose the needle: check KV cache / context settings and "
                             "the long-prefill knobs", evidence=ev,
                         data={"request": f"stream chat, {built.tokens}-token prompt, needle at "
                                          f"{(0.25, 0.5, 0.75)[i % 3]}", "ttft_s": ex.ttft_s,
                               "latency_s": round(ex.latency_s, 3), "prompt_tokens": usage.get("prompt_tokens"),
                               "prefill_tok_s": round(prefill, 1) if prefill else None, "judged": judged})
        out += guard(name, case)
    rec.data["ttft_by_length"] = ttft
    return out


# Recipe A's short-prompt prefill on two GB10s WITH packed Engram shards (and DSV41_IO_THREADS=96): prompt tokens ->
# tok/s (seed A README; /work/shared/reference/seeds-repos.md "Short-prompt prefill", run-to-run spread ~10 %). The
# README puts the packed shards at "25-50 % of prefill": a rank serving Engram from the checkpoint is that much slower.
ENGRAM_PREFILL_TOK_S = ((10_000, 1041.0), (28_000, 1008.0), (57_000, 965.0))
ENGRAM_PREFILL_SPAN = (8_192, 65_536)       # needles compared (the figures' range; longer prompts prefill slower)
ENGRAM_FALLBACK_RATIO = 0.75                # below: as slow as the fallback's lower bound (25 % slower)
ENGRAM_PREFILL_ROW = "context.engram_prefill"


def expected_engram_prefill(tokens: int) -> float:
    """The published prefill with packed Engram at ``tokens`` (linear between the published points, clamped)."""
    pts = ENGRAM_PREFILL_TOK_S
    if tokens <= pts[0][0]:
        return pts[0][1]
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if tokens <= t1:
            return v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)
    return pts[-1][1]


def engram_prefill_check(profile, needles: list[Check]) -> Check:
    """The needles' measured prefill (prompt tokens / TTFT) against recipe A's with attached Engram: a WARN when
    far below it, the signature of ranks serving Engram from the checkpoint (04's ``engram attached`` rows say
    which). Only recipe A on hardware has a published figure to compare with."""
    name = ENGRAM_PREFILL_ROW
    expected = (f"prefill >= {ENGRAM_FALLBACK_RATIO:.0%} of recipe A's with packed Engram "
                f"({', '.join(f'{v:,.0f} tok/s at {t // 1000}k' for t, v in ENGRAM_PREFILL_TOK_S)})")
    if not profile.engram:
        return not_applicable(name, "ENGRAM=0: no Engram tables served", node="head")
    if profile.recipe != "exl3-v41" or not recipe_spec(profile).hardware:
        return not_applicable(name, f"recipe {profile.recipe}{' (lab)' if profile.lab else ''}: no published "
                                    "prefill with packed Engram to compare with", node="head", expected=expected)
    lo, hi = ENGRAM_PREFILL_SPAN
    points = [(int(c.data["prompt_tokens"]), float(c.data["prefill_tok_s"])) for c in needles
              if c.status is Status.PASS and c.data.get("prefill_tok_s") and c.data.get("prompt_tokens")
              and lo <= int(c.data["prompt_tokens"]) <= hi]
    if not points:
        return not_applicable(name, f"no passing needle of {lo:,}-{hi:,} tokens with a prefill figure",
                              node="head", expected=expected)
    ratios = [(v / expected_engram_prefill(t), t, v) for t, v in points]
    worst = min(ratios)
    observed = "; ".join(f"{v:,.0f} tok/s at {t:,} tokens = {r:.0%} of {expected_engram_prefill(t):,.0f}"
                         for r, t, v in ratios)
    return check(name, worst[0] >= ENGRAM_FALLBACK_RATIO, node="head", observed=observed, expected=expected,
                 warn_only=True, data={"points": [{"tokens": t, "prefill_tok_s": v, "ratio": round(r, 3)}
                                                  for r, t, v in ratios]},
                 fix="prefill is as slow as with Engram served from the checkpoint (the fallback's 25-50 % slower "
                     "prefill): read 04's 'engram attached' rows (a rank that ignored its packed file names it; "
                     "re-pack with 03 and restart); if every rank attached, look at the other prefill knobs "
                     "(MAX_NUM_BATCHED_TOKENS, DSV41_IO_THREADS, a busy node)")


def spec_decode_check(client: ApiClient, profile, rec: Archive) -> Check:
    c = _ctx(client, profile, rec)
    prof = profile
    if prof.spec_method == "none" or not prof.spec_k:
        return not_applicable("spec_decode.acceptance", f"SPEC_METHOD={prof.spec_method}: no speculative decoding",
                              node="head", expected="draft tokens accepted (SPEC_METHOD=dspark)")
    before = client.get("/metrics", timeout=30)
    ex = client.chat({"messages": [{"role": "user", "content": "Count from 1 to 120, separated by commas."}],
                      "temperature": 0, "max_tokens": 400, "chat_template_kwargs": dict(c.spec.thinking_off)},
                     timeout=600)
    after = client.get("/metrics", timeout=30)
    b = parse_metrics(before.body if isinstance(before.body, str) else "")
    a = parse_metrics(after.body if isinstance(after.body, str) else "")
    delta = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in a if k.startswith("vllm:spec_decode")}
    drafts, accepted = delta.get(SPEC_DRAFT_TOKENS, 0.0), delta.get(SPEC_ACCEPTED, 0.0)
    n_drafts = delta.get(SPEC_DRAFTS, 0.0)
    rate = accepted / drafts if drafts else None
    per_pos = {k.split("position=")[1].rstrip("}"): (v / n_drafts if n_drafts else None)
               for k, v in sorted(delta.items()) if k.startswith(SPEC_PER_POS)}
    mean_len = 1 + accepted / n_drafts if n_drafts else None
    ev = [rec.raw("spec_decode.metrics_before.txt", before.body if isinstance(before.body, str) else ""),
          rec.raw("spec_decode.metrics_after.txt", after.body if isinstance(after.body, str) else "")]
    ev += c.archive("spec_decode.acceptance", ex, delta=delta)
    ok = ex.ok and drafts > 0 and accepted > 0
    data = {"request": "GET /metrics; chat 'Count from 1 to 120' temperature=0 max_tokens=400; GET /metrics",
            "latency_s": round(ex.latency_s, 3), "draft_tokens": drafts, "accepted_tokens": accepted, "drafts": n_drafts, "acceptance_rate": rate,
            "mean_acceptance_length": mean_len, "per_position": per_pos, "k": prof.spec_k,
            "completion_tokens": (ex.json.get("usage") or {}).get("completion_tokens")}
    rec.data["spec_decode"] = data
    row = check("spec_decode.acceptance", ok, node="head",
                observed=(f"{ex.summary()}: " if not ex.ok else "") +
                         f"draft tokens +{drafts:.0f}, accepted +{accepted:.0f}" +
                         (f", rate {rate:.2f}, mean length {mean_len:.2f}" if rate is not None and mean_len else ""),
                expected=f"draft tokens accepted (k={prof.spec_k}; seed B reports ~0.68-0.75 on code)",
                fix="no drafts: --speculative-config not applied; no accepted tokens: drafter weights wrong "
                    "(quantized MTP drafter, see seeds-repos.md §A.12)", evidence=ev, data=data)
    if ok and rate is not None and rate < 0.2:
        row.status, row.fix = Status.WARN, "acceptance below 0.2: check the drafter precision and prompt"
    return row


def api_key_check(client: ApiClient, profile, rec: Archive) -> Check:
    c = _ctx(client, profile, rec)
    if not client.server.api_key:
        return not_applicable("auth.api_key", "no API key configured (VLLM_API_KEY unset)", node="head",
                              expected="401 without the key, 200 with it")
    no = client.get("/v1/models", auth=False, timeout=30)
    yes = client.get("/v1/models", timeout=30)
    ok = no.status == 401 and yes.status == 200
    return check("auth.api_key", ok, node="head",
                 observed=f"without key: {no.summary()}; with key: {yes.summary()}",
                 expected="401 without the key, 200 with it",
                 fix="a 200 without the key means the server was started without --api-key; a 401 with it "
                     "means VLLM_API_KEY differs from the server's key", evidence=c.archive("auth.api_key", [no, yes]),
                 data={"request": "GET /v1/models without / with Authorization", "without": no.status,
                       "with": yes.status, "latency_s": [round(no.latency_s, 4), round(yes.latency_s, 4)]})


def run_smoke(client: ApiClient | None, profile, rec: Archive, *, dry_run: bool = False, concurrency: int = 0,
              context_lengths: list[int] | None = None, long_context: bool = True) -> CheckList:
    """Every smoke case, in order. Stops after ``server.reachable`` when nothing answers. Raw exchanges and
    data go to ``rec`` for the step to record."""
    early = precheck(client, dry_run, "smoke")
    if early is not None:
        return early
    out = CheckList()
    first = reachable(client, rec)
    out.add(first)
    if first.failed:
        return out
    out.add(guard("endpoints", lambda: endpoint_checks(client, profile, rec)))
    out.add(guard("chat", lambda: chat_checks(client, profile, rec)))
    out.add(guard("concurrency", lambda: concurrency_check(client, profile, rec, concurrency)))
    if long_context:
        out.add(guard("context.limits", lambda: context_limit_checks(client, profile, rec)))
        needles = needle_checks(client, profile, rec, context_lengths)
        out.add(needles)
        out.add(engram_prefill_check(profile, needles))
    else:
        out.add(not_applicable("context", "long_context=False (parameter): long-context checks skipped", node="head"))
    out.add(guard("spec_decode.acceptance", lambda: spec_decode_check(client, profile, rec)))
    out.add(guard("auth.api_key", lambda: api_key_check(client, profile, rec)))
    return out
