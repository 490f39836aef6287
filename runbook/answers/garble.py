"""The garble detector (perplexity-free: repetition, charset, word shape) and ``quality.garble``, its row
over every answer a step archived.

Run by the quality gate in step 05 (``quality.run_gate``) and by step 06 (``vision_tools.run``); the rules and
their thresholds are in ``GARBLE_RULES`` and docs/quality.md. No file I/O: ``garble_check`` reads the
exchanges the step's cases kept in their :class:`~runbook.api.server_info.Archive` (what the step's run writes
to ``raw/<step>/*.json``) and adds its report and data to it.
"""
from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from ..checks import Check, check, not_applicable
from ..api.server_info import Archive, content_of, message_of, reasoning_of

__all__ = ["GARBLE_RULES", "ArchivedAnswer", "GarbleSign", "archived_answers", "detect_garble", "garble_check"]


@dataclass(frozen=True)
class GarbleSign:
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


def _repeats(text: str, toks: list[tuple[int, int, str]]) -> list[GarbleSign]:
    out: list[GarbleSign] = []
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
        out.append(GarbleSign("repeat.token", run, f">= {_TOKEN_RUN}", _excerpt(text, toks[at][0], toks[at + run - 1][1])))
    grams = [(k, n, i) for n, (k, i) in best.items() if n > 1 and k >= _NGRAM_RUN]
    if grams:
        k, n, i = max(grams, key=lambda g: g[0] * g[1])
        out.append(GarbleSign("repeat.ngram", k, f">= {_NGRAM_RUN} ({n}-word unit)",
                           _excerpt(text, toks[i][0], toks[i + k * n - 1][1])))
    loops = []
    for m in _CHAR_LOOP.finditer(text[:_SCAN]):
        unit = m.group(1)
        if not unit.strip() or (len(set(unit)) == 1 and unit[0] in _RULE_CHARS) or len(m.group()) < _CHAR_SPAN:
            continue
        loops.append((len(m.group()) // len(unit), m))
    if loops:
        k, m = max(loops, key=lambda x: len(x[1].group()))
        out.append(GarbleSign("repeat.chars", k, f">= {_CHAR_RUN} repeats over >= {_CHAR_SPAN} chars",
                           _excerpt(text, m.start(), m.end())))
    content = [w for w in words if w]
    tri = [tuple(content[i:i + 3]) for i in range(len(content) - 2)]
    if len(tri) >= _DISTINCT_N:
        ratio = len(set(tri)) / len(tri)
        if ratio < _DISTINCT_MIN:
            out.append(GarbleSign("repeat.distinct", round(ratio, 3), f">= {_DISTINCT_MIN} of {len(tri)} 3-grams",
                               text[:80]))
    return out


def _charset(text: str, toks: list[tuple[int, int, str]]) -> list[GarbleSign]:
    out: list[GarbleSign] = []
    bad = text.count("\ufffd")
    if bad:
        i = text.index("\ufffd")
        out.append(GarbleSign("charset.replacement", bad, "0 allowed", _excerpt(text, i, i + 40)))
    ctrl = [i for i, ch in enumerate(text) if ch not in "\t\n\r"
            and unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn")]
    if ctrl:
        out.append(GarbleSign("charset.control", len(ctrl), "0 allowed", _excerpt(text, ctrl[0], ctrl[0] + 40)))
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
        out.append(GarbleSign("charset.scripts", len(scripts), f"< 3 scripts ({', '.join(scripts)})", text[:80]))
    elif len(mixed) >= 2:
        out.append(GarbleSign("charset.scripts", len(mixed), "< 2 words mixing alphabets",
                           _excerpt(text, mixed[0][0], mixed[1][1])))
    special = _SPECIAL.findall(text)
    if special:
        m = _SPECIAL.search(text)
        out.append(GarbleSign("charset.special_tokens", len(special), "0 allowed", _excerpt(text, m.start(), m.end() + 30)))
    return out


def _shape(text: str, toks: list[tuple[int, int, str]]) -> list[GarbleSign]:
    out: list[GarbleSign] = []
    words = [w for _, _, w in toks if w]
    if len(words) >= _SHAPE_N:
        share = sum(1 for w in words if _WORDLIKE.match(w)) / len(words)
        if share < _SHAPE_MIN:
            out.append(GarbleSign("shape.words", round(share, 3), f">= {_SHAPE_MIN} of {len(words)} words", text[:80]))
    latin = [ch for ch in text.casefold() if "a" <= ch <= "z"]
    if len(latin) >= _VOWEL_N:
        ratio = sum(1 for ch in latin if ch in "aeiou") / len(latin)
        if not _VOWELS[0] <= ratio <= _VOWELS[1]:
            out.append(GarbleSign("shape.vowels", round(ratio, 3), f"{_VOWELS[0]}-{_VOWELS[1]} of {len(latin)} letters",
                               text[:80]))
    alpha = [w for w in words if _LETTERS.match(w) and not ({_script(c) for c in w} & _NO_SPACE_SCRIPTS)]
    if len(alpha) >= _WORDLEN_N:
        mean = sum(map(len, alpha)) / len(alpha)
        if not _WORDLEN[0] <= mean <= _WORDLEN[1]:
            out.append(GarbleSign("shape.word_length", round(mean, 2), f"{_WORDLEN[0]}-{_WORDLEN[1]} over {len(alpha)} words",
                               text[:80]))
    return out


def detect_garble(text: str) -> list[GarbleSign]:
    """Every garble rule that fires on ``text`` (empty = looks like language). Short answers (a number,
    a passphrase) are only judged by the rules that need no length (loops, charset)."""
    text = text or ""
    toks = _words(text[:_SCAN])
    return _repeats(text, toks) + _charset(text[:_SCAN], toks) + _shape(text[:_SCAN], toks)


@dataclass
class ArchivedAnswer:
    """One model output found in the step's archives: its case, which part of the response, the text."""
    source: str                  # <case>#<exchange>[.<part>]
    evidence: str                # the archive it came from (run-relative)
    text: str
    findings: list[GarbleSign] = field(default_factory=list)


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


def archived_answers(rec: Archive) -> list[ArchivedAnswer]:
    """Every answer the step received so far, read back from its archives (``rec``'s ``*.json`` files, what
    ``archive()`` kept for ``raw/<step>/``): content, reasoning and tool-call arguments of each HTTP 200
    choice. A long text the archive clipped is judged in its kept head and tail (the clip marker is not text)."""
    out: list[ArchivedAnswer] = []
    for fname in sorted(n for n in rec.files if n.endswith(".json")):
        try:
            doc = json.loads(rec.files[fname])
        except ValueError:
            continue
        exchanges = doc.get("exchanges") if isinstance(doc, dict) else None
        if not isinstance(exchanges, list):
            continue
        case = doc.get("case") or fname[:-len(".json")]
        rel = f"{rec.prefix}/{fname}"
        for i, ex in enumerate(exchanges):
            resp = (ex or {}).get("response") or {}
            body = resp.get("body")
            if resp.get("status") != 200 or not isinstance(body, dict):
                continue
            for part, text in _parts(body):
                source = f"{case}#{i}" + (f".{part}" if part else "")
                out.append(ArchivedAnswer(source, rel, text))
    return out


def garble_check(rec: Archive, *, judged: bool, name: str = "quality.garble") -> Check:
    """The detector over every archived answer of the step: PASS when none is flagged, FAIL naming each
    flagged answer (rule, value, threshold, excerpt); N/A on random weights, with the same findings."""
    answers = archived_answers(rec)
    for a in answers:
        a.findings = [f for seg in _CLIPPED.split(a.text) for f in detect_garble(seg)]
    flagged = [a for a in answers if a.findings]
    report = [{"source": a.source, "evidence": a.evidence, "chars": len(a.text), "excerpt": a.text[:120],
               "findings": [f.__dict__ for f in a.findings]} for a in answers]
    ev = [rec.raw(f"{name}.json", json.dumps({"rules": GARBLE_RULES, "answers": report}, indent=1, ensure_ascii=False))]
    ev += sorted({a.evidence for a in flagged})
    lines = [f"{a.source}: " + "; ".join(f.describe() for f in a.findings) for a in flagged]
    counts = {r: sum(1 for a in flagged for f in a.findings if f.rule == r) for r in GARBLE_RULES}
    data = {"answers": len(answers), "flagged": len(flagged), "by_rule": {r: n for r, n in counts.items() if n},
            "flagged_sources": [a.source for a in flagged]}
    rec.data.setdefault("quality", {})["garble"] = data
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
        return check(name, False, node="head", observed=f"no model answer archived in {rec.prefix}",
                     expected=expected, fix="the requests before this row failed: see their rows", evidence=ev,
                     data=data)
    return check(name, not flagged, node="head",
                 observed=("; ".join(lines)[:1500] if flagged else f"{len(answers)} answers, none flagged"),
                 expected=expected,
                 fix="the model speaks garbage: check the weights' dtype and revision (02/03: Engram rows read with "
                     "the wrong dtype gave fluent garbage), the quantisation, the chat template, and a cold-start "
                     "or prefix-cache garble (restart and compare)", evidence=ev, data=data)
