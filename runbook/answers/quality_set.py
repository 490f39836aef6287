"""The quality gate's evaluation set (``quality_set.json``, next to this module): its cases and the
thresholds per recipe, loaded and validated.

Errors name the file, the key and the fix; docs/quality.md describes the format.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import RunbookError
from .toolcalls import tool_defs, tool_map, validate_args

__all__ = ["KINDS", "SET_FILE", "TOOL_RULES", "Case", "QualitySet", "Thresholds", "load_quality_set", "shipped_set"]

SET_FILE = "quality_set.json"
KINDS = ("number", "json", "needle", "tool")
TOOL_RULES = ("single", "nested")


@dataclass(frozen=True)
class Case:
    id: str
    kind: str                              # number | json | needle | tool
    prompt: str
    max_tokens: int
    reference: dict[str, Any]              # content | content_from (regex, group 1) | tool_calls
    schema: dict[str, Any] | None = None   # json: the exact answer as a JSON schema (const values)
    rule: str = ""                         # tool: the battery's rule (single | nested)
    depths: tuple[float, ...] = ()         # needle: where the needle sits in the body (0..1)

    def row_names(self) -> list[str]:
        if self.kind == "needle":
            return [f"quality.{self.id}.{round(d * 100)}" for d in self.depths]
        return [f"quality.{self.id}"]


@dataclass(frozen=True)
class Thresholds:
    recipe: str
    min_score: float | None                # None: answers are not judged (the lab)
    required: tuple[str, ...]              # case ids that may never miss
    needle_tokens: int
    max_tokens: int = 0                    # > 0: every request's max_tokens capped (lab: short answers)
    why: str = ""


@dataclass(frozen=True)
class QualitySet:
    cases: tuple[Case, ...]
    recipes: dict[str, Thresholds]
    source: str

    def row_names(self) -> list[str]:
        return [n for c in self.cases for n in c.row_names()]


def _set_error(source: str, key: str, observed: Any, expected: str) -> RunbookError:
    return RunbookError(f"{source}: {key}: invalid quality set entry", observed=repr(observed)[:200],
                        expected=expected, fix=f"correct {key} in {source} (docs/quality.md describes the format)")


def _case(source: str, i: int, raw: Any) -> Case:
    where = f"cases[{i}]"
    if not isinstance(raw, dict):
        raise _set_error(source, where, raw, "an object")
    cid = raw.get("id")
    if not isinstance(cid, str) or not re.fullmatch(r"[a-z][a-z0-9_.]*", cid or ""):
        raise _set_error(source, f"{where}.id", cid, "a lower-case id such as 'arith.mul'")
    where = f"cases[{i}] ({cid})"
    kind = raw.get("kind")
    if kind not in KINDS:
        raise _set_error(source, f"{where}.kind", kind, " | ".join(KINDS))
    prompt, mt, ref = raw.get("prompt"), raw.get("max_tokens"), raw.get("reference")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _set_error(source, f"{where}.prompt", prompt, "the question (non-empty text)")
    if not isinstance(mt, int) or mt < 1:
        raise _set_error(source, f"{where}.max_tokens", mt, "an integer >= 1")
    want = {"number": "content", "json": "content", "needle": "content_from", "tool": "tool_calls"}[kind]
    if not isinstance(ref, dict) or set(ref) != {want}:
        raise _set_error(source, f"{where}.reference", ref, f"an object with the one key {want!r}")
    if kind == "number" and not re.fullmatch(r"-?\d+", str(ref["content"])):
        raise _set_error(source, f"{where}.reference.content", ref["content"], "an integer as text, e.g. '1296'")
    schema = raw.get("schema")
    if kind == "json":
        if not isinstance(schema, dict):
            raise _set_error(source, f"{where}.schema", schema, "a JSON schema of the exact answer")
        try:
            ref_obj = json.loads(ref["content"])
        except ValueError:
            raise _set_error(source, f"{where}.reference.content", ref["content"], "JSON text") from None
        if validate_args(ref_obj, schema):
            raise _set_error(source, f"{where}.reference.content", ref["content"], "an answer its own schema accepts")
    depths: tuple[float, ...] = ()
    if kind == "needle":
        try:
            pattern = re.compile(ref["content_from"])
        except (re.error, TypeError):
            raise _set_error(source, f"{where}.reference.content_from", ref["content_from"],
                             "a regular expression with one group (the answer)") from None
        if pattern.groups != 1:
            raise _set_error(source, f"{where}.reference.content_from", ref["content_from"], "exactly one group")
        depths = tuple(raw.get("depths") or ())
        if not depths or not all(isinstance(d, (int, float)) and 0 <= d <= 1 for d in depths):
            raise _set_error(source, f"{where}.depths", raw.get("depths"), "a non-empty list of depths in [0, 1]")
    rule = raw.get("rule", "")
    if kind == "tool":
        calls = ref["tool_calls"]
        if rule not in TOOL_RULES:
            raise _set_error(source, f"{where}.rule", rule, " | ".join(TOOL_RULES))
        known = tool_map(tool_defs())
        if not isinstance(calls, list) or len(calls) != 1 or not isinstance(calls[0], dict):
            raise _set_error(source, f"{where}.reference.tool_calls", calls, "one call {name, arguments}")
        name, args = calls[0].get("name"), calls[0].get("arguments")
        if name not in known:
            raise _set_error(source, f"{where}.reference.tool_calls[0].name", name, f"one of {sorted(known)}")
        if validate_args(args, known[name]):
            raise _set_error(source, f"{where}.reference.tool_calls[0].arguments", args,
                             f"arguments the {name} schema accepts")
    return Case(cid, kind, prompt, mt, dict(ref), schema, rule, depths)


def _thresholds(source: str, recipe: str, raw: Any, ids: set[str]) -> Thresholds:
    where = f"recipes.{recipe}"
    if not isinstance(raw, dict):
        raise _set_error(source, where, raw, "an object")
    tokens = raw.get("needle_tokens")
    if not isinstance(tokens, int) or tokens < 64:
        raise _set_error(source, f"{where}.needle_tokens", tokens, "an integer >= 64")
    cap = raw.get("max_tokens", 0)
    if not isinstance(cap, int) or cap < 0:
        raise _set_error(source, f"{where}.max_tokens", cap, "an integer >= 0 (0 = the cases' own)")
    score = raw.get("min_score")
    if recipe == "lab":
        if score is not None:
            raise _set_error(source, f"{where}.min_score", score, "absent: the lab's answers are not judged")
        return Thresholds(recipe, None, (), tokens, cap, str(raw.get("why", "")))
    if not isinstance(score, (int, float)) or not 0 < score <= 1:
        raise _set_error(source, f"{where}.min_score", score, "a fraction in (0, 1]")
    required = raw.get("required", [])
    if not isinstance(required, list) or not set(required) <= ids:
        raise _set_error(source, f"{where}.required", required, f"case ids among {sorted(ids)}")
    return Thresholds(recipe, float(score), tuple(required), tokens, cap, str(raw.get("why", "")))


def load_quality_set(path: str | Path | None = None) -> QualitySet:
    """The shipped set (or ``path``), validated: every entry's kind, reference and schema, every
    recipe's threshold; errors name the file, the key and the fix."""
    if path is None:
        source, text = f"runbook/answers/{SET_FILE}", resources.files(__package__).joinpath(SET_FILE).read_text()
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise RunbookError(f"cannot read the quality set {path}", observed=str(exc),
                               fix="pass the path of a quality set JSON file (or none: the shipped one)") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RunbookError(f"{source} is not valid JSON", observed=str(exc), fix=f"correct {source}") from None
    raw_cases = doc.get("cases") if isinstance(doc, dict) else None
    if not isinstance(raw_cases, list) or not raw_cases:
        raise _set_error(source, "cases", raw_cases, "a non-empty list of cases")
    cases = tuple(_case(source, i, c) for i, c in enumerate(raw_cases))
    ids = [c.id for c in cases]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise _set_error(source, "cases[].id", dup, "unique ids")
    recipes = doc.get("recipes")
    if not isinstance(recipes, dict) or "lab" not in recipes:
        raise _set_error(source, "recipes", recipes, "thresholds per recipe, including 'lab'")
    return QualitySet(cases, {r: _thresholds(source, r, v, set(ids)) for r, v in recipes.items()}, source)


@cache
def shipped_set() -> QualitySet:
    """The shipped set, read and validated once per process."""
    return load_quality_set()
