"""Quality gate (after smoke, step 05): is the output *right*, not just fast?

    step.add(runbook.serve.quality.run_gate(step, client))

A small shipped evaluation set (``quality_set.json``, next to this module) sent at temperature 0 with
thinking off (the recipe's ``chat_template_kwargs``): arithmetic and multi-step word problems with exact
integer answers, a needle at several depths of an exact-length prompt (``bench.prompts.build_exact_prompt``,
counted by the server's ``/tokenize``), an exact-format JSON answer validated with jsonschema, and two tool
calls judged by the tool battery's strict rules (``toolcalls``). One row per case, ``quality.<case>``
(``quality.needle.<depth %>`` per depth), then ``quality.score`` against the recipe's threshold, then
``quality.garble``: the garble detector over every answer archived in this step so far (the smoke step's
chat answers and the gate's).

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
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..bench.prompts import WORDS, build_exact_prompt
from ..checks import Check, CheckList, Status, check, not_applicable
from ..errors import RunbookError
from .server_info import ApiClient, Exchange, archive, content_of, finish_of, message_of, reasoning_of, usage_problems
from .guards import precheck, reachable
from .recipes import answer_matches, recipe_spec
from .toolcalls import rule_nested, rule_single, tool_defs, tool_map, validate_args

__all__ = [
    "GARBLE_RULES",
    "SET_FILE",
    "Answer",
    "Case",
    "Finding",
    "QualitySet",
    "Thresholds",
    "archived_answers",
    "args_mismatch",
    "detect_garble",
    "garble_check",
    "judge_json",
    "judge_needle",
    "judge_number",
    "judge_tool",
    "judged",
    "load_quality_set",
    "needle_code",
    "run_gate",
    "score_rows",
]

SET_FILE = "quality_set.json"
KINDS = ("number", "json", "needle", "tool")
TOOL_RULES = ("single", "nested")
SEED = 1234


# ------------------------------------------------------------------------------------------------
# the evaluation set
# ------------------------------------------------------------------------------------------------

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
        source, text = f"runbook/serve/{SET_FILE}", resources.files(__package__).joinpath(SET_FILE).read_text()
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
def _shipped() -> QualitySet:
    return load_quality_set()


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
# garble detector (perplexity-free: repetition, charset, word shape)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    rule: str
    value: float
    threshold: str
    excerpt: str

    def describe(self) -> str:
        v = f"{self.value:.2f}" if isinstance(self.value, float) and not self.value.is_integer() else f"{self.value:g}"
        return f"{self.rule} {v} ({self.threshold}) in {self.excerpt!r}"


#: rule -> (threshold, what it catches); the numbers are used below, the text is printed in rows and docs
GARBLE_RULES: dict[str, tuple[str, str]] = {
    "repeat.token": ("same word >= 6 times in a row", "a token stuck in a loop"),
    "repeat.ngram": ("a 2-8 word sequence >= 4 times in a row", "a phrase loop"),
    "repeat.chars": ("a 1-16 character unit >= 8 times in a row over >= 16 characters (not whitespace, "
                     "digits or a rule line like ----)", "loops without spaces, e.g. \")\")\")\""),
    "repeat.distinct": ("distinct word 3-grams < 40 % of >= 24", "a text that keeps coming back to the same phrases"),
    "charset.replacement": ("U+FFFD >= 1", "bytes that do not decode (wrong vocabulary, broken detokenizer)"),
    "charset.control": ("control or unassigned characters >= 1 (tab and newline allowed)", "raw token bytes"),
    "charset.scripts": ("letters of >= 3 scripts (>= 2 letters each), or >= 2 words mixing alphabets",
                        "mixed-script noise"),
    "charset.special_tokens": ("chat-template tokens such as <|im_end|> or <｜Assistant｜> >= 1",
                               "a wrong chat template or tokenizer config"),
    "shape.words": ("word-shaped tokens < 60 % of >= 8", "token soup"),
    "shape.vowels": ("vowels outside 25-55 % of >= 40 Latin letters", "consonant soup, byte garbage"),
    "shape.word_length": ("mean word length outside 2.5-9 letters over >= 8 words", "sub-word salad"),
}

_TOKEN_RUN, _NGRAM_RUN, _NGRAM_MAX = 6, 4, 8
_CHAR_RUN, _CHAR_SPAN = 8, 16
_DISTINCT_MIN, _DISTINCT_N = 0.4, 24
_SHAPE_MIN, _SHAPE_N = 0.6, 8
_VOWELS, _VOWEL_N = (0.25, 0.55), 40
_WORDLEN, _WORDLEN_N = (2.5, 9.0), 8
_SCAN = 20_000                               # characters of one answer the detector reads
_CHAR_LOOP = re.compile(r"(.{1,16}?)\1{%d,}" % (_CHAR_RUN - 1), re.S)
_RULE_CHARS = set("-=_*#~.·─━ 0123456789")
_SPECIAL = re.compile(r"<[|｜][^<>\s]{1,40}[|｜]>")
_PUNCT = "\"'`“”‘’«»()[]{}<>.,;:!?*_~|/\\-–—…"
_WORDLIKE = re.compile(r"""^(?:[^\W\d_]+(?:['’-][^\W\d_]+)*                # words, don't, well-known
                          |[+-]?[$€£]?\d[\d,.:/-]*%?                          # 1,296 09:40 2026-01-31 25%
                          |[^\W\d_]+[-_]?\d+|\d+[^\W\d_]{1,3}                 # copper-4821 1st 10am
                          |[A-Za-z]+(?:_[A-Za-z0-9]+)+)$""", re.X)            # get_weather
_LETTERS = re.compile(r"^[^\W\d_]+$")
_NO_SPACE_SCRIPTS = {"CJK", "HANGUL", "THAI"}


def _script(ch: str) -> str:
    name = unicodedata.name(ch, "")
    first = name.split(" ", 1)[0] if name else "UNKNOWN"
    return "CJK" if first in ("HIRAGANA", "KATAKANA", "CJK") else first


def _excerpt(text: str, start: int, end: int, width: int = 80) -> str:
    a = max(0, start - 10)
    return text[a:min(end, a + width)]


def _words(text: str) -> list[tuple[int, int, str]]:
    """Whitespace tokens with their span and a normalised form (case-folded, outer punctuation off)."""
    return [(m.start(), m.end(), m.group().strip(_PUNCT).casefold()) for m in re.finditer(r"\S+", text)]


def _repeats(text: str, toks: list[tuple[int, int, str]]) -> list[Finding]:
    out: list[Finding] = []
    words = [t[2] for t in toks]
    best: dict[int, tuple[int, int]] = {}        # n -> (run length, start index)
    for n in range(1, _NGRAM_MAX + 1):
        i = 0
        while i + 2 * n <= len(words):
            gram = words[i:i + n]
            if not any(gram):
                i += 1
                continue
            k = 1
            while words[i + k * n:i + (k + 1) * n] == gram:
                k += 1
            if k > best.get(n, (1, 0))[0]:
                best[n] = (k, i)
            i += max(1, (k - 1) * n) if k > 1 else 1
    run, at = best.get(1, (1, 0))
    if run >= _TOKEN_RUN:
        out.append(Finding("repeat.token", run, f">= {_TOKEN_RUN}", _excerpt(text, toks[at][0], toks[at + run - 1][1])))
    grams = [(k, n, i) for n, (k, i) in best.items() if n > 1 and k >= _NGRAM_RUN]
    if grams:
        k, n, i = max(grams, key=lambda g: g[0] * g[1])
        out.append(Finding("repeat.ngram", k, f">= {_NGRAM_RUN} ({n}-word unit)",
                           _excerpt(text, toks[i][0], toks[i + k * n - 1][1])))
    loops = []
    for m in _CHAR_LOOP.finditer(text[:_SCAN]):
        unit = m.group(1)
        if not unit.strip() or (len(set(unit)) == 1 and unit[0] in _RULE_CHARS) or len(m.group()) < _CHAR_SPAN:
            continue
        loops.append((len(m.group()) // len(unit), m))
    if loops:
        k, m = max(loops, key=lambda x: len(x[1].group()))
        out.append(Finding("repeat.chars", k, f">= {_CHAR_RUN} repeats over >= {_CHAR_SPAN} chars",
                           _excerpt(text, m.start(), m.end())))
    content = [w for w in words if w]
    tri = [tuple(content[i:i + 3]) for i in range(len(content) - 2)]
    if len(tri) >= _DISTINCT_N:
        ratio = len(set(tri)) / len(tri)
        if ratio < _DISTINCT_MIN:
            out.append(Finding("repeat.distinct", round(ratio, 3), f">= {_DISTINCT_MIN} of {len(tri)} 3-grams",
                               text[:80]))
    return out


def _charset(text: str, toks: list[tuple[int, int, str]]) -> list[Finding]:
    out: list[Finding] = []
    bad = text.count("\ufffd")
    if bad:
        i = text.index("\ufffd")
        out.append(Finding("charset.replacement", bad, "0 allowed", _excerpt(text, i, i + 40)))
    ctrl = [i for i, ch in enumerate(text) if ch not in "\t\n\r"
            and unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn")]
    if ctrl:
        out.append(Finding("charset.control", len(ctrl), "0 allowed", _excerpt(text, ctrl[0], ctrl[0] + 40)))
    counts: dict[str, int] = {}
    for ch in text:
        if ch.isalpha():
            s = _script(ch)
            counts[s] = counts.get(s, 0) + 1
    scripts = sorted(s for s, n in counts.items() if n >= 2)
    mixed = []
    for a, b, _ in toks:
        letters = {_script(ch) for ch in text[a:b] if ch.isalpha()} - _NO_SPACE_SCRIPTS
        if len(letters) > 1:
            mixed.append((a, b))
    if len(scripts) >= 3:
        out.append(Finding("charset.scripts", len(scripts), f"< 3 scripts ({', '.join(scripts)})", text[:80]))
    elif len(mixed) >= 2:
        out.append(Finding("charset.scripts", len(mixed), "< 2 words mixing alphabets",
                           _excerpt(text, mixed[0][0], mixed[1][1])))
    special = _SPECIAL.findall(text)
    if special:
        m = _SPECIAL.search(text)
        out.append(Finding("charset.special_tokens", len(special), "0 allowed", _excerpt(text, m.start(), m.end() + 30)))
    return out


def _shape(text: str, toks: list[tuple[int, int, str]]) -> list[Finding]:
    out: list[Finding] = []
    words = [w for _, _, w in toks if w]
    if len(words) >= _SHAPE_N:
        share = sum(1 for w in words if _WORDLIKE.match(w)) / len(words)
        if share < _SHAPE_MIN:
            out.append(Finding("shape.words", round(share, 3), f">= {_SHAPE_MIN} of {len(words)} words", text[:80]))
    latin = [ch for ch in text.casefold() if "a" <= ch <= "z"]
    if len(latin) >= _VOWEL_N:
        ratio = sum(1 for ch in latin if ch in "aeiou") / len(latin)
        if not _VOWELS[0] <= ratio <= _VOWELS[1]:
            out.append(Finding("shape.vowels", round(ratio, 3), f"{_VOWELS[0]}-{_VOWELS[1]} of {len(latin)} letters",
                               text[:80]))
    alpha = [w for w in words if _LETTERS.match(w) and not ({_script(c) for c in w} & _NO_SPACE_SCRIPTS)]
    if len(alpha) >= _WORDLEN_N:
        mean = sum(map(len, alpha)) / len(alpha)
        if not _WORDLEN[0] <= mean <= _WORDLEN[1]:
            out.append(Finding("shape.word_length", round(mean, 2), f"{_WORDLEN[0]}-{_WORDLEN[1]} over {len(alpha)} words",
                               text[:80]))
    return out


def detect_garble(text: str) -> list[Finding]:
    """Every garble rule that fires on ``text`` (empty = looks like language). Short answers (a number,
    a passphrase) are only judged by the rules that need no length (loops, charset)."""
    text = text or ""
    toks = _words(text[:_SCAN])
    return _repeats(text, toks) + _charset(text[:_SCAN], toks) + _shape(text[:_SCAN], toks)


@dataclass
class Answer:
    """One model output found in the step's archives: its case, which part of the response, the text."""
    source: str                  # <case>#<exchange>[.<part>]
    evidence: str                # the archive it came from (run-relative)
    text: str
    findings: list[Finding] = field(default_factory=list)


_CLIPPED = re.compile(r"…\[\d+ chars clipped\]…")


def _parts(body: dict[str, Any]) -> list[tuple[str, str]]:
    parts = [("", content_of(body))]
    if reasoning_of(body):
        parts.append(("reasoning", reasoning_of(body)))
    for i, c in enumerate(message_of(body).get("tool_calls") or []):
        args = (c.get("function") or {}).get("arguments") if isinstance(c, dict) else None
        if isinstance(args, str):
            parts.append((f"tool_calls[{i}]", args))
    return [(p, t) for p, t in parts if t]


def archived_answers(step) -> list[Answer]:
    """Every answer the step received so far, read back from its archives (``raw/<step>/*.json``, what
    ``archive()`` wrote): content, reasoning and tool-call arguments of each HTTP 200 choice. A long
    text the archive clipped is judged in its kept head and tail (the clip marker is not text)."""
    out: list[Answer] = []
    raw_dir = Path(step.raw_dir)
    for path in sorted(raw_dir.glob("*.json")) if raw_dir.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        exchanges = doc.get("exchanges") if isinstance(doc, dict) else None
        if not isinstance(exchanges, list):
            continue
        case = doc.get("case") or path.stem
        rel = str(path.relative_to(step.run.path))
        for i, ex in enumerate(exchanges):
            resp = (ex or {}).get("response") or {}
            body = resp.get("body")
            if resp.get("status") != 200 or not isinstance(body, dict):
                continue
            for part, text in _parts(body):
                source = f"{case}#{i}" + (f".{part}" if part else "")
                out.append(Answer(source, rel, text))
    return out


def garble_check(step, *, judged: bool, name: str = "quality.garble") -> Check:
    """The detector over every archived answer of the step: PASS when none is flagged, FAIL naming each
    flagged answer (rule, value, threshold, excerpt); N/A on random weights, with the same findings."""
    answers = archived_answers(step)
    for a in answers:
        a.findings = [f for seg in _CLIPPED.split(a.text) for f in detect_garble(seg)]
    flagged = [a for a in answers if a.findings]
    report = [{"source": a.source, "evidence": a.evidence, "chars": len(a.text), "excerpt": a.text[:120],
               "findings": [f.__dict__ for f in a.findings]} for a in answers]
    ev = [step.raw(f"{name}.json", json.dumps({"rules": GARBLE_RULES, "answers": report}, indent=1, ensure_ascii=False))]
    ev += sorted({a.evidence for a in flagged})
    lines = [f"{a.source}: " + "; ".join(f.describe() for f in a.findings) for a in flagged]
    counts = {r: sum(1 for a in flagged for f in a.findings if f.rule == r) for r in GARBLE_RULES}
    data = {"answers": len(answers), "flagged": len(flagged), "by_rule": {r: n for r, n in counts.items() if n},
            "flagged_sources": [a.source for a in flagged]}
    step.data.setdefault("quality", {})["garble"] = data
    expected = (f"no answer flagged by the garble rules ({len(GARBLE_RULES)}: repetition, charset, word shape; "
                "docs/quality.md)")
    if not judged:
        seen = (f"{len(flagged)} of {len(answers)} answers flagged, e.g. {lines[0][:200]}" if flagged
                else f"none of {len(answers)} answers flagged")
        c = not_applicable(name, "lab: random-weight tiny model, whose output is garble by construction (the "
                                 f"detector ran: {seen})", node="head", expected=expected + " on real weights")
        c.evidence, c.data = ev, data
        return c
    if not answers:
        return check(name, False, node="head", observed=f"no model answer archived in raw/{step.name}",
                     expected=expected, fix="the requests before this row failed: see their rows", evidence=ev,
                     data=data)
    return check(name, not flagged, node="head",
                 observed=("; ".join(lines)[:1500] if flagged else f"{len(answers)} answers, none flagged"),
                 expected=expected,
                 fix="the model speaks garbage: check the weights' dtype and revision (02/03: Engram rows read with "
                     "the wrong dtype gave fluent garbage), the quantisation, the chat template, and a cold-start "
                     "or prefix-cache garble (restart and compare)", evidence=ev, data=data)


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
    step: Any
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
        ev = archive(self.step, name, ex, **archived)
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


def run_gate(step, client: ApiClient | None, *, quality_set: QualitySet | None = None) -> CheckList:
    """Every case of the set, ``quality.score``, then ``quality.garble`` over every answer the step
    archived. Judged on real weights only (``RECIPE`` exl3-v41 / dspark-v4, not a rehearsal)."""
    early = precheck(step, client, "quality")
    if early is not None:
        return early
    first = reachable(step, client, name="quality.server.reachable")
    if first.failed:
        return CheckList([first])
    qs = quality_set or _shipped()
    spec = recipe_spec(step.profile)
    on_weights = judged(step.profile)
    key = step.profile.recipe if on_weights else "lab"
    if key not in qs.recipes:
        raise RunbookError(f"{qs.source}: no thresholds for RECIPE={key}", expected=f"recipes.{key}",
                           fix=f"add recipes.{key} (min_score, required, needle_tokens) to {qs.source}")
    limits = qs.recipes[key]
    gate = _Gate(step, client, dict(spec.thinking_off), limits,
                 client.server.max_model_len or step.profile.max_model_len)
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
    rows.add(garble_check(step, judged=on_weights))
    step.data.setdefault("quality", {}).update(
        recipe=step.profile.recipe, judged=on_weights, thresholds=key,
        rows={c.name: c.status.value for c in rows if c.name != "quality.garble"})
    return rows
