"""The tool definitions of the recipe's tool-call battery (seed B ``scripts/tool-battery.py``, seeds-repos.md
§B.7: search_web, get_weather, send_email and the nested complex_query), their schema checks (arguments must
parse as JSON AND validate against the tool's JSON schema, ``jsonschema``, Draft 2020-12) and the pass rule of
each case; shared by step 06's battery (``vision_tools/battery.py``) and the quality gate.
"""
from __future__ import annotations

import copy
import json
from typing import Any

from ..api.server_info import (
    Exchange,
    content_of,
    finish_of,
    message_of,
    reasoning_of,
    usage_problems,
)

__all__ = [
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
