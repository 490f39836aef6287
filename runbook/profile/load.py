"""Reading one ``env/*.env`` file into a validated :class:`Profile`, every problem an issue at ``file:line``.

The file itself is checked first (unreadable, binary, not UTF-8, BOM, CRLF, invisible characters, tokens in
comments), then its ``KEY=VALUE`` lines are parsed (line numbers kept), unknown keys get a hint (seed-recipe
names, near misses, secrets that belong in the secrets file), every key is validated by the model and the
cross-field rules (``rules.py``) run; all problems are raised together as one
:class:`~runbook.errors.ProfileError`, before anything connects to a node.
"""
from __future__ import annotations

import difflib
import os
import re
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from .. import envfile
from ..envfile import EnvEntry, describe_invisible, invisible_at
from ..errors import ProfileError, ProfileIssue
from ..secrets import HF_TOKEN_RE, PROFILE_SECRETS_HINT as SECRETS_HINT, has_secret_form, mask_tokens
from .model import KEYS, REPO_ROOT, REQUIRED_KEYS, Profile
from .nodes import MAX_NODES, NODE_KEY_SUFFIXES
from .rules import conflicts, serve_conflicts
from .types import as_text

OVERRIDE = "<override>"

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
    return envfile.parse_env_text(text, path, known_keys=KEYS, is_secret=is_secret_key, mask=mask_tokens,
                                  secret_in=has_secret_form)


def parse_env_file(path: str | os.PathLike) -> tuple[list[EnvEntry], list[ProfileIssue]]:
    """Parse a ``.env`` file; see :func:`parse_env_text`."""
    p = Path(path)
    return parse_env_text(p.read_text(encoding="utf-8"), str(p))


#: a profile is a few KiB; anything this large is the wrong file (weights, a log)
MAX_PROFILE_BYTES = 1 << 20

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
        at = invisible_at(body)            # secret forms in comments: parse_env_text (whole-line and trailing)
        if at >= 0:
            issues.append(ProfileIssue(_line_key(body), f"the line holds the {describe_invisible(body[at])} "
                                       f"at column {at + 1}",
                                       fix="retype the line (such characters come from copy and paste)",
                                       path=path, line=n))
    return text, issues


# --------------------------------------------------------------------------------------------
# unknown keys and secrets
# --------------------------------------------------------------------------------------------

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

#: keys this runbook no longer reads -> why (a copied profile that still has one is told to delete the line)
RETIRED_KEYS: dict[str, str] = {
    "LAB_NODES": "the lab has as many nodes as the profile names (HEAD_SSH, WORKER_SSH, then one per WORKER2_SSH "
                 "... WORKER7_SSH set)",
}

#: a per-node key of a node beyond the last one a profile can name (WORKER8_SSH, ...)
_BEYOND_LAST_NODE = re.compile(r"WORKER(\d+)_(?:%s)" % "|".join(NODE_KEY_SUFFIXES))

_SECRET_EXACT = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "DSPARK_API_KEYS", "GHCR_TOKEN"}


def is_secret_key(key: str) -> bool:
    """True for keys that hold secrets (HF_TOKEN, VLLM_API_KEY, *_TOKEN, *_API_KEY*, passwords)."""
    k = key.upper()
    return (k in _SECRET_EXACT or k.endswith("_TOKEN") or "API_KEY" in k
            or "PASSWORD" in k or k.endswith("_SECRET") or "SECRET_KEY" in k)


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
    m = _BEYOND_LAST_NODE.fullmatch(key)
    if m and int(m.group(1)) >= MAX_NODES:
        return ProfileIssue(key, f"a profile names at most {MAX_NODES} nodes (HEAD, WORKER, WORKER2 ... "
                            f"WORKER{MAX_NODES - 1}): WORKER{m.group(1)} would be node {int(m.group(1)) + 1}",
                            fix=(f"delete line {e.line}" if e.line else f"drop -p {key}") +
                            f" (the runbook runs {MAX_NODES} Sparks at most)", path=e.path, line=e.line)
    if key in RETIRED_KEYS:
        return ProfileIssue(key, f"retired key: {RETIRED_KEYS[key]}", fix=f"delete line {e.line}" if e.line
                            else f"drop -p {key}", path=e.path, line=e.line)
    if key in SEED_ALIASES:
        target = SEED_ALIASES[key]
        return ProfileIssue(key, f"unknown key (a seed-recipe name); did you mean {target}?",
                            fix=f"rename {key} to {target.split(' ')[0]} (see env/README.md)",
                            path=e.path, line=e.line)
    close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
    msg = f"unknown key; did you mean {close[0]}?" if close else "unknown key"
    fix = f"rename it to {close[0]}" if close else "remove it (known keys: docs/DESIGN.md, env/README.md)"
    return ProfileIssue(key, msg, fix=fix, path=e.path, line=e.line)


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------

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
    ov_entries = [EnvEntry(str(k).strip(), as_text(v) if v is not None else "", 0, OVERRIDE)
                  for k, v in (overrides or {}).items()]

    for e in ov_entries:   # -p values: the same characters refused as in a file, and no line break
        at = invisible_at(e.value)
        at = e.value.find("\t") if at < 0 else at
        if at >= 0:
            issues.append(ProfileIssue(e.key, f"the value holds the {describe_invisible(e.value[at])} at column "
                                       f"{at + 1}", fix=f"retype -p {e.key}=... (such characters come from copy "
                                       "and paste, or hide what the value really is)", path=OVERRIDE))
    bad_overrides = {i.key for i in issues if i.path == OVERRIDE}
    ov_entries = [e for e in ov_entries if e.key not in bad_overrides]

    merged: dict[str, EnvEntry] = {}
    first_line: dict[str, int] = {}
    for e in file_entries + ov_entries:
        if e.key not in KEYS and mask_tokens(e.key) != e.key:     # a token given as a -p key: never echoed
            issues.append(ProfileIssue("<key>", "the key name looks like a token (not shown here); " + SECRETS_HINT,
                                       fix="drop that -p (and revoke that token, which your shell history now holds)",
                                       path=e.path, line=e.line))
            continue
        if e.key not in KEYS:
            issues.append(_unknown_issue(e))
            continue
        if e.path != OVERRIDE and e.key in first_line:
            issues.append(ProfileIssue(e.key, f"set twice (first at line {first_line[e.key]})",
                                       fix="keep one of the two lines", path=e.path, line=e.line))
            continue
        if e.path != OVERRIDE:
            first_line[e.key] = e.line
        if HF_TOKEN_RE.search(e.value) or HF_TOKEN_RE.search(urllib.parse.unquote(e.value)):   # hf%5F…, %68%66…
            issues.append(ProfileIssue(e.key, "value contains what looks like a Hugging Face token (or a GitHub "
                                       "token, or one in base64); " + SECRETS_HINT,
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

    model._source = src          # the rules resolve local paths against the profile's own checkout
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
    model._reload = load_profile
    return model


def refuse_unservable(profile: Profile) -> None:
    """Raise :class:`ProfileError` at the key's line when the profile cannot serve (``rules.serve_conflicts``):
    what ``validate``, ``start`` and ``run`` refuse before anything runs, while ``render`` and the Ray cluster alone
    still take the profile."""
    issues = []
    for c in serve_conflicts(profile):
        at = c.at or c.keys[-1]
        path = OVERRIDE if at in profile.overrides else str(profile.source or "<profile>")
        issues.append(ProfileIssue(at, c.message, fix=c.fix, path=path, line=profile.key_lines.get(at, 0)
                                   if path != OVERRIDE else 0))
    if issues:
        raise ProfileError(issues)


#: keys whose value runs code, fetches bytes, sends data out or decides whom the runbook trusts (docs/security.md:
#: the profile is code): the SSH files run commands on this machine (SSH_CONFIG) and name the key and host keys
#: every connection trusts; the ALLOW_* keys loosen a rule on purpose
#: (HF_MODEL_REPO / HF_REVISION: the launch passes --trust-remote-code, so the repo's Python files run in the ranks)
EXECUTING_KEYS = ("IMAGE", "ALLOW_MOVING_IMAGE_TAG", "RECIPE_REPO", "RECIPE_COMMIT", "RECIPE_DIR", "HF_MODEL_REPO",
                  "HF_REVISION", "HF_ENDPOINT", "HF_ENDPOINT_TRUSTED", "EXTRA_ARGS", "ALLOW_EGRESS_FLAGS", "VLLM_BIN",
                  "SSH_CONFIG", "ALLOW_SSH_CONFIG_COMMANDS", "SSH_KEY", "KNOWN_HOSTS")


def executing_keys_changed(profile: Profile) -> list[tuple[str, str, str]]:
    """(key, value, shipped value) for each key that executes or fetches whose value differs from the shipped
    profile of the same recipe (``env/<RECIPE>.env``): what a reviewer of a profile must read."""
    shipped_path = REPO_ROOT / "env" / f"{profile.recipe}.env"
    try:
        entries, _ = parse_env_file(shipped_path)
    except (OSError, UnicodeDecodeError):
        entries = []
    shipped = {e.key: e.value for e in entries}
    out = []
    for key in EXECUTING_KEYS:
        value = str(profile.value(key) if not isinstance(profile.value(key), bool) else int(profile.value(key)))
        ref = shipped.get(key, "")
        if key in ("HF_ENDPOINT",):
            ref = ref.rstrip("/")
        if value != ref:
            out.append((key, mask_tokens(value), mask_tokens(ref)))
    return out
