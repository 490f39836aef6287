"""``.env`` parsing with line numbers: profiles (:mod:`runbook.profile`) and the secrets file
(:mod:`runbook.secrets`) share it. ``KEY=VALUE`` lines, ``export KEY=VALUE``, quotes, ``# comments``.
"""
from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import ProfileIssue


@dataclass(frozen=True)
class EnvEntry:
    """One ``KEY=VALUE`` assignment and where it came from."""
    key: str
    value: str
    line: int
    path: str


_KEY_SYNTAX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: what every error about a secret in a profile says (secrets.py re-exports it)
PROFILE_SECRETS_HINT = ("secrets never live in a profile; export it or put it in "
                        "~/.config/spark-runbook/secrets.env (mode 0600)")

# ASCII controls but tab; every other character is judged by its Unicode category below
_ASCII_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f]|[^\x00-\x7f]")
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# shown as nothing although not of a format category: Hangul fillers, the braille blank, variation selectors
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _invisible(ch: str) -> bool:
    o = ord(ch)
    return (unicodedata.category(ch) in ("Cc", "Cf", "Cn", "Zl", "Zp") or ch in _BLANK
            or 0xE0000 <= o <= 0xE007F or 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF)


def invisible_at(text: str) -> int:
    """The index of the first character in ``text`` that a reader cannot see or that reorders what they see
    (controls but tab, format characters such as zero-width and bidirectional controls and the TAG block
    U+E0000-E007F, line and paragraph separators, unassigned code points, fillers), or -1."""
    for m in _ASCII_CONTROL.finditer(text):
        if m.group() < "\x80" or _invisible(m.group()):
            return m.start()
    return -1


def describe_invisible(ch: str) -> str:
    """``bidirectional control character U+202E (RIGHT-TO-LEFT OVERRIDE)``: never the character itself."""
    what = "bidirectional control character" if ch in _BIDI else "invisible character"
    name = unicodedata.name(ch, "")
    return f"{what} U+{ord(ch):04X}" + (f" ({name})" if name else "")


def _parse_value(raw: str) -> tuple[str, str | None, str]:
    """Return (value, error, trailing comment). Handles quotes and trailing ``# comments``."""
    raw = raw.strip()
    if raw[:1] in ("'", '"'):
        quote = raw[0]
        out: list[str] = []
        i = 1
        while i < len(raw):
            ch = raw[i]
            if quote == '"' and ch == "\\" and i + 1 < len(raw) and raw[i + 1] in '"\\$`':
                out.append(raw[i + 1])
                i += 2
                continue
            if ch == quote:
                rest = raw[i + 1:].strip()
                if rest and not rest.startswith("#"):
                    return "", f"unexpected text after the closing quote: {rest!r}", ""
                return "".join(out), None, rest
            out.append(ch)
            i += 1
        return "", f"unterminated {quote} quote", ""
    # unquoted: a '#' preceded by whitespace starts a comment
    m = re.search(r"\s#", raw)
    comment = ""
    if m:
        raw, comment = raw[:m.start()], raw[m.start():].strip()
    return raw.strip(), None, comment


def parse_env_text(text: str, path: str = "<text>", *, known_keys: Iterable[str] = (),
                   is_secret: Callable[[str], bool] = lambda key: False,
                   mask: Callable[[str], str] = lambda text: text,
                   secret_in: Callable[[str], bool] | None = None) -> tuple[list[EnvEntry], list[ProfileIssue]]:
    """Parse ``.env`` text into entries (in file order) and syntax issues.

    ``mask`` hides token shapes in what an issue echoes (a key name shaped like a token is refused, never shown);
    ``secret_in`` (a profile's: :func:`runbook.secrets.has_secret_form`) refuses a comment, whole-line or trailing,
    that holds a secret form: a comment is still in the file that gets shared.

    Lines end at ``\n`` only (a trailing ``\r`` is dropped here; :func:`load_profile` rejects CRLF
    profiles, the secrets file tolerates them)."""
    known = set(known_keys)
    entries: list[EnvEntry] = []
    issues: list[ProfileIssue] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        stripped = line.strip().lstrip("\ufeff")
        if stripped.startswith("#") and secret_in is not None and secret_in(stripped):
            issues.append(_comment_issue(path, lineno))
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export "):].lstrip()
        if "=" not in stripped:
            # name the key when the line starts with one ("PORT: 8000", "PORT 8000")
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", stripped)
            word = m.group(0) if m else ""
            key = word if word and (word.upper() in known or word.isupper()) else "<syntax>"
            shown = "" if key != "<syntax>" and is_secret(key) else f": {mask(stripped[:60])!r}"
            issues.append(ProfileIssue(key, f"not a KEY=VALUE line{shown}",
                                       fix=f"write {key}=VALUE ('=' between key and value, no ':' or space)"
                                       if key != "<syntax>" else
                                       "write KEY=VALUE, or start the line with # for a comment",
                                       path=path, line=lineno))
            continue
        key, _, raw = stripped.partition("=")
        key = key.strip()
        if mask(key) != key:                  # a token pasted as a key name: never echoed
            issues.append(ProfileIssue("<key>", "the key name looks like a token (not shown here); "
                                       + PROFILE_SECRETS_HINT, fix=f"delete line {lineno} (and revoke the token if "
                                       "the file was ever shared or committed)", path=path, line=lineno))
            continue
        if not _KEY_SYNTAX.fullmatch(key):
            issues.append(ProfileIssue(mask(key) or "<syntax>", f"invalid key name {mask(key)!r}",
                                       fix="keys are UPPER_CASE letters, digits and _",
                                       path=path, line=lineno))
            continue
        value, err, comment = _parse_value(raw)
        if err:
            issues.append(ProfileIssue(key, mask(err), fix="close the quote or remove it",
                                       path=path, line=lineno))
            continue
        if comment and secret_in is not None and secret_in(comment):
            issues.append(_comment_issue(path, lineno))
            continue
        entries.append(EnvEntry(key, value, lineno, path))
    return entries, issues


def _comment_issue(path: str, lineno: int) -> ProfileIssue:
    return ProfileIssue("<comment>", "a comment holds what looks like a token or a secret key's value (not shown "
                        "here); " + PROFILE_SECRETS_HINT, fix=f"delete the value from line {lineno} (and revoke it "
                        "if the file was ever shared or committed)", path=path, line=lineno)


def parse_env_file(path: str | os.PathLike) -> tuple[list[EnvEntry], list[ProfileIssue]]:
    """Parse a ``.env`` file with no key knowledge (the secrets file); see :func:`parse_env_text`."""
    p = Path(path)
    return parse_env_text(p.read_text(encoding="utf-8"), str(p))
