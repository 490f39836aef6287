"""Secrets (HF token, API key) from the environment or a 0600 file, and the redactor that keeps
them out of every log, command record and notebook.

Secrets never live in a profile. Lookup order: ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN`` and
``VLLM_API_KEY`` in the environment, then ``~/.config/spark-runbook/secrets.env`` (or the file
named by ``RUNBOOK_SECRETS_FILE``), which must be mode 0600 and owned by the current user.
"""
from __future__ import annotations

import base64
import json
import os
import re
import tempfile
import stat
import threading
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .envfile import PROFILE_SECRETS_HINT, invisible_at, describe_invisible, parse_env_file
from .errors import ProfileError, ProfileIssue

__all__ = [
    "Secrets", "SecretsError", "Redactor", "load_secrets", "redactor_from_env", "default_redactor",
    "reset_default_redactor", "register_secret", "default_secrets_file", "generate_api_key", "HF_TOKEN_RE",
    "MASK", "PROFILE_SECRETS_HINT", "encoded_forms", "has_secret_form",
]

MASK = "***"
#: token shapes masked wherever they appear (and refused in a profile): Hugging Face user and org tokens, the base64
#: of an hf_ token ("hf_" encodes as "aGZf"), GitHub tokens
HF_TOKEN_RE = re.compile(r"(?:hf_|api_org_)[A-Za-z0-9]{20,}|aGZf[A-Za-z0-9+/]{24,}={0,2}|gh[pousr]_[A-Za-z0-9]{30,}"
                         r"|github_pat_[A-Za-z0-9_]{40,}")


def mask_tokens(text: str) -> str:
    """Text from a profile line that goes into an error: never a token."""
    return HF_TOKEN_RE.sub(MASK, text)
_BEARER_RE = re.compile(r"(\bBearer\s+|(?i:authorization:\s*(?:bearer|basic|token)\s+))([^\s\"',;]+)")
# NAME=value, NAME: value, "name": "value", 'name': 'value', --flag value: the name says the value is a secret
_ASSIGN_RE = re.compile(
    r"(?i)((?:--api-key[= ]|--hf-token[= ]|--token[= ]|\b(?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN|VLLM_API_KEY|"
    r"[A-Z_-]*API[_-]?KEYS?|[A-Z_-]*[_-]TOKEN|token|access_token|[A-Z_-]*PASSWORD|passwd|[A-Z_-]*SECRET|"
    r"x-api-key)\s*[=:]\s*)[\"']?)([^\s\"',;&]+)")
# a quoted key with a string value ("api_key": "…", 'password': '…'): credential names only, so that JSON such as
# "t_first_token": 0.13 or a generated "token": "Hello" keeps its values
_JSON_KEY_RE = re.compile(
    r"(?i)([\"'](?:[\w-]*api[_-]?keys?|apikey|access[_-]?token|auth[_-]?token|hf[_-]?token|refresh[_-]?token|"
    r"id[_-]?token|bearer[_-]?token|[\w-]*password|passwd|[\w-]*secret|private[_-]?key)[\"']\s*:\s*[\"'])"
    r"([^\"']+)")
# a URL query parameter that carries a credential (?token=, &api_key=, &sig=)
_QUERY_RE = re.compile(r"(?i)([?&](?:[\w-]*token|api[_-]?key|apikey|key|auth|sig|signature|password|secret|code)=)"
                       r"([^&\s#\"'<>]+)")
# credentials in a URL: scheme://user:password@host (or a token as the user)
_USERINFO_RE = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)([^/\s:@]+(?::[^/\s@]*)?)@")
# the hex of an hf_ token ("hf_" is 68 66 5f), any case
_HF_HEX_RE = re.compile(r"(?i)68665f(?:[0-9a-f]{2}){20,}")
MIN_SECRET_LEN = 4  # shorter values would mask unrelated text; Bearer/assignment patterns still apply

HF_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
API_ENV = ("VLLM_API_KEY",)
FILE_KEYS = {"HF_TOKEN": "hf_token", "HUGGING_FACE_HUB_TOKEN": "hf_token", "VLLM_API_KEY": "api_key"}


class SecretsError(ProfileError):
    """The secrets file is unsafe or unreadable (exit code 2, like a profile problem)."""


def default_secrets_file(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(os.path.expanduser(env.get("RUNBOOK_SECRETS_FILE") or "~/.config/spark-runbook/secrets.env"))


def _mask(value: str) -> str:
    return MASK if value else "''"


@dataclass(frozen=True, repr=False)
class Secrets:
    """The secrets in effect. ``repr``/``str`` never show a value."""
    hf_token: str = ""
    api_key: str = ""
    hf_token_source: str = ""  # e.g. "env:HF_TOKEN" or "file:/root/.config/spark-runbook/secrets.env"
    api_key_source: str = ""

    def __repr__(self) -> str:
        return (f"Secrets(hf_token={_mask(self.hf_token)}, api_key={_mask(self.api_key)}, "
                f"hf_token_source={self.hf_token_source!r}, api_key_source={self.api_key_source!r})")

    __str__ = __repr__

    def values(self) -> list[str]:
        return [v for v in (self.hf_token, self.api_key) if v]

    def redactor(self) -> "Redactor":
        return Redactor(self.values())

    def auth_headers(self) -> dict[str, str]:
        """``Authorization`` header for the API (empty when no key is configured)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _check_file_mode(path: Path) -> None:
    st = path.stat()
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        raise SecretsError([ProfileIssue(
            "secrets.env", f"secrets file is mode {mode:04o}: readable by group/others, refusing to read it",
            fix=f"chmod 600 {path}", path=str(path))])
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise SecretsError([ProfileIssue(
            "secrets.env", f"secrets file is owned by uid {st.st_uid}, not by you (uid {os.getuid()})",
            fix=f"chown {os.getuid()} {path} && chmod 600 {path}", path=str(path))])


def _read_file(path: Path) -> dict[str, tuple[str, int]]:
    _check_file_mode(path)
    entries, issues = parse_env_file(path)
    if issues:
        # never echo the line text: it may hold a secret
        raise SecretsError([ProfileIssue(i.key if i.key in FILE_KEYS else "<syntax>",
                                         "cannot parse this line", fix="write KEY=VALUE", path=str(path),
                                         line=i.line) for i in issues])
    out: dict[str, tuple[str, int]] = {}
    for e in entries:
        at = invisible_at(e.value)
        if at >= 0:                       # a pasted token with a zero-width or TAG character fails as a 401 later
            raise SecretsError([ProfileIssue(e.key, f"the value holds the {describe_invisible(e.value[at])} at column "
                                             f"{at + 1} (the value is not shown)", fix="retype the value",
                                             path=str(path), line=e.line)])
        if e.key in FILE_KEYS:
            out[e.key] = (e.value, e.line)
        else:
            warnings.warn(f"{path}:{e.line}: {e.key} is not a secret the runbook reads "
                          f"(known: {', '.join(FILE_KEYS)})", UserWarning, stacklevel=3)
    return out


def load_secrets(environ: Mapping[str, str] | None = None,
                 secrets_file: str | os.PathLike | None = None) -> Secrets:
    """Collect the HF token and API key. The environment wins over the file; the file is only
    read when something is missing from the environment, and only if it is mode 0600."""
    env = os.environ if environ is None else environ
    path = Path(os.path.expanduser(os.fspath(secrets_file))) if secrets_file else default_secrets_file(env)
    found: dict[str, tuple[str, str]] = {}
    for attr, names in (("hf_token", HF_ENV), ("api_key", API_ENV)):
        for name in names:
            if env.get(name, "").strip():
                found[attr] = (env[name].strip(), f"env:{name}")
                break
    if len(found) < 2 and path.is_file():
        for key, (value, _line) in _read_file(path).items():
            attr = FILE_KEYS[key]
            if attr not in found and value:
                found[attr] = (value, f"file:{path}")
    hf = found.get("hf_token", ("", ""))
    api = found.get("api_key", ("", ""))
    return Secrets(hf_token=hf[0], api_key=api[0], hf_token_source=hf[1], api_key_source=api[1])


def generate_api_key(environ: Mapping[str, str] | None = None,
                     secrets_file: str | os.PathLike | None = None) -> tuple[str, Path]:
    """A new random ``VLLM_API_KEY`` added to the secrets file (created mode 0600 in a 0700 directory; its
    other lines kept), written whole or not at all. Returns (key, file). Refuses a file that already sets one."""
    env = os.environ if environ is None else environ
    path = Path(os.path.expanduser(os.fspath(secrets_file))) if secrets_file else default_secrets_file(env)
    existing = ""
    if path.is_file():
        if "VLLM_API_KEY" in _read_file(path):       # also checks mode and owner
            raise SecretsError([ProfileIssue("VLLM_API_KEY", "the secrets file already sets an API key",
                                             fix="use it (load_secrets) instead of generating one", path=str(path))])
        existing = path.read_text()
    key = "sr-" + base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    text = existing + ("\n" if existing and not existing.endswith("\n") else "") + \
        "# generated by spark-runbook for an API bound beyond loopback\n" + f"VLLM_API_KEY={key}\n"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)   # mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    register_secret(key)
    return key, path


def _b64_cores(raw: bytes, encode) -> set[str]:
    """The base64 characters that depend on ``raw`` alone, at each of the three offsets it can have inside a longer
    encoded string (a Basic header encodes "user:" + secret): the chars shared with the bytes around it are left."""
    out = set()
    for k in range(3):
        full = encode(b"\0" * k + raw + b"\0" * 3).decode()
        core = full[4 if k else 0: 4 * ((k + len(raw)) // 3)]
        if len(core) >= 8:
            out.add(core)
    return out


def encoded_forms(value: str) -> set[str]:
    """The forms a secret takes on the way into a log: JSON-escaped (a notebook's source), base64 at any offset
    (std and URL-safe), hex (either case), %-encoded (either hex case). Long values only: short ones are noise."""
    forms = {json.dumps(value)[1:-1]}
    if len(value) < 8:
        return forms - {value}
    raw = value.encode()
    forms |= _b64_cores(raw, base64.b64encode) | _b64_cores(raw, base64.urlsafe_b64encode)
    forms |= {raw.hex(), raw.hex().upper()}
    every = "".join(f"%{b:02X}" for b in raw)                   # each byte %-encoded, as some clients do
    for quoted in (urllib.parse.quote(value, safe=""), urllib.parse.quote(value), urllib.parse.quote_plus(value, safe=""),
                   urllib.parse.quote_plus(value), every):
        forms |= {quoted, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted)}
    return forms - {value}


class Redactor:
    """Replaces with ``***`` every known secret value and its encoded forms (:func:`encoded_forms`), and the shapes
    that need no known value: ``hf_…`` tokens (raw, base64, hex), ``Bearer <x>``, ``--api-key``/``*_TOKEN=``/
    ``"api_key": "…"`` assignments, credential query parameters (``?token=``) and URL userinfo."""

    def __init__(self, values: Iterable[str] = ()):
        self._values: set[str] = set()
        self._forms: set[str] = set()
        for v in values:
            self.add(v)

    def add(self, value: str | None) -> None:
        if value and len(value.strip()) >= MIN_SECRET_LEN:
            v = value.strip()
            self._values.add(v)
            self._forms.update(encoded_forms(v))

    def add_current(self, environ: Mapping[str, str] | None = None,
                    secrets_file: str | os.PathLike | None = None) -> None:
        """Also mask the secrets in effect now (a key step 04 generated after this redactor was built)."""
        for value in redactor_from_env(environ, secrets_file).values:
            self.add(value)

    @property
    def values(self) -> frozenset[str]:
        return frozenset(self._values)

    def redact(self, text: Any) -> Any:
        if not isinstance(text, str) or not text:
            return text
        for v in sorted(self._values | self._forms, key=len, reverse=True):
            text = text.replace(v, MASK)
        text = mask_tokens(text)
        text = _HF_HEX_RE.sub(MASK, text)
        text = _USERINFO_RE.sub(lambda m: m.group(1) + MASK + "@", text)
        text = _BEARER_RE.sub(lambda m: m.group(1) + MASK, text)
        text = _ASSIGN_RE.sub(lambda m: m.group(1) + MASK if m.group(2) != MASK else m.group(0), text)
        text = _QUERY_RE.sub(lambda m: m.group(1) + MASK, text)
        text = _JSON_KEY_RE.sub(lambda m: m.group(1) + MASK if m.group(2) != MASK else m.group(0), text)
        return text

    __call__ = redact

    def redact_obj(self, obj: Any) -> Any:
        """Redact strings inside nested dicts/lists/tuples (keys included)."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, dict):
            return {self.redact(k) if isinstance(k, str) else k: self.redact_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.redact_obj(v) for v in obj)
        return obj

    def __repr__(self) -> str:
        return f"Redactor({len(self._values)} value(s))"


def redactor_from_env(environ: Mapping[str, str] | None = None,
                      secrets_file: str | os.PathLike | None = None) -> Redactor:
    """A redactor for the secrets currently in effect. A refused secrets file is skipped here
    (its values are never loaded, so cannot leak); :func:`load_secrets` reports it."""
    env = os.environ if environ is None else environ
    red = Redactor(env.get(n, "") for n in (*HF_ENV, *API_ENV))
    try:
        red = Redactor([*red.values, *load_secrets(env, secrets_file).values()])
    except SecretsError:
        pass
    return red


def _looks_like_a_credential(value: str) -> bool:
    """A value a secret-key name points at that is more than a word of prose (``token: see below``)."""
    return len(value) >= 6 and bool(re.search(r"[\d_+/=-]", value) or (value != value.lower() != value.upper()))


def has_secret_form(text: str) -> bool:
    """Whether ``text`` (a profile's comment) holds a secret form the redactor masks without a known value: a token
    shape, ``Bearer …``, a credential query value, a secret key's value, a URL with a password."""
    if HF_TOKEN_RE.search(text) or _HF_HEX_RE.search(text):
        return True
    if any(m.group(2) and ":" in m.group(2) for m in _USERINFO_RE.finditer(text)):
        return True
    return any(_looks_like_a_credential(m.group(2)) for rx in (_BEARER_RE, _ASSIGN_RE, _QUERY_RE, _JSON_KEY_RE)
               for m in rx.finditer(text))


_default: Redactor | None = None
_lock = threading.Lock()


def default_redactor() -> Redactor:
    """The process-wide redactor used by the remote layer and the evidence writer. Built once
    from the environment and secrets file; secrets exported later are picked up on each call."""
    global _default
    with _lock:
        if _default is None:
            _default = redactor_from_env()
        for name in (*HF_ENV, *API_ENV):
            _default.add(os.environ.get(name, ""))
        return _default


def register_secret(value: str) -> None:
    """Add a value (e.g. a generated lab API key) to the default redactor."""
    default_redactor().add(value)


def reset_default_redactor() -> None:
    global _default
    with _lock:
        _default = None
