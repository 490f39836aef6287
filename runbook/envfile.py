"""``.env`` parsing with line numbers: profiles (:mod:`runbook.profile`) and the secrets file
(:mod:`runbook.secrets`) share it. ``KEY=VALUE`` lines, ``export KEY=VALUE``, quotes, ``# comments``.
"""
from __future__ import annotations

import os
import re
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


def _parse_value(raw: str) -> tuple[str, str | None]:
    """Return (value, error). Handles quotes and trailing ``# comments``."""
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
                    return "", f"unexpected text after the closing quote: {rest!r}"
                return "".join(out), None
            out.append(ch)
            i += 1
        return "", f"unterminated {quote} quote"
    # unquoted: a '#' preceded by whitespace starts a comment
    m = re.search(r"\s#", raw)
    if m:
        raw = raw[:m.start()]
    return raw.strip(), None


def parse_env_text(text: str, path: str = "<text>", *, known_keys: Iterable[str] = (),
                   is_secret: Callable[[str], bool] = lambda key: False,
                   mask: Callable[[str], str] = lambda text: text) -> tuple[list[EnvEntry], list[ProfileIssue]]:
    """Parse ``.env`` text into entries (in file order) and syntax issues.

    Lines end at ``\n`` only (a trailing ``\r`` is dropped here; :func:`load_profile` rejects CRLF
    profiles, the secrets file tolerates them)."""
    known = set(known_keys)
    entries: list[EnvEntry] = []
    issues: list[ProfileIssue] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        stripped = line.strip().lstrip("\ufeff")
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
        if not _KEY_SYNTAX.fullmatch(key):
            issues.append(ProfileIssue(mask(key) or "<syntax>", f"invalid key name {mask(key)!r}",
                                       fix="keys are UPPER_CASE letters, digits and _",
                                       path=path, line=lineno))
            continue
        value, err = _parse_value(raw)
        if err:
            issues.append(ProfileIssue(key, mask(err), fix="close the quote or remove it",
                                       path=path, line=lineno))
            continue
        entries.append(EnvEntry(key, value, lineno, path))
    return entries, issues


def parse_env_file(path: str | os.PathLike) -> tuple[list[EnvEntry], list[ProfileIssue]]:
    """Parse a ``.env`` file with no key knowledge (the secrets file); see :func:`parse_env_text`."""
    p = Path(path)
    return parse_env_text(p.read_text(encoding="utf-8"), str(p))
