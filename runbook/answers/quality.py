"""Quality gate (after smoke, step 05): is the output *right*, not just fast?

    rows = runbook.answers.quality.run_gate(client, profile, rec, dry_run=dry_run)   # rec: api.server_info.Archive

A small shipped evaluation set (``quality_set.json``, loaded by ``quality_set``) sent at temperature 0 with
thinking off (the recipe's ``chat_template_kwargs``): arithmetic and multi-step word problems with exact
integer answers, a needle at several depths of an exact-length prompt (``bench.prompts.build_exact_prompt``,
counted by the server's ``/tokenize``), an exact-format JSON answer validated with jsonschema, and two tool
calls judged by the tool battery's strict rules (``toolcalls``). One row per case, ``quality.<case>``
(``quality.needle.<depth %>`` per depth), then ``quality.score`` against the recipe's threshold, then
``quality.garble``: the garble detector (``garble``) over every answer archived in this step so far (the
smoke step's chat answers and the gate's). This module asks, judges (the pure ``judge_*``) and scores.

Rules (docs/quality.md has the set, the thresholds and what they do not catch):
- a request that fails (HTTP error, no answer, usage inconsistent, prompt not of its exact length) is a FAIL
  on every profile;
- real weights (``exl3-v41``, ``dspark-v4``): an answer that misses is FAIL when the case is required or the
  score falls below the recipe's ``min_score``, else WARN (tolerated miss);
- the lab's random tiny model (and a rehearsal, which serves it too): answers are N/A, never PASS; the
  row says what the rule would have said. ``quality.garble`` is N/A there as well: the tiny model's
  output is garble by any honest definition (``")")")")...``), and the row shows the detector's findings.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from ..api.prompts import WORDS, build_exact_prompt
from ..checks import Check, CheckList, Status, check, not_applicable
from ..errors import RunbookError
from .garble import garble_check
from ..api.guards import precheck, reachable
from .quality_set import Case, QualitySet, Thresholds, shipped_set
from .recipes import answer_matches, recipe_spec
from ..api.server_info import ApiClient, Archive, Exchange, archive, content_of, finish_of, message_of, usage_problems
from .toolcalls import rule_nested, rule_single, tool_defs, tool_map, validate_args

__all__ = [
    "SEED",
    "args_mismatch",
    "judge_json",
    "judge_needle",
    "judge_number",
    "judge_tool",
    "judged",
    "needle_code",
    "run_gate",
    "score_rows",
]

SEED = 1234


# ------------------------------------------------------------------------------------------------
# judges (pure; each returns the problems, empty = right)
# ------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _stopped(ex: Exchange) -> list[str]:
    fin = finish_of(ex.json)
    return [] if fin == "stop" else [f"finish_reason={fin!r}, expected stop (an answer that ran to max_tokens)"]


def judge_number(ex: Exchange, expected: str) -> list[str]:
    """The last number in the answer equals ``expected`` (thousands separators allowed) and the answer
    ended by itself. A model may restate the question first; the last number is its answer."""
    text = content_of(ex.json)
    nums = _NUMBER.findall(text)
    if not nums:
        return [f"no number in the answer {text[:80]!r}"] + _stopped(ex)
    last = nums[-1].replace(",", "")
    try:
        ok = Decimal(last) == Decimal(expected)
    except InvalidOperation:
        ok = False
    out = [] if ok else [f"answer {last} != {expected} (content {text[:80]!r})"]
    return out + _stopped(ex)


def judge_json(ex: Exchange, schema: dict[str, Any]) -> list[str]:
    """The whole answer is one JSON value (no fence, no prose) that the schema accepts (jsonschema
    through the tool battery's validator)."""
    text = content_of(ex.json).strip()
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return [f"not exactly JSON ({exc.msg} at {exc.pos}): {text[:80]!r}"] + _stopped(ex)
    return [f"schema: {e}" for e in validate_args(obj, schema)] + _stopped(ex)


def judge_needle(ex: Exchange, code: str) -> list[str]:
    text = content_of(ex.json)
    out = [] if answer_matches(text, code) else [f"passphrase {code!r} not in the answer {text[:80]!r}"]
    return out + _stopped(ex)


def _norm(v: Any) -> Any:
    if isinstance(v, str):
        return v.strip().casefold()
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return sorted((_norm(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True))
    return v


def args_mismatch(expected: Any, got: Any, path: str = "") -> list[str]:
    """Where ``got`` differs from the reference arguments: every reference key must be present and
    equal (strings case- and space-insensitive, lists in any order); keys the reference does not name
    are the schema's business."""
    here = path or "<root>"
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return [f"{here}: expected an object, got {json.dumps(got)[:60]}"]
        out = []
        for k, v in expected.items():
            sub = f"{path}/{k}" if path else k
            out += [f"{sub}: missing"] if k not in got else args_mismatch(v, got[k], sub)
        return out
    if _norm(expected) != _norm(got):
        return [f"{here}: expected {json.dumps(expected)}, got {json.dumps(got)[:80]}"]
    return []


def judge_tool(ex: Exchange, case: Case, schemas: dict[str, dict[str, Any]]) -> list[str]:
    """The battery's strict rule for the case (``single``: exactly one schema-valid call to the function,
    finish_reason tool_calls; ``nested``: a schema-valid call to it), then the call's arguments equal
    to the reference's."""
    ref = case.reference["tool_calls"][0]
    if case.rule == "single":
        problems = rule_single(ex, schemas, function=ref["name"], city="")
    else:
        problems = rule_nested(ex, schemas, function=ref["name"])
    calls = [c for c in (message_of(ex.json).get("tool_calls") or []) if isinstance(c, dict)
             and (c.get("function") or {}).get("name") == ref["name"]]
    if calls:
        try:
            got = json.loads(calls[0]["function"].get("arguments") or "")
        except ValueError:
            got = None            # the rule above has named the broken JSON already
        if got is not None:
            problems += [f"argument {m}" for m in args_mismatch(ref["arguments"], got)]
    return problems


# ------------------------------------------------------------------------------------------------
# the gate
# ------------------------------------------------------------------------------------------------

@dataclass
class _Result:
    name: str
    case: Case
    request_problems: list[str]
    answer_problems: list[str]
    evidence: list[str]
    data: dict[str, Any]
    summary: str


def needle_code(depth: float) -> str:
    """The passphrase hidden at ``depth`` (deterministic: the same code every run)."""
    rng = random.Random(f"quality-needle-{depth}")
    return f"{rng.choice(WORDS)}-{rng.randint(1000, 9999)}"


@dataclass
class _Gate:
    rec: Archive
    client: ApiClient
    kw: dict[str, Any]                     # chat_template_kwargs (thinking off)
    limits: Thresholds
    max_model_len: int

    def max_tokens(self, case: Case) -> int:
        return min(case.max_tokens, self.limits.max_tokens) if self.limits.max_tokens else case.max_tokens

    def payload(self, messages: list[dict[str, Any]], mt: int, **extra: Any) -> dict[str, Any]:
        return {"messages": messages, "max_tokens": mt, "temperature": 0, "seed": SEED,
                "chat_template_kwargs": dict(self.kw), **extra}

    def result(self, name: str, case: Case, ex: Exchange, mt: int, answer: list[str], request: str,
               *, extra_request: list[str] = (), **archived: Any) -> _Result:
        problems = list(extra_request)
        if not ex.ok:
            problems.append(f"{ex.summary()}: {ex.error_message()[:200]}")
        else:
            problems += usage_problems(ex.json.get("usage"), max_tokens=mt)
        ev = archive(self.rec, name, ex, **archived)
        calls = message_of(ex.json).get("tool_calls") or []
        shown = (f"calls {[(c.get('function') or {}).get('name') for c in calls if isinstance(c, dict)]}" if calls
                 else f"answer {content_of(ex.json)[:60]!r}")
        summary = f"{ex.summary()}, finish={finish_of(ex.json)}, {shown}"
        return _Result(name, case, problems, answer if ex.ok else [], ev,
                       {"request": request, "latency_s": round(ex.latency_s, 4), "max_tokens": mt,
                        "answer": content_of(ex.json)[:300], "finish_reason": finish_of(ex.json)}, summary)

    def simple(self, case: Case) -> list[_Result]:
        mt = self.max_tokens(case)
        ex = self.client.chat(self.payload([{"role": "user", "content": case.prompt}], mt), timeout=300)
        expected = case.reference["content"]
        answer = judge_number(ex, expected) if case.kind == "number" else judge_json(ex, case.schema or {})
        req = f"chat {case.prompt[:60]!r} temperature=0 max_tokens={mt} chat_template_kwargs={self.kw}"
        return [self.result(f"quality.{case.id}", case, ex, mt, answer, req, reference=case.reference)]

    def needle(self, case: Case) -> list[_Result]:
        mt = self.max_tokens(case)
        target = min(self.limits.needle_tokens, self.max_model_len - mt - 16)
        out = []
        for depth, name in zip(case.depths, case.row_names()):
            code = needle_code(depth)
            built = build_exact_prompt(
                lambda msgs: self.client.count_chat_tokens(msgs, chat_template_kwargs=self.kw,
                                                           timeout=120 + target / 20_000),
                target, f"[quality {name}]", endpoint="chat", workload="prose", seed=SEED,
                instruction="Read the text, then answer the question at the end.\n\n",
                tail=f"\n\nQuestion: {case.prompt}", needle=f"The secret passphrase is {code}.", depth=depth)
            ex = self.client.chat(self.payload(built.prompt, mt), timeout=300 + target / 300)
            extra = [] if built.exact else [f"built {built.tokens} tokens, not {target}"]
            if ex.ok and (ex.json.get("usage") or {}).get("prompt_tokens") != built.tokens:
                extra.append(f"usage.prompt_tokens={(ex.json.get('usage') or {}).get('prompt_tokens')} "
                             f"!= {built.tokens} counted by /tokenize")
            req = (f"chat, {built.tokens}-token prose prompt (/tokenize), needle at {depth:.0%}, max_tokens={mt}, "
                   f"chat_template_kwargs={self.kw}")
            r = self.result(name, case, ex, mt, judge_needle(ex, code), req, extra_request=extra,
                            built={"target": target, "tokens": built.tokens, "needle": code, "depth": depth,
                                   "tokenize_calls": built.tokenize_calls})
            r.data.update(prompt_tokens=built.tokens, depth=depth, code=code)
            out.append(r)
        return out

    def tool(self, case: Case, judged: bool) -> list[_Result]:
        mt = self.max_tokens(case)
        # the battery's definitions: plain on real weights; bounded + strict on the lab (as its server runs)
        tools = tool_defs(bounded=not judged, strict=not judged)
        ex = self.client.chat(self.payload([{"role": "user", "content": case.prompt}], mt, tools=tools,
                                           tool_choice="auto"), timeout=600)
        req = f"chat tools=4 tool_choice=auto {case.prompt[:60]!r} temperature=0 max_tokens={mt}"
        return [self.result(f"quality.{case.id}", case, ex, mt, judge_tool(ex, case, tool_map(tools)), req,
                            reference=case.reference)]


def _row(r: _Result, status: Status, observed: str, expected: str, fix: str = "") -> Check:
    return Check(r.name, node="head", status=status, observed=observed, expected=expected,
                 fix="" if status is Status.PASS else fix, evidence=r.evidence,
                 data={**r.data, "request_problems": r.request_problems, "answer_problems": r.answer_problems})


def _expected(case: Case) -> str:
    ref = case.reference
    if case.kind == "number":
        return f"last number = {ref['content']}, finish_reason stop"
    if case.kind == "json":
        return f"exactly the JSON {ref['content']} (schema with const values), finish_reason stop"
    if case.kind == "needle":
        return "the passphrase hidden in the exact-length prompt, finish_reason stop"
    call = ref["tool_calls"][0]
    return (f"the battery's strict '{case.rule}' rule for {call['name']} and arguments "
            f"{json.dumps(call['arguments'])[:120]}")


def score_rows(results: list[_Result], limits: Thresholds, *, judged: bool) -> CheckList:
    """Case rows and ``quality.score``. A failed request is FAIL everywhere. Judged: a miss is FAIL when
    the case is required or the score is below ``min_score``, else WARN. Not judged: N/A."""
    rows = CheckList()
    fix_request = "the request itself failed: see the raw exchange and the server log (04_launch)"
    fix_answer = ("wrong answer on real weights: check the weights' revision and dtype (02/03), quantisation, "
                  "the chat template (thinking off via chat_template_kwargs) and the recipe's patches")
    if not judged:
        for r in results:
            if r.request_problems:
                rows.add(_row(r, Status.FAIL, "; ".join(r.request_problems), "HTTP 200, usage consistent", fix_request))
            else:
                verdict = "; ".join(r.answer_problems) or "right"
                rows.add(_row(r, Status.NA, f"lab: random-weight tiny model, answer not judged ({r.summary}; the rule "
                                            f"would say: {verdict[:160]})",
                              f"{_expected(r.case)} (judged on real weights only)"))
        broken = [r.name for r in results if r.request_problems]
        c = not_applicable("quality.score", f"lab: {len(results)} cases ran; a random-weight model cannot reach any "
                                            "score, so none is claimed" +
                           (f" (requests failed: {broken})" if broken else ""), node="head",
                           expected="on real weights: the recipe's min_score and required cases (docs/quality.md)")
        c.data = {"judged": False, "cases": len(results)}
        rows.add(c)
        return rows
    passed = [r for r in results if not r.request_problems and not r.answer_problems]
    missed = [r for r in results if r.request_problems or r.answer_problems]
    score = len(passed) / len(results) if results else 0.0
    required_missed = [r.name for r in missed if r.case.id in limits.required]
    ok = bool(results) and score >= (limits.min_score or 1.0) and not required_missed
    for r in results:
        if r in passed:
            rows.add(_row(r, Status.PASS, r.summary, _expected(r.case)))
        elif r.request_problems:
            rows.add(_row(r, Status.FAIL, "; ".join(r.request_problems), _expected(r.case), fix_request))
        else:
            tolerated = ok and r.case.id not in limits.required
            obs = "; ".join(r.answer_problems)
            if tolerated:
                obs += f" (tolerated: score {score:.2f} >= {limits.min_score} and {r.case.id} is not required)"
            rows.add(_row(r, Status.WARN if tolerated else Status.FAIL, obs[:600], _expected(r.case), fix_answer))
    observed = f"{len(passed)}/{len(results)} = {score:.2f}"
    if missed:
        observed += f"; missed: {', '.join(r.name for r in missed)}"
    if required_missed:
        observed += f"; required cases missed: {', '.join(required_missed)}"
    rows.add(check("quality.score", ok, node="head", observed=observed,
                   expected=f"{limits.recipe}: score >= {limits.min_score} and no miss in {list(limits.required)}"
                            + (f" ({limits.why})" if limits.why else ""),
                   fix=fix_answer, data={"judged": True, "score": round(score, 4), "passed": len(passed),
                                         "cases": len(results), "min_score": limits.min_score,
                                         "required": list(limits.required), "missed": [r.name for r in missed]}))
    return rows


def judged(profile) -> bool:
    """Whether answers are judged: real weights only (a recipe profile, not its rehearsal on the lab's
    random tiny model)."""
    return recipe_spec(profile).hardware and not profile.rehearsal


def run_gate(client: ApiClient | None, profile, rec: Archive, *, dry_run: bool = False,
             quality_set: QualitySet | None = None) -> CheckList:
    """Every case of the set, ``quality.score``, then ``quality.garble`` over every answer kept in ``rec``
    (the smoke cases' and the gate's); raw exchanges and data go to ``rec`` for the step to record. Judged on real weights only (``RECIPE`` exl3-v41 / dspark-v4, not a rehearsal)."""
    early = precheck(client, dry_run, "quality")
    if early is not None:
        return early
    first = reachable(client, rec, name="quality.server.reachable")
    if first.failed:
        return CheckList([first])
    qs = quality_set or shipped_set()
    spec = recipe_spec(profile)
    on_weights = judged(profile)
    key = profile.recipe if on_weights else "lab"
    if key not in qs.recipes:
        raise RunbookError(f"{qs.source}: no thresholds for RECIPE={key}", expected=f"recipes.{key}",
                           fix=f"add recipes.{key} (min_score, required, needle_tokens) to {qs.source}")
    limits = qs.recipes[key]
    gate = _Gate(rec, client, dict(spec.thinking_off), limits,
                 client.server.max_model_len or profile.max_model_len)
    results: list[_Result] = []
    for case in qs.cases:
        try:
            if case.kind == "needle":
                results += gate.needle(case)
            elif case.kind == "tool":
                results += gate.tool(case, on_weights)
            else:
                results += gate.simple(case)
        except Exception as exc:  # noqa: BLE001 - a case that cannot run is a failed row; the others go on
            why = f"the case could not run: {type(exc).__name__}: {str(exc)[:300]}"
            results += [_Result(n, case, [why], [], [], {}, why) for n in case.row_names()]
    rows = score_rows(results, limits, judged=on_weights)
    rows.add(garble_check(rec, judged=on_weights))
    rec.data.setdefault("quality", {}).update(
        recipe=profile.recipe, judged=on_weights, thresholds=key,
        rows={c.name: c.status.value for c in rows if c.name != "quality.garble"})
    return rows
