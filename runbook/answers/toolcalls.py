"""Step 06 (tools): the recipe's 7-case tool-call battery (seed B ``scripts/tool-battery.py``,
seeds-repos.md §B.7), each case with its pass rule; arguments must parse as JSON AND validate
against the tool's JSON schema (``jsonschema``, Draft 2020-12).

    step.add(runbook.toolcalls.run_battery(step, client))

Cases (check names):
1. ``tools.single``       one call of get_weather for Paris;
2. ``tools.nested``       the nested ``complex_query`` schema;
3. ``tools.multi_turn``   call -> tool result -> a final answer without a further call;
4. ``tools.parallel``     two calls in one turn (Paris and Tokyo);
5. ``tools.thinking``     thinking on (the recipe's chat_template_kwargs) + a tool call;
6. ``tools.truncation``   small max_tokens -> finish_reason ``length`` and never a tool call with broken
                          JSON arguments (seed B issue #55);
7. ``tools.forced_named`` / ``tools.forced_required``: tool_choice named / ``required`` on a prompt that
                          needs no tool -> a schema-valid call anyway.

Real weights (exl3-v41, dspark-v4): the requests are the recipe's (tool_choice ``auto``,
temperature 0, max_tokens 800) and every rule is strict.

Lab (random tiny model; the server runs with ``--tool-strict-level parameter``, and requests carry
``"strict": true``; every string in the schemas is bounded): a random model cannot *choose* a tool, so

- cases whose point is the schema (nested, thinking, parallel, multi-turn round 1, forced) force the
  call (named or ``required``) and the strict rule applies: the call must be schema-valid;
- what depends on the model's judgement (picking the tool under ``auto``, answering without a further
  call, two calls, reasoning text) is relaxed to "a well-formed response", and the row says so.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from ..checks import Check, CheckList, Status
from ..api.server_info import (
    ApiClient,
    Exchange,
    archive,
    content_of,
    finish_of,
    message_of,
    reasoning_of,
    usage_problems,
)
from ..api.guards import guard, precheck, reachable
from .recipes import RecipeSpec, recipe_spec

__all__ = [
    "CASES",
    "TOOLS",
    "SchemaError",
    "call_problems",
    "rule_forced",
    "rule_multi_turn_final",
    "rule_nested",
    "rule_parallel",
    "rule_single",
    "rule_thinking",
    "rule_truncation",
    "run_battery",
    "tool_defs",
    "tool_map",
    "validate_args",
    "validate_call",
    "wellformed_problems",
]

# ------------------------------------------------------------------------------------------------
# tools (recipe B's four: search_web, get_weather, send_email, nested complex_query)
# ------------------------------------------------------------------------------------------------

_DATE = {"type": "string", "pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "description": "YYYY-MM-DD"}

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web and return the top results.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Search query"},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string", "description": "Recipient address"},
            "subject": {"type": "string"},
            "body": {"type": "string"}},
            "required": ["to", "subject", "body"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "complex_query", "description": "Query a news archive with nested filters.",
        "parameters": {"type": "object", "properties": {
            "filters": {"type": "object", "properties": {
                "date_range": {"type": "object", "properties": {"start": _DATE, "end": _DATE},
                               "required": ["start", "end"], "additionalProperties": False},
                "categories": {"type": "array", "minItems": 1, "maxItems": 4,
                               "items": {"type": "string", "enum": ["news", "sports", "tech", "finance"]}}},
                "required": ["date_range", "categories"], "additionalProperties": False},
            "sort": {"type": "object", "properties": {
                "field": {"type": "string", "enum": ["date", "relevance"]},
                "order": {"type": "string", "enum": ["asc", "desc"]}},
                "required": ["field", "order"], "additionalProperties": False},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
            "required": ["filters", "sort", "limit"], "additionalProperties": False}}},
]

#: maxLength per string property when ``bounded`` (the lab: a random model under a grammar must end)
_BOUNDS = {"city": 24, "query": 40, "to": 32, "subject": 32, "body": 64}


def _bound(schema: Any, key: str = "") -> Any:
    if isinstance(schema, list):
        return [_bound(v, key) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: ({pk: _bound(pv, pk) for pk, pv in v.items()} if k == "properties" else _bound(v, key))
           for k, v in schema.items()}
    if out.get("type") == "string" and "enum" not in out and "pattern" not in out:
        out["maxLength"] = _BOUNDS.get(key, 24)
    return out


def tool_defs(*, bounded: bool = False, strict: bool = False) -> list[dict[str, Any]]:
    """The four tools; ``bounded`` adds maxLength to every free string, ``strict`` sets
    ``function.strict`` (grammar-constrained arguments)."""
    tools = copy.deepcopy(TOOLS)
    for t in tools:
        fn = t["function"]
        if bounded:
            fn["parameters"] = _bound(fn["parameters"])
        if strict:
            fn["strict"] = True
    return tools


def tool_map(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools}


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------

class SchemaError(ValueError):
    pass


def validate_args(args: Any, schema: dict[str, Any]) -> list[str]:
    """Schema violations of ``args`` (empty = valid). jsonschema, Draft 2020-12, format not asserted."""
    from jsonschema import Draft202012Validator
    v = Draft202012Validator(schema)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(v.iter_errors(args), key=lambda e: list(e.absolute_path))]


def validate_call(call: Any, schemas: dict[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, list[str]]:
    """One ``tool_calls`` entry: (parsed arguments or None, problems). Problems: not a function call,
    unknown name, arguments not a JSON string / not parseable / not an object / schema violations."""
    if not isinstance(call, dict):
        return None, [f"tool call is not an object: {call!r}"[:120]]
    fn = call.get("function") or {}
    name = fn.get("name")
    if call.get("type", "function") != "function":
        return None, [f"type={call.get('type')!r}, not function"]
    if name not in schemas:
        return None, [f"unknown function {name!r}"]
    raw = fn.get("arguments")
    if not isinstance(raw, str):
        return None, [f"{name}: arguments is {type(raw).__name__}, not a JSON string"]
    try:
        args = json.loads(raw)
    except ValueError as exc:
        return None, [f"{name}: arguments are not valid JSON ({exc.msg} at {exc.pos}): {raw[:80]!r}"]
    if not isinstance(args, dict):
        return None, [f"{name}: arguments are {type(args).__name__}, not an object"]
    errs = validate_args(args, schemas[name])
    return args, [f"{name}: {e}" for e in errs]


def call_problems(body: Any, schemas: dict[str, dict[str, Any]]) -> tuple[list[tuple[str, dict | None]], list[str]]:
    """All tool calls of a response: ([(name, args)], problems across them)."""
    calls = message_of(body).get("tool_calls") or []
    parsed, problems = [], []
    for c in calls:
        args, p = validate_call(c, schemas)
        parsed.append(((c.get("function") or {}).get("name") if isinstance(c, dict) else None, args))
        problems += p
    return parsed, problems


def wellformed_problems(ex: Exchange, schemas: dict[str, dict[str, Any]], *, max_tokens: int | None = None) -> list[str]:
    """The relaxed rule (lab, judgement-dependent cases): HTTP 200, a message, a valid finish_reason
    consistent with the tool calls, usage consistent, and every reported tool call schema-valid."""
    if not ex.ok:
        return [f"{ex.summary()}: {ex.error_message()[:200]}"]
    body = ex.json
    out = []
    if not message_of(body):
        out.append("no message in the response")
    fin = finish_of(body)
    calls = message_of(body).get("tool_calls") or []
    if fin not in ("stop", "length", "tool_calls"):
        out.append(f"finish_reason={fin!r}")
    if fin == "tool_calls" and not calls:
        out.append("finish_reason=tool_calls but no tool_calls")
    _, p = call_problems(body, schemas)
    out += p
    out += usage_problems(body.get("usage"), max_tokens=max_tokens)
    return out


# ------------------------------------------------------------------------------------------------
# pass rules (pure; unit-tested against recorded responses)
# ------------------------------------------------------------------------------------------------

def _base(ex: Exchange) -> list[str]:
    return [] if ex.ok else [f"{ex.summary()}: {ex.error_message()[:200]}"]


def rule_single(ex: Exchange, schemas, *, function: str = "get_weather", city: str = "Paris") -> list[str]:
    """Exactly one call, to ``function``, schema-valid, naming the city; finish_reason tool_calls."""
    if (p := _base(ex)):
        return p
    parsed, problems = call_problems(ex.json, schemas)
    if not parsed:
        return [f"no tool call (finish={finish_of(ex.json)}, content {content_of(ex.json)[:60]!r})"]
    if len(parsed) != 1:
        problems.append(f"{len(parsed)} calls, expected 1")
    name, args = parsed[0]
    if name != function:
        problems.append(f"called {name!r}, expected {function!r}")
    elif args is not None and city and city.lower() not in json.dumps(args).lower():
        problems.append(f"arguments {json.dumps(args)[:80]} do not name {city}")
    if finish_of(ex.json) != "tool_calls":
        problems.append(f"finish_reason={finish_of(ex.json)!r}, expected tool_calls")
    return problems


def rule_nested(ex: Exchange, schemas, *, function: str = "complex_query") -> list[str]:
    """At least one call to the nested tool and every call schema-valid."""
    if (p := _base(ex)):
        return p
    parsed, problems = call_problems(ex.json, schemas)
    if not any(n == function for n, _ in parsed):
        problems.append(f"no call to {function} (calls: {[n for n, _ in parsed]}, content "
                        f"{content_of(ex.json)[:60]!r})")
    return problems


def rule_multi_turn_final(ex: Exchange, schemas, *, mention: str = "") -> list[str]:
    """Round 2 (after the tool result): a final answer, no further tool call, finish_reason stop."""
    if (p := _base(ex)):
        return p
    problems = []
    if message_of(ex.json).get("tool_calls"):
        problems.append(f"a further tool call: {json.dumps(message_of(ex.json)['tool_calls'])[:100]}")
    if not content_of(ex.json).strip():
        problems.append("empty final answer")
    if finish_of(ex.json) != "stop":
        problems.append(f"finish_reason={finish_of(ex.json)!r}, expected stop")
    if mention and mention not in content_of(ex.json):
        problems.append(f"the answer does not use the tool result ({mention!r} missing)")
    return problems


def rule_parallel(ex: Exchange, schemas, *, function: str = "get_weather", cities: tuple[str, ...] = ("Paris", "Tokyo"),
                  min_calls: int = 2) -> list[str]:
    """At least ``min_calls`` schema-valid calls in one turn, covering every city."""
    if (p := _base(ex)):
        return p
    parsed, problems = call_problems(ex.json, schemas)
    if len(parsed) < min_calls:
        problems.append(f"{len(parsed)} call(s), expected >= {min_calls}")
    if cities:
        blob = json.dumps([a for n, a in parsed if n == function]).lower()
        missing = [c for c in cities if c.lower() not in blob]
        if missing:
            problems.append(f"no {function} call for {missing}")
    return problems


def rule_thinking(ex: Exchange, schemas, *, function: str = "get_weather") -> tuple[list[str], list[str]]:
    """Thinking on + tool: a schema-valid call to ``function`` (hard); reasoning text present (soft)."""
    if (p := _base(ex)):
        return p, []
    parsed, problems = call_problems(ex.json, schemas)
    if not any(n == function for n, _ in parsed):
        problems.append(f"no call to {function} (calls {[n for n, _ in parsed]}, finish {finish_of(ex.json)}, "
                        f"content {content_of(ex.json)[:60]!r})")
    soft = [] if reasoning_of(ex.json) else ["no reasoning text (reasoning parser off or thinking ignored)"]
    return problems, soft


def rule_truncation(ex: Exchange, schemas) -> list[str]:
    """Small max_tokens: finish_reason must be ``length``; no tool call with broken JSON may be reported
    (seed B issue #55: a truncated call was reported as tool_calls with invalid JSON)."""
    if (p := _base(ex)):
        return p
    problems = []
    if finish_of(ex.json) != "length":
        problems.append(f"finish_reason={finish_of(ex.json)!r}, expected length (max_tokens too large for the case?)")
    calls = message_of(ex.json).get("tool_calls") or []
    if calls:
        _, p = call_problems(ex.json, schemas)
        problems += [f"broken tool call reported: {x}" for x in p]
    return problems


def rule_forced(ex: Exchange, schemas, *, function: str | None) -> list[str]:
    """tool_choice named (``function``) or ``required`` (None): >= 1 call, all schema-valid, to the
    named function when named."""
    if (p := _base(ex)):
        return p
    parsed, problems = call_problems(ex.json, schemas)
    if not parsed:
        problems.append(f"no tool call despite tool_choice (finish {finish_of(ex.json)}, content "
                        f"{content_of(ex.json)[:60]!r})")
    if function and any(n != function for n, _ in parsed):
        problems.append(f"called {[n for n, _ in parsed]}, expected only {function}")
    if finish_of(ex.json) not in ("stop", "tool_calls"):
        problems.append(f"finish_reason={finish_of(ex.json)!r}")
    return problems


# ------------------------------------------------------------------------------------------------
# the battery
# ------------------------------------------------------------------------------------------------

CASES = ("tools.single", "tools.nested", "tools.multi_turn", "tools.parallel", "tools.thinking",
         "tools.truncation", "tools.forced_named", "tools.forced_required")

RELAXED = "lab (random weights): relaxed to a well-formed response"
WEATHER_RESULT = {"city": "Paris", "temperature_c": 18, "conditions": "sunny"}


@dataclass
class _Battery:
    step: Any
    client: ApiClient
    spec: RecipeSpec
    hardware: bool
    tools: list[dict[str, Any]]
    schemas: dict[str, dict[str, Any]]
    max_tokens: int
    rows: CheckList = field(default_factory=CheckList)

    def named(self, fn: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": fn}}

    def ask(self, messages: list[dict[str, Any]], *, tool_choice: Any = "auto", thinking: bool = False,
            max_tokens: int | None = None, **extra: Any) -> tuple[Exchange, str]:
        payload = {"messages": messages, "tools": self.tools, "tool_choice": tool_choice, "temperature": 0,
                   "max_tokens": max_tokens or self.max_tokens,
                   "chat_template_kwargs": dict(self.spec.thinking_on if thinking else self.spec.thinking_off),
                   **extra}
        tc = tool_choice if isinstance(tool_choice, str) else f"named:{tool_choice['function']['name']}"
        summary = (f"chat tools=4 tool_choice={tc} max_tokens={payload['max_tokens']} "
                   f"thinking={'on' if thinking else 'off'}" + (f" {extra}" if extra else "") +
                   f"; user: {messages[-1]['content'][:60] if isinstance(messages[-1].get('content'), str) else ''!r}")
        return self.client.chat(payload, timeout=600), summary

    def row(self, name: str, problems: list[str], *, expected: str, ex: Exchange | list[Exchange], request: str,
            relaxed: bool = False, soft: list[str] = (), fix: str = "") -> Check:
        exs = ex if isinstance(ex, list) else [ex]
        ev = archive(self.step, name, exs, rule=("relaxed" if relaxed else "strict"))
        last = exs[-1]
        parsed = message_of(last.json).get("tool_calls") or []
        if problems:
            status = Status.FAIL
        elif soft:
            status = Status.WARN
        else:
            status = Status.PASS
        calls = [f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments', '')[:50]})"
                 for c in parsed if isinstance(c, dict)]
        observed = "; ".join(problems + list(soft)) or (
            f"{last.summary()}, finish={finish_of(last.json)}, calls {calls or 'none'}"
            + (f", content {content_of(last.json)[:40]!r}" if not calls else ""))
        if relaxed:
            observed = f"[{RELAXED}] " + observed
        c = Check(name, node="head", status=status, observed=observed,
                  expected=(f"{RELAXED}; on real weights: {expected}" if relaxed else expected),
                  fix="" if status is Status.PASS else (fix or "see the raw exchange; check --tool-call-parser, "
                                                        "--enable-auto-tool-choice and the chat template"),
                  evidence=ev, data={"request": request, "latency_s": [round(e.latency_s, 4) for e in exs],
                                     "rule": "relaxed" if relaxed else "strict",
                                     "finish_reason": finish_of(last.json), "tool_calls": calls})
        return c


def run_battery(step, client: ApiClient | None) -> CheckList:
    """The 7-case battery (8 rows: forced is named + required). Stops with one FAIL row if the server
    does not answer."""
    spec = recipe_spec(step.profile)
    hw = spec.hardware
    early = precheck(step, client, "tools")
    if early is not None:
        return early
    first = reachable(step, client, name="tools.server.reachable")
    if first.failed:
        return CheckList([first])
    tools = tool_defs(bounded=not hw, strict=not hw)
    b = _Battery(step, client, spec, hw, tools, tool_map(tools), 800 if hw else 400)
    weather_q = "What is the weather in Paris right now? Use the get_weather tool."

    relaxed_mt = None if hw else 64      # lab: judgement-dependent cases only need a well-formed response

    def single() -> Check:
        ex, req = b.ask([{"role": "user", "content": weather_q}], max_tokens=relaxed_mt)
        if hw:
            return b.row("tools.single", rule_single(ex, b.schemas), ex=ex, request=req,
                         expected="exactly 1 call get_weather(city~Paris), schema-valid, finish_reason tool_calls")
        return b.row("tools.single", wellformed_problems(ex, b.schemas, max_tokens=relaxed_mt), ex=ex, request=req,
                     relaxed=True, expected="exactly 1 call get_weather(city~Paris), schema-valid, finish_reason tool_calls")

    def nested() -> Check:
        msgs = [{"role": "user", "content": "Find tech and finance news from 2026-01-01 to 2026-01-31, newest first, "
                                            "at most 5 results. Use complex_query."}]
        ex, req = b.ask(msgs, tool_choice="auto" if hw else b.named("complex_query"))
        return b.row("tools.nested", rule_nested(ex, b.schemas), ex=ex, request=req,
                     expected="a complex_query call whose nested arguments validate against the schema"
                              + ("" if hw else " (lab: named tool_choice, strict grammar)"))

    def multi_turn() -> Check:
        msgs = [{"role": "user", "content": weather_q}]
        ex1, req1 = b.ask(msgs, tool_choice="auto" if hw else b.named("get_weather"))
        p1 = rule_single(ex1, b.schemas) if hw else rule_forced(ex1, b.schemas, function="get_weather")
        calls = message_of(ex1.json).get("tool_calls") or []
        if p1 or not calls:
            return b.row("tools.multi_turn", [f"round 1: {x}" for x in (p1 or ["no tool call"])], ex=ex1,
                         request=req1, expected="round 1: a get_weather call; round 2: a final answer, no call")
        call = calls[0]
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
                      {"id": call.get("id") or "call_0", "type": "function",
                       "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]},
                 {"role": "tool", "tool_call_id": call.get("id") or "call_0", "content": json.dumps(WEATHER_RESULT)}]
        ex2, req2 = b.ask(msgs, max_tokens=relaxed_mt)
        req = f"{req1} -> tool result {json.dumps(WEATHER_RESULT)} -> {req2.split(';')[0]}"
        if hw:
            return b.row("tools.multi_turn", rule_multi_turn_final(ex2, b.schemas, mention="18"), ex=[ex1, ex2],
                         request=req, expected="round 1 a get_weather call; round 2 a final answer using the "
                                               "result (18), no further call, finish_reason stop")
        return b.row("tools.multi_turn", wellformed_problems(ex2, b.schemas, max_tokens=relaxed_mt), ex=[ex1, ex2],
                     request=req, relaxed=True,
                     expected="round 1 a schema-valid get_weather call (forced on the lab); round 2 (history with "
                              "assistant tool_calls + tool message) a final answer, no further call")

    def parallel() -> Check:
        msgs = [{"role": "user", "content": "What is the weather in Paris and in Tokyo? Call get_weather once per city."}]
        if hw:
            ex, req = b.ask(msgs, parallel_tool_calls=True)
            return b.row("tools.parallel", rule_parallel(ex, b.schemas), ex=ex, request=req,
                         expected=">= 2 schema-valid get_weather calls in one turn (Paris, Tokyo)")
        ex, req = b.ask(msgs, tool_choice="required", parallel_tool_calls=True)
        return b.row("tools.parallel", rule_parallel(ex, b.schemas, cities=(), min_calls=1), ex=ex, request=req,
                     relaxed=True, expected=">= 2 schema-valid get_weather calls in one turn (Paris, Tokyo); lab: "
                                            "tool_choice=required, >= 1 schema-valid call, count not judged")

    def thinking() -> Check:
        ex, req = b.ask([{"role": "user", "content": weather_q}], thinking=True,
                        tool_choice="auto" if hw else b.named("get_weather"))
        hard, soft = rule_thinking(ex, b.schemas)
        if not hw:
            soft = []   # no reasoning parser on the lab server
        return b.row("tools.thinking", hard, soft=soft, ex=ex, request=req,
                     expected=f"thinking on ({spec.thinking_on}): a schema-valid get_weather call"
                              + (" and reasoning text (WARN if absent)" if hw else
                                 "; lab: named tool_choice, reasoning not judged (no reasoning parser)"))

    def truncation() -> Check:
        msgs = [{"role": "user", "content": "Send an email to alice@example.com with subject 'Quarterly report' and a "
                                            "detailed 300-word body summarising the quarter. Use send_email."}]
        mt = 40 if hw else 12
        ex, req = b.ask(msgs, max_tokens=mt, tool_choice="auto" if hw else "required")
        return b.row("tools.truncation", rule_truncation(ex, b.schemas), ex=ex, request=req,
                     expected=f"max_tokens={mt}: finish_reason length and no tool call with broken JSON (issue #55)",
                     fix="a truncated call reported as tool_calls: the tool parser must drop non-JSON arguments "
                         "(seed B #55 hotfix)")

    def forced(kind: str) -> Check:
        msgs = [{"role": "user", "content": "Say hello in one short sentence."}]
        choice = b.named("get_weather") if kind == "named" else "required"
        ex, req = b.ask(msgs, tool_choice=choice)
        return b.row(f"tools.forced_{kind}", rule_forced(ex, b.schemas, function="get_weather" if kind == "named" else None),
                     ex=ex, request=req,
                     expected=("tool_choice get_weather on a no-tool prompt: a schema-valid get_weather call"
                               if kind == "named" else
                               "tool_choice=required on a no-tool prompt: >= 1 call, every call schema-valid"))

    for name, fn in (("tools.single", single), ("tools.nested", nested), ("tools.multi_turn", multi_turn),
                     ("tools.parallel", parallel), ("tools.thinking", thinking), ("tools.truncation", truncation),
                     ("tools.forced_named", lambda: forced("named")),
                     ("tools.forced_required", lambda: forced("required"))):
        b.rows.add(guard(name, fn))
    return b.rows
