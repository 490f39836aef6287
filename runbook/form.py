"""An ipywidgets form to edit a profile in JupyterLab and save it as a new ``env/<name>.env``.

    import runbook.form
    runbook.form.show("env/lab.env")          # in a notebook cell

One widget per key the file sets (by type: integer, number, on/off, choice, text), grouped by the
file's ``# ----`` section headers, with the ``#`` comment above each key as its description and
tooltip. Every edit re-runs **the CLI's validation** (:func:`runbook.profile.load_profile` on the
edited text), and each :class:`~runbook.errors.ProfileIssue` is shown under the key it names
(issues without a key of the form go to the message area at the top). **Save** writes a *new*
profile file: the original text with only the edited values replaced (comments, blank lines and
section headers are kept), written atomically; it refuses to overwrite the shipped profiles and
refuses anything that does not validate, so a secret never reaches a profile file (the profile
validation rejects secret-looking keys and values; the form also refuses the secrets currently
configured in the environment / secrets file). Secret-looking values found in a file are never
sent to the browser: their widget shows ``***``.

Headless runs (papermill) pass ``run_dir``; the notebooks only show the form when ``run_dir`` is
empty, and :func:`show` falls back to a text hint outside a Jupyter kernel.
"""
from __future__ import annotations

import html
import math
import os
import re
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .evidence import atomic_write
from .errors import ExitStatus, ProfileError, ProfileIssue, RunbookError
from .profile import (KEYS, MAX_NODES, NODE_KEY_SUFFIXES, NODE_NAMES, REPO_ROOT, Profile, is_secret_key,
                      load_profile, node_key, parse_env_text)
from .secrets import HF_TOKEN_RE, MASK, redactor_from_env

__all__ = ["ProfileForm", "FormError", "show", "SHIPPED_PROFILES", "ENV_DIR", "validate_text",
           "format_value", "document", "KeyDoc", "Section", "profile_files", "nodes_note"]

ENV_DIR = REPO_ROOT / "env"
#: the profiles shipped with the repository; the form never overwrites them
SHIPPED_PROFILES = ("lab.env", "exl3-v41.env", "dspark-v4.env", "tp3-dspark.env", "tp4-v41.env", "lab-tp3.env",
                    "lab-tp4.env", "lab-ray.env", "lab-tp4-ray.env", "lab-tp2pp2.env")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SECTION_RE = re.compile(r"#\s*-{3,}\s*(.*?)\s*-*\s*$")
_FIRST_SECTION = "general"


class FormError(RunbookError):
    """The form refused to save (bad name, shipped profile, existing file, invalid profile)."""
    exit_code = ExitStatus.INVALID


# --------------------------------------------------------------------------------------------
# the file as a document: sections of keys, each with its comment and line
# --------------------------------------------------------------------------------------------

@dataclass
class KeyDoc:
    """One ``KEY=VALUE`` line of the file, with the comment lines directly above it."""
    key: str
    value: str
    line: int                       # 1-based line in the file
    comment: str = ""               # the ``#`` comment lines above, joined with a space
    comment_lines: list[int] = field(default_factory=list)   # their line numbers
    section: str = _FIRST_SECTION


@dataclass
class Section:
    title: str
    keys: list[KeyDoc] = field(default_factory=list)


def document(text: str, path: str = "<text>") -> tuple[list[Section], list[ProfileIssue]]:
    """Split a profile's text into sections of keys (the CLI's own parser finds the entries)."""
    entries, issues = parse_env_text(text, path)
    lines = text.splitlines()
    by_line = {e.line: e for e in entries}
    sections: list[Section] = [Section(_FIRST_SECTION)]
    pending: list[tuple[int, str]] = []      # comment lines since the last blank/entry
    for lineno, raw in enumerate(lines, start=1):
        s = raw.strip()
        m = _SECTION_RE.fullmatch(s)
        if m:
            sections.append(Section(m.group(1) or f"section {len(sections)}"))
            pending = []
        elif not s:
            pending = []
        elif s.startswith("#"):
            pending.append((lineno, s.lstrip("#").strip()))
        elif lineno in by_line:
            e = by_line[lineno]
            sections[-1].keys.append(KeyDoc(e.key, e.value, e.line, " ".join(t for _, t in pending if t),
                                            [n for n, _ in pending], sections[-1].title))
            pending = []
        else:
            pending = []
    return [s for s in sections if s.keys], issues


def nodes_note(keys: list[str]) -> str:
    """The note shown once above a section that holds ``*_SSH`` node keys: the file lists the nodes it has (one
    line per key and node), and the further nodes up to WORKER7 have the same keys (the form edits the lines a
    file has; a node is added as lines in the file). "" for a section without node keys."""
    listed = [n for n in NODE_NAMES if node_key(n, "SSH") in keys]
    if not listed:
        return ""
    shape = ", ".join(f"<NODE>_{s}" for s in NODE_KEY_SUFFIXES)
    upto = NODE_NAMES[MAX_NODES - 1].upper()
    further = (f"{NODE_NAMES[len(listed)].upper()} ... {upto} follow the same shape" if len(listed) < MAX_NODES
               else f"{MAX_NODES} nodes is the most")
    return (f"Nodes by rank: {', '.join(n.upper() for n in listed)} (each with {shape}); {further}. To add a "
            "node, add its lines to the file below the others of each key (an empty *_SSH ends the list: no gaps), "
            "then set NNODES and TP x PP to the node count.")


def profile_files(env_dir: Path = ENV_DIR) -> list[Path]:
    return sorted(Path(env_dir).glob("*.env"))


# --------------------------------------------------------------------------------------------
# values <-> text
# --------------------------------------------------------------------------------------------

def format_value(value: str) -> str:
    """How a value is written so that :func:`runbook.profile.parse_env_text` reads it back unchanged."""
    needs_quotes = (value != value.strip() or re.search(r"\s#", value) or value[:1] in ("'", '"')
                    or "\n" in value)
    if not needs_quotes:
        return value
    if "'" not in value:
        return f"'{value}'"
    escaped = re.sub(r'(["\\$`])', r"\\\1", value)
    return f'"{escaped}"'


def _trailing_comment(raw_line: str) -> str:
    """The ``  # ...`` after the value on a KEY=VALUE line (kept when the value changes)."""
    _, _, raw = raw_line.partition("=")
    stripped = raw.strip()
    if stripped[:1] in ("'", '"'):
        quote, i = stripped[0], 1
        while i < len(stripped):
            if quote == '"' and stripped[i] == "\\" and i + 1 < len(stripped):
                i += 2
                continue
            if stripped[i] == quote:
                rest = stripped[i + 1:]
                return rest if rest.strip().startswith("#") else ""
            i += 1
        return ""
    m = re.search(r"\s+#", raw)
    return raw[m.start():].rstrip("\r\n") if m else ""


def _format_float(x: float) -> str:
    if math.isfinite(x) and x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def _kind(key: str) -> tuple[str, tuple[str, ...]]:
    """Widget kind of a key from the Profile model: int, float, bool, choice (with options) or text."""
    f = Profile.model_fields.get(key.lower())
    if f is None:
        return "text", ()
    ann = f.annotation
    if ann is bool:
        return "bool", ()
    if ann is int:
        return "int", ()
    if ann is float:
        return "float", ()
    if typing.get_origin(ann) is typing.Literal:
        return "choice", tuple(str(a) for a in typing.get_args(ann))
    return "text", ()


# --------------------------------------------------------------------------------------------
# validation: the CLI's load_profile on the edited text
# --------------------------------------------------------------------------------------------

def validate_text(text: str, name: str = "edited.env") -> list[ProfileIssue]:
    """Run :func:`runbook.profile.load_profile` on ``text``; return its issues (empty when valid).
    Issue paths name the temporary copy; line numbers are those of ``text``."""
    with tempfile.TemporaryDirectory(prefix="runbook-form-") as tmp:
        env = Path(tmp) / "env"            # same layout as the repo, so relative paths behave alike
        env.mkdir()
        path = env / name
        path.write_text(text, encoding="utf-8")
        try:
            load_profile(path, environ={})
        except ProfileError as exc:
            return list(exc.issues)
    return []


def _secret_issues(rows: list["_Row"]) -> list[ProfileIssue]:
    """Values that contain a secret in effect (environment / secrets file) or look like one."""
    red = redactor_from_env()
    out = []
    for row in rows:
        v = row.value()
        if v and v != MASK and red.redact(v) != v and not HF_TOKEN_RE.search(v):
            out.append(ProfileIssue(row.doc.key, "value contains a secret (an HF token, API key or bearer "
                                    "credential); secrets never live in a profile",
                                    fix="remove it; export it or put it in ~/.config/spark-runbook/secrets.env "
                                        "(mode 0600)", line=row.line))
    return out


# --------------------------------------------------------------------------------------------
# widgets
# --------------------------------------------------------------------------------------------

_DESC_STYLE = {"description_width": "230px"}
_WIDE = "520px"


class _Row:
    """One key: its widget, its comment, its inline message."""

    def __init__(self, doc: KeyDoc, on_change: Callable[[], None]):
        import ipywidgets as w

        self.doc = doc
        self.line = doc.line
        self.removed = False
        self.secret = bool(HF_TOKEN_RE.search(doc.value)) or (is_secret_key(doc.key) and doc.key not in KEYS)
        kind, options = _kind(doc.key)
        v = doc.value.strip()
        tip = doc.comment or doc.key
        common = dict(description=doc.key, tooltip=tip, style=_DESC_STYLE, layout=w.Layout(width=_WIDE))
        self.kind = kind
        if self.secret:                         # never send a secret-looking value to the browser
            self.kind = "text"
            self.widget = w.Password(value=MASK, continuous_update=False, **common)
        elif kind == "int" and re.fullmatch(r"[+-]?\d+", v):
            self.widget = w.IntText(value=int(v), continuous_update=False, **common)
        elif kind == "float" and _is_float(v):
            self.widget = w.FloatText(value=float(v), continuous_update=False, **common)
        elif kind == "bool" and v.lower() in ("0", "1", "true", "false"):
            self.widget = w.Checkbox(value=v.lower() in ("1", "true"), indent=True, **common)
        elif kind == "choice" and v in options:
            self.widget = w.Dropdown(options=[(o if o else "(empty)", o) for o in options], value=v, **common)
        else:
            self.kind = "text"
            self.widget = w.Text(value=doc.value, continuous_update=False, **common)
        self.initial = self.widget.value
        self.widget.layout.flex = "0 0 auto"     # the comment wraps, the input keeps its width
        self.widget.add_class("runbook-form-input")
        self.widget.add_class(f"runbook-key-{doc.key}")
        self.note = w.HTML(f'<span style="color:#555;font-size:90%">{html.escape(doc.comment)}</span>',
                           layout=w.Layout(margin="0 0 0 8px", flex="1 1 auto"))
        parts = [self.widget, self.note]
        if doc.key not in KEYS:               # unknown (or secret) keys can only be removed
            self.remove = w.ToggleButton(value=False, description="remove line", icon="trash",
                                         tooltip="drop this line (and its comment) from the saved file",
                                         layout=w.Layout(width="120px"))
            self.remove.observe(lambda ch: (setattr(self, "removed", bool(ch["new"])), on_change()), "value")
            parts.insert(1, self.remove)
        self.message = w.HTML("", layout=w.Layout(display="none", margin="0 0 4px 238px"))
        self.message.add_class("runbook-form-error")
        self.box = w.VBox([w.HBox(parts, layout=w.Layout(align_items="center")), self.message])
        self.widget.observe(lambda ch: on_change(), "value")

    def changed(self) -> bool:
        return self.widget.value != self.initial

    def value(self) -> str:
        """The value as text (the original text while unchanged)."""
        if not self.changed():
            return self.doc.value
        v = self.widget.value
        if self.kind == "bool":
            return "1" if v else "0"
        if self.kind == "float":
            return _format_float(float(v))
        return str(v)

    def set(self, value: Any) -> None:
        """Set the widget from a value given as text or a Python value (tests, scripting)."""
        if self.kind == "int":
            value = int(value)
        elif self.kind == "float":
            value = float(value)
        elif self.kind == "bool":
            value = value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true")
        else:
            value = str(value)
        self.widget.value = value

    def show(self, messages: list[str]) -> None:
        if messages:
            self.message.value = "".join(
                f'<div style="color:#a4000f">&#9888; {html.escape(m)}</div>' for m in messages)
            self.message.layout.display = ""
        else:
            self.message.value = ""
            self.message.layout.display = "none"


def _is_float(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def _issue_text(issue: ProfileIssue, with_key: bool = False) -> str:
    head = f"line {issue.line}: " if issue.line else ""
    key = f"{issue.key}: " if with_key else ""
    return f"{head}{key}{issue.message}" + (f" (fix: {issue.fix})" if issue.fix else "")


class ProfileForm:
    """The profile form. ``form.widget`` is the ipywidgets tree; displaying the form shows it."""

    def __init__(self, profile_path: str | os.PathLike | None = None, *, env_dir: str | os.PathLike = ENV_DIR):
        import ipywidgets as w

        self.env_dir = Path(env_dir)
        self.path: Path | None = None
        self.text = ""
        self.rows: list[_Row] = []
        self.sections: list[Section] = []
        self.issues: list[ProfileIssue] = []
        self.errors: dict[str, list[str]] = {}
        self.general: list[str] = []
        self._loading = False

        files = profile_files(self.env_dir)
        start = _resolve(profile_path, self.env_dir) if profile_path else (files[0] if files else None)
        if start is None:
            raise FormError(f"no profile files in {self.env_dir}", fix="pass a profile path, e.g. env/lab.env")
        options = [(p.name, str(p)) for p in files]
        if str(start) not in [o[1] for o in options]:
            options.append((str(start), str(start)))
        self.chooser = w.Dropdown(options=options, value=str(start), description="profile",
                                  tooltip="the profile file to start from (env/*.env)",
                                  style={"description_width": "60px"}, layout=w.Layout(width="360px"))
        self.chooser.add_class("runbook-form-chooser")
        self.status = w.HTML()
        self.status.add_class("runbook-form-status")
        self.messages = w.HTML()
        self.messages.add_class("runbook-form-messages")
        self.accordion = w.Accordion()
        self.save_name = w.Text(value="", placeholder="my-sparks", description="save as env/",
                                tooltip="name of the new profile: letters, digits, - _ . (.env is added)",
                                style={"description_width": "80px"}, layout=w.Layout(width="300px"))
        self.overwrite = w.Checkbox(value=False, description="replace my existing file of that name",
                                    indent=False, layout=w.Layout(width="300px"))
        self.save_button = w.Button(description="Save", icon="save", button_style="primary",
                                    tooltip="write env/<name>.env (never one of the shipped profiles)")
        self.save_result = w.HTML()
        self.save_result.add_class("runbook-form-save-result")
        self.save_button.on_click(lambda _b: self._on_save())
        self.chooser.observe(self._on_choose, "value")
        self.widget = w.VBox([
            w.HBox([self.chooser, self.status], layout=w.Layout(align_items="center")),
            self.messages,
            self.accordion,
            w.HBox([self.save_name, self.overwrite, self.save_button], layout=w.Layout(align_items="center")),
            self.save_result,
        ])
        self.widget.add_class("runbook-profile-form")
        self.load(start)

    # ---------------------------------------------------------------- loading
    def load(self, path: str | os.PathLike) -> None:
        """Load a profile file into the form (replaces every widget)."""
        import ipywidgets as w

        self.path = Path(path)
        self.text = self.path.read_text(encoding="utf-8")
        self.sections, _ = document(self.text, str(self.path))
        self._loading = True
        try:
            self.rows = []
            boxes, titles = [], []
            for sec in self.sections:
                rows = [_Row(doc, self._changed) for doc in sec.keys]
                self.rows.extend(rows)
                note = nodes_note([d.key for d in sec.keys])
                head = [w.HTML(f'<span style="color:#555;font-size:90%">{html.escape(note)}</span>')] if note else []
                boxes.append(w.VBox(head + [r.box for r in rows]))
                titles.append(sec.title)
            self.accordion.children = boxes
            self.accordion.titles = tuple(titles)
            self._titles = titles
            self.accordion.selected_index = None
            if self.chooser.value != str(self.path) and str(self.path) in [o[1] for o in self.chooser.options]:
                self.chooser.value = str(self.path)
        finally:
            self._loading = False
        self.save_result.value = ""
        self.validate()

    def _on_choose(self, change) -> None:
        if not self._loading and change["new"] and Path(change["new"]) != self.path:
            self.load(change["new"])

    def _changed(self) -> None:
        if not self._loading:
            self.save_result.value = ""
            self.validate()

    # ---------------------------------------------------------------- editing
    def row(self, key: str) -> _Row:
        for r in self.rows:
            if r.doc.key == key:
                return r
        raise KeyError(f"{key} is not set in {self.path}")

    def set_value(self, key: str, value: Any) -> None:
        """Set a key's widget (as if typed) and re-validate."""
        self.row(key).set(value)

    def remove_line(self, key: str, removed: bool = True) -> None:
        """Drop an unknown/secret key's line from the saved text (its "remove line" toggle)."""
        row = self.row(key)
        if not hasattr(row, "remove"):
            raise KeyError(f"{key} is a profile key; only unknown keys can be removed")
        row.remove.value = removed

    def values(self) -> dict[str, str]:
        return {r.doc.key: r.value() for r in self.rows if not r.removed}

    def edited_text(self) -> str:
        """The file's text with the edited values in place (comments and layout kept)."""
        text, _ = self._render()
        return text

    def _render(self) -> tuple[str, dict[int, _Row]]:
        lines = self.text.splitlines(keepends=True)
        by_line = {r.doc.line: r for r in self.rows}
        drop: set[int] = set()
        for r in self.rows:
            if r.removed:
                drop.add(r.doc.line)
                drop.update(r.doc.comment_lines)
        out: list[str] = []
        where: dict[int, _Row] = {}
        for lineno, raw in enumerate(lines, start=1):
            if lineno in drop:
                continue
            r = by_line.get(lineno)
            if r is not None and r.changed():
                end = "\n" if raw.endswith("\n") else ""
                body = raw.rstrip("\r\n")
                indent = body[:len(body) - len(body.lstrip())]
                export = "export " if body.lstrip().startswith("export ") else ""
                raw = f"{indent}{export}{r.doc.key}={format_value(r.value())}{_trailing_comment(body)}{end}"
            out.append(raw)
            if r is not None:
                where[len(out)] = r
        return "".join(out), where

    # ---------------------------------------------------------------- validation
    def validate(self) -> list[ProfileIssue]:
        """Validate the edited text with the CLI's rules and show every issue under its key."""
        text, where = self._render()
        name = self.path.name if self.path else "edited.env"
        issues = validate_text(text, name)
        live = [r for r in self.rows if not r.removed]
        issues += _secret_issues(live)
        by_key = {}
        for r in live:
            by_key.setdefault(r.doc.key, r)
        per_row: dict[int, list[str]] = {}
        general: list[str] = []
        for issue in issues:
            row = where.get(issue.line) if issue.line else None
            if row is None or row.doc.key != issue.key:
                row = by_key.get(issue.key)
            if row is None:
                general.append(_issue_text(issue, with_key=True))
            else:
                per_row.setdefault(id(row), []).append(_issue_text(issue))
        self.errors = {}
        for r in self.rows:
            msgs = per_row.get(id(r), []) if not r.removed else []
            r.show(msgs)
            if msgs:
                self.errors.setdefault(r.doc.key, []).extend(msgs)
        self.general = general
        self.issues = issues
        # section titles carry their problem count so collapsed sections still show them
        titles = []
        for i, sec in enumerate(self.sections):
            n = sum(len(self.errors.get(k.key, [])) for k in sec.keys)
            titles.append(f"{sec.title} \u2014 {n} problem(s)" if n else sec.title)
        self.accordion.titles = tuple(titles)
        self.messages.value = "".join(
            f'<div style="color:#a4000f">&#9888; {html.escape(m)}</div>' for m in general)
        if issues:
            self.status.value = (f'<b style="color:#a4000f">{len(issues)} problem(s)</b> '
                                 f'<span style="color:#555">(the same validation as '
                                 f'<code>python -m runbook validate</code>)</span>')
        else:
            changed = sum(r.changed() or r.removed for r in self.rows)
            self.status.value = (f'<b style="color:#1e7e34">valid</b> '
                                 f'<span style="color:#555">({changed} change(s))</span>')
        return issues

    @property
    def valid(self) -> bool:
        return not self.issues

    # ---------------------------------------------------------------- saving
    def target(self, name: str) -> Path:
        n = name.strip()
        if n.endswith(".env"):
            n = n[:-4]
        if not _NAME_RE.fullmatch(n) or ".." in n:
            raise FormError(f"invalid profile name {name!r}",
                            fix="use letters, digits, - _ . (e.g. my-sparks); it is saved as env/<name>.env")
        return self.env_dir / f"{n}.env"

    def save(self, name: str, *, overwrite: bool = False) -> Path:
        """Write the edited profile to ``env/<name>.env`` atomically; return its path.

        Refuses the shipped profiles, an existing file unless ``overwrite``, and any text that does
        not pass the profile validation (which is what keeps secrets out)."""
        dest = self.target(name)
        if dest.name in SHIPPED_PROFILES:
            raise FormError(f"{dest.name} is a shipped profile and is never overwritten",
                            fix="save under a new name, e.g. my-sparks")
        if dest.exists() and not overwrite:
            raise FormError(f"{dest} already exists", fix="choose another name, or tick 'replace my existing file'")
        issues = self.validate()
        if issues:
            raise ProfileError(issues)
        text, _ = self._render()
        # belt and braces: the validation above already rejects these
        if HF_TOKEN_RE.search(text) or any(is_secret_key(k) for k in self.values()):
            raise FormError("the profile text contains a secret; not written")
        issues = validate_text(text, dest.name)
        if issues:
            raise ProfileError(issues)
        atomic_write(dest, text, replace=overwrite, mode=0o644)
        return dest

    def _on_save(self) -> None:
        try:
            dest = self.save(self.save_name.value, overwrite=self.overwrite.value)
        except ProfileError as exc:
            self.save_result.value = (f'<span style="color:#a4000f">&#9888; not saved: {len(exc.issues)} '
                                      f'problem(s); see the messages above</span>')
        except FormError as exc:
            self.save_result.value = f'<span style="color:#a4000f">&#9888; not saved: {html.escape(str(exc))}</span>'
        except OSError as exc:
            self.save_result.value = f'<span style="color:#a4000f">&#9888; not saved: {html.escape(str(exc))}</span>'
        else:
            rel = _display_path(dest)
            self.save_result.value = (f'<span style="color:#1e7e34">saved <code>{html.escape(rel)}</code>; use it '
                                      f'with <code>profile_path = "{html.escape(rel)}"</code> or '
                                      f'<code>--profile {html.escape(rel)}</code></span>')
            options = [(p.name, str(p)) for p in profile_files(self.env_dir)]
            self._loading = True
            try:
                self.chooser.options = options
                self.chooser.value = str(self.path) if str(self.path) in [o[1] for o in options] else str(dest)
            finally:
                self._loading = False

    # ---------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def _resolve(path: str | os.PathLike, env_dir: Path) -> Path:
    """A profile path as given, else relative to the repo root (a notebook's kernel runs in notebooks/)."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if p.is_file() or p.is_absolute():
        return p.resolve() if p.is_file() else p
    for base in (REPO_ROOT, env_dir.parent):
        if (base / p).is_file():
            return (base / p).resolve()
    if (env_dir / p.name).is_file():
        return (env_dir / p.name).resolve()
    raise FormError(f"profile not found: {path}", fix="pass an existing profile, e.g. env/lab.env")


def _display_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def show(profile_path: str | os.PathLike = "env/lab.env", *, env_dir: str | os.PathLike = ENV_DIR) -> ProfileForm | None:
    """Display the profile form in a notebook (a text hint outside a Jupyter kernel)."""
    if not _in_kernel():
        print(f"runbook.form: the profile form needs a Jupyter kernel; edit {profile_path} instead "
              f"and check it with: python -m runbook validate --profile {profile_path}")
        return None
    from IPython.display import display

    form = ProfileForm(profile_path, env_dir=env_dir)
    display(form.widget)
    return form
