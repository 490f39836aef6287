"""What the reference server answers in ``answer_mode`` correct, garbage and garble: the reference from an
answer key, a plausible wrong answer derived from it, or broken text.

The answer key defaults to the quality gate's set (``runbook/answers/quality_set.json``: ``cases[].prompt`` and
``cases[].reference``); a case matches when the last user message ends with its prompt. Every answer is
deterministic (seeded by the conversation) and made of whitespace units, the tokens ``/tokenize`` counts.
docs/quality.md describes the modes.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_ANSWER_KEY", "Answer", "answer_for", "load_answer_key"]

_UNIT = re.compile(r"\S+\s*")
DEFAULT_ANSWER_KEY = "runbook/answers/quality_set.json"
#: plausible replacements for a string value in a near-miss answer
_ALTERNATES = ("Lyon", "Berlin", "Madrid", "Oslo", "sports", "news", "relevance", "asc", "EUR")


@dataclass(frozen=True)
class Answer:
    """What one request is answered with: content tokens (whitespace units, as /tokenize counts) or
    tool calls (``{"name", "arguments"}``; ``pieces`` then holds the call's raw text, for its token count
    and for the truncated form)."""
    pieces: tuple[str, ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()


def load_answer_key(path: str = "") -> tuple[tuple[str, tuple[str, Any]], ...]:
    """``(prompt, (reference kind, value))`` for each case of an answer key; ValueError names the file
    and the entry. Read again when the file changes."""
    try:
        st = Path(path).stat() if path else None
    except OSError:
        st = None
    return _load_answer_key(path, (st.st_mtime_ns, st.st_size) if st else None)


@lru_cache(maxsize=8)
def _load_answer_key(path: str, _version: tuple[int, int] | None) -> tuple[tuple[str, tuple[str, Any]], ...]:
    where = path or DEFAULT_ANSWER_KEY
    try:
        text = (Path(path).read_text() if path else
                resources.files("runbook.answers").joinpath("quality_set.json").read_text())
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"RefConfig.answer_key={where}: cannot read it as JSON ({exc})") from None
    cases = doc.get("cases") if isinstance(doc, dict) else None
    out = []
    for i, c in enumerate(cases if isinstance(cases, list) else []):
        prompt = c.get("prompt") if isinstance(c, dict) else None
        ref = c.get("reference") if isinstance(c, dict) else None
        if (not isinstance(prompt, str) or not prompt.strip() or not isinstance(ref, dict) or len(ref) != 1
                or next(iter(ref)) not in ("content", "content_from", "tool_calls")):
            raise ValueError(f"RefConfig.answer_key={where}: cases[{i}] needs a prompt and a reference with one "
                             "of content | content_from | tool_calls")
        out.append((prompt.strip(), next(iter(ref.items()))))
    if not out:
        raise ValueError(f"RefConfig.answer_key={where}: no cases")
    return tuple(out)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _seeded(text: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big"))


def _wrong_leaf(v: Any, rng: random.Random) -> Any:
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + rng.choice((-2, -1, 1, 2, 10))
    if isinstance(v, float):
        return v + 1.5
    if isinstance(v, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        return f"{v[:8]}{int(v[8:]) % 28 + 1:02d}"                 # a day later (or the 1st)
    return rng.choice([a for a in _ALTERNATES if a.casefold() != str(v).casefold()])


def _near_miss(obj: Any, rng: random.Random) -> Any:
    """``obj`` with one leaf value changed: the shape a fluent but wrong model gives."""
    leaves: list[tuple[Any, Any]] = []

    def walk(o: Any) -> None:
        for k in (range(len(o)) if isinstance(o, list) else list(o)):
            if isinstance(o[k], (dict, list)) and o[k]:
                walk(o[k])
            else:
                leaves.append((o, k))

    out = json.loads(json.dumps(obj))
    if not isinstance(out, (dict, list)) or not out:
        return _wrong_leaf(out, rng)
    walk(out)
    parent, k = rng.choice(leaves)
    parent[k] = _wrong_leaf(parent[k], rng)
    return out


def _wrong_text(text: str, rng: random.Random) -> str:
    """A plausible wrong answer: a near-miss number, JSON with one wrong value, a passphrase with its
    digits moved, or the words in another order."""
    if re.fullmatch(r"-?\d+", text):
        return str(int(text) + rng.choice((-10, -2, -1, 1, 2, 9, 10, 100)))
    m = re.fullmatch(r"([A-Za-z]+-)(\d+)", text)
    if m:
        digits = m.group(2)
        moved = digits[1:] + digits[0]
        return m.group(1) + (moved if moved != digits else str((int(digits) + 1) % 10 ** len(digits)).zfill(len(digits)))
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, (dict, list)) and obj:
        return json.dumps(_near_miss(obj, rng))
    words = text.split()
    rng.shuffle(words)
    return " ".join(words if words != text.split() else words[::-1])


def _garble(rng: random.Random, last: str, max_tokens: int) -> Answer:
    """Broken output, one of three kinds: the lab's tiny model's two-character loop (to max_tokens),
    words with U+FFFD, a control character and letters of three scripts, or consonant soup."""
    kind = rng.randrange(3)
    if kind == 0:
        return Answer(('")',) * (max_tokens + 1))
    if kind == 1:
        words = (last.split() or ["answer"])[:12]
        noisy = []
        for i, w in enumerate(words):
            if i % 3 == 0:
                w = w[:2] + "\ufffd" + w[2:]
            elif i % 3 == 1:
                w = w.replace("a", "\u0430").replace("o", "\u043e").replace("e", "\u0435") + "\u0007"
            noisy.append(w + " ")
        return Answer(tuple(noisy) + ("\u6570\u636e\u03bb\u03cc\u03b3\u03bf\u03c2 ",))
    consonants = "bcdfghjklmnpqrstvwxz"
    return Answer(tuple("".join(rng.choice(consonants) for _ in range(rng.randint(7, 13))) + " "
                        for _ in range(24)))


def answer_for(mode: str, req: dict[str, Any], key_path: str, max_tokens: int) -> tuple[Answer | None, str]:
    """The answer to a chat request in ``mode`` (not filler), or (None, why it is refused)."""
    msgs = [m for m in req.get("messages") or [] if isinstance(m, dict)]
    conversation = "\n".join(_text(m) for m in msgs)
    rng = _seeded(conversation)
    last = _text(msgs[-1]).strip() if msgs else ""
    if mode == "garble":
        return _garble(rng, last, max_tokens), ""
    who = f"refserver answer_mode={mode}"
    if not msgs or msgs[-1].get("role") != "user":
        return None, f"{who}: the last message is not a user message (only single questions are known)"
    hits = [(p, ref) for p, ref in load_answer_key(key_path) if last.endswith(p)]
    if not hits:
        return None, (f"{who}: no reference answer for this prompt (it ends {last[-80:]!r}; answer key "
                      f"{key_path or DEFAULT_ANSWER_KEY})")
    _, (kind, value) = max(hits, key=lambda h: len(h[0]))
    if kind == "tool_calls":
        if req.get("stream"):
            return None, f"{who}: streamed tool calls are not implemented"
        offered = {(t.get("function") or {}).get("name") for t in req.get("tools") or [] if isinstance(t, dict)}
        calls = [{"name": c["name"], "arguments": c.get("arguments", {})} for c in value]
        missing = [c["name"] for c in calls if c["name"] not in offered]
        if missing:
            return None, f"{who}: the reference calls {missing}, which the request does not offer (tools: {sorted(offered)})"
        if mode == "garbage":
            calls = [dict(c, arguments=_near_miss(c["arguments"], rng)) for c in calls]
        raw = "".join(f"<tool_call>{json.dumps({'name': c['name'], 'arguments': c['arguments']})}</tool_call>"
                      for c in calls)
        return Answer(tuple(_UNIT.findall(raw)), tuple(calls)), ""
    if kind == "content_from":
        m = re.search(value, conversation)
        if not m:
            return None, f"{who}: the reference pattern {value!r} is not in the conversation"
        text = m.group(1)
    else:
        text = str(value)
    if mode == "garbage":
        text = _wrong_text(text, rng)
    return Answer(tuple(_UNIT.findall(text))), ""
