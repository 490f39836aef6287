"""The recipe checkout at the pinned commit on every node: a read-only probe of RECIPE_DIR and its parser,
the head's clone, the copy to the workers over the fabric, and the lab's local upstream repository.

    checks, data = ensure_checkout(cluster, profile)       # head: clone + checkout; workers: rsync over the fabric
    fact = parse_checkout(node.read(checkout_probe_cmd(path, files)).stdout)   # read-only
    lab_source_commit()                                    # the commit the lab recipe's files make

What the checkout must hold (the files a rank mounts or runs) comes from ``recipe.checkout_files``. The lab
head clones from a bare repository built from ``runbook/lab/recipe/`` (``lab_source_repo``), as a real head
clones from GitHub.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import CheckList, Status, check, not_applicable
from ..errors import LabError
from .recipe import RecipePin, checkout_files, recipe_pin
from ..remote import Cluster, Node, expand_home, node_ssh_argv, quote, tail

__all__ = [
    "CheckoutFact",
    "LAB_SOURCE",
    "checkout_probe_cmd",
    "ensure_checkout",
    "lab_source_commit",
    "lab_source_repo",
    "parse_checkout",
]

LAB_SOURCE = Path(__file__).resolve().parents[1] / "lab" / "recipe"


@dataclass
class CheckoutFact:
    state: str = "missing"        # missing | git | git-without-binary | marker | other
    commit: str = ""
    dirty: int = 0                # tracked files changed (git only)
    entries: int = 0              # files in a directory that is no checkout
    missing: list[str] = field(default_factory=list)   # required files absent

    def at(self, commit: str) -> bool:
        return self.state in ("git", "git-without-binary", "marker") and self.commit == commit

    def good(self, commit: str) -> bool:
        return self.at(commit) and not self.dirty and not self.missing

    def describe(self) -> str:
        if self.state == "missing":
            return "absent"
        if self.state == "other":
            return f"a directory with {self.entries} entries that is no recipe checkout"
        what = {"git": "git checkout", "git-without-binary": "git checkout (git not installed: .git/HEAD read)",
                "marker": "tree with .recipe-commit"}[self.state]
        extra = (f", {self.dirty} tracked file(s) modified" if self.dirty else "") + \
            (f", missing {', '.join(self.missing[:4])}" if self.missing else "")
        return f"{what} at {self.commit[:12] or '?'}{extra}"


def checkout_probe_cmd(path: str, files: list[str]) -> str:
    """Read-only: what sits at ``path`` (absolute) and which required files are absent."""
    d = shlex.quote(path)
    checks = " ".join(shlex.quote(f) for f in files)
    return (f"d={d}; if [ ! -e \"$d\" ]; then echo 'state missing'; "
            f"elif [ -e \"$d/.git\" ]; then "
            f"if command -v git >/dev/null 2>&1; then echo 'state git'; "
            f"echo \"commit $(git -C \"$d\" rev-parse HEAD 2>/dev/null)\"; "
            f"echo \"dirty $(git --no-optional-locks -C \"$d\" status --porcelain --untracked-files=no 2>/dev/null "
            f"| wc -l)\"; "
            f"else echo 'state git-without-binary'; echo \"commit $(head -n1 \"$d/.git/HEAD\" 2>/dev/null)\"; fi; "
            f"elif [ -f \"$d/.recipe-commit\" ]; then echo 'state marker'; "
            f"echo \"commit $(head -n1 \"$d/.recipe-commit\" | tr -d ' \\t\\r')\"; "
            f"else echo 'state other'; echo \"entries $(ls -A \"$d\" 2>/dev/null | wc -l)\"; fi; "
            + (f"if [ -d \"$d\" ]; then for f in {checks}; do [ -e \"$d/$f\" ] || echo \"missing $f\"; done; fi"
               if files else "true"))


def parse_checkout(text: str) -> CheckoutFact:
    f = CheckoutFact()
    for line in (text or "").splitlines():
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if key == "state":
            f.state = value
        elif key == "commit":
            f.commit = value if re.fullmatch(r"[0-9a-f]{40}", value) else ""
        elif key == "dirty" and value.isdigit():
            f.dirty = int(value)
        elif key == "entries" and value.isdigit():
            f.entries = int(value)
        elif key == "missing" and value:
            f.missing.append(value)
    if f.state == "missing":
        f.missing = []
    return f


def _home(node: Node) -> str:
    return node.read("printf %s \"$HOME\"").stdout.strip() or "/root"


def _by_hand(pin: RecipePin, head_dir: str) -> str:
    name = pin.repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "recipe"
    return (f"place it by hand: on a machine that reaches {pin.repo}: git clone {pin.repo} {name} && "
            f"git -C {name} checkout {pin.commit}; then rsync -a {name}/ <head>:{head_dir}/ (keep .git; for a "
            f"tree without .git write the commit into {head_dir}/.recipe-commit) and run again")


def _fetch_on_head(head: Node, profile, pin: RecipePin, path: str, fact: CheckoutFact) -> tuple[bool, str, str]:
    """Bring the head's checkout to the pinned commit. Returns (ok, what was done or observed, fix)."""
    repo = pin.repo
    if profile.lab and head.dry_run:    # where the lab's repository is; a dry run builds nothing on this machine
        repo = str(profile.resolve_path(profile.recipe_repo))
    elif profile.lab:        # the lab's recipe (a rehearsal substitutes it for the recipe's repository)
        try:
            repo = str(lab_source_repo(profile))
        except (LabError, OSError, subprocess.SubprocessError) as exc:
            return False, f"lab recipe repository: {exc}", "fix RECIPE_COMMIT / the lab recipe files as named"
    d, c = shlex.quote(path), shlex.quote(pin.commit)
    if fact.state == "missing":
        cmd = (f"mkdir -p {shlex.quote(os.path.dirname(path) or '/')} && git clone --quiet {shlex.quote(repo)} {d} "
               f"&& git -C {d} checkout --quiet --detach {c}")
        action = "cloned"
    elif fact.state == "git" and fact.dirty:
        return (False, f"{path}: {fact.describe()}",
                f"the runbook never discards local changes: commit or stash them in {path} (git -C {path} status), "
                f"or move the directory away and run again")
    elif fact.state == "git":
        cmd = (f"git -C {d} cat-file -e {c}^{{commit}} 2>/dev/null || git -C {d} fetch --quiet origin "
               f"|| git -C {d} fetch --quiet origin {c}; git -C {d} checkout --quiet --detach {c}")
        action = f"checked out (was {fact.commit[:12]})"
    elif fact.state == "git-without-binary":
        return False, f"{path}: git is not installed on the head", "install git on the head (apt-get install git)"
    elif fact.state == "marker":
        return (False, f"{path}: {fact.describe()} (placed by hand, not the pinned {pin.commit[:12]})",
                f"replace the tree at {path} with the pinned commit; " + _by_hand(pin, path))
    else:
        return (False, f"{path}: {fact.describe()}",
                "move it away or set RECIPE_DIR to another path; the runbook does not overwrite it")
    try:
        head.run(cmd, timeout=900)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check naming the command
        observed = getattr(exc, "observed", "") or str(exc)
        return (False, f"`{cmd}` failed on the head: {tail(observed, 8)}",
                f"check the head reaches {pin.repo} (git clone over the network) and that "
                f"{pin.commit} exists there; or " + _by_hand(pin, path))
    return True, action, ""


def _ship(cluster: Cluster, profile, target: Node, src: str, dst: str) -> tuple[bool, str]:
    """rsync the head's checkout to a worker over the fabric (the workers need no internet)."""
    argv = node_ssh_argv(profile, target, target.spec.fabric_ip)
    ssh, dest = " ".join(quote(a) for a in argv[:-1]), argv[-1]
    try:
        target.run(f"mkdir -p {quote(dst)}", timeout=60)
        cluster.head.run(f"rsync -a --delete -e {quote(ssh)} {quote(src.rstrip('/') + '/')} "
                         f"{quote(dest + ':' + dst.rstrip('/') + '/')}", timeout=1800)
    except Exception as exc:  # noqa: BLE001
        return False, tail(getattr(exc, "observed", "") or str(exc), 8)
    return True, f"shipped from the head over {target.spec.fabric_ip}"


def ensure_checkout(cluster: Cluster, profile, *, ship: bool = True) -> tuple[CheckList, dict[str, Any]]:
    """The recipe checkout at the pinned commit on every node: the head clones/checks out, the workers get
    the head's tree over the fabric (rsync, resumable); then every node is verified (read-only probe).
    ``ship=False`` only verifies (a reused server). Dry run: the actions are recorded, not run."""
    checks = CheckList()
    pin = recipe_pin(profile)
    if pin is None:
        checks.add(not_applicable("recipe checkout at the pinned commit", "no RECIPE_REPO: stock vllm serve",
                                  node="cluster"))
        return checks, {}
    files = checkout_files(profile)
    homes = cluster.each(_home)
    for name, h in homes.items():
        if isinstance(h, Exception):
            raise h
    paths = {n.name: expand_home(pin.dir, homes[n.name]) for n in cluster}   # type: ignore[arg-type]

    def probe(node: Node) -> CheckoutFact:
        return parse_checkout(node.read(checkout_probe_cmd(paths[node.name], files), timeout=60).stdout)

    def probe_all() -> dict[str, CheckoutFact]:
        got = cluster.each(probe)
        for v in got.values():
            if isinstance(v, Exception):
                raise v
        return got  # type: ignore[return-value]

    before = probe_all()
    actions = {n: "none" for n in paths}
    failed: dict[str, tuple[str, str]] = {}
    head = cluster.head
    hf = before[head.name]
    if ship and (not hf.at(pin.commit) or hf.dirty):
        ok, what, fix = _fetch_on_head(head, profile, pin, paths[head.name], hf)
        actions[head.name] = what if ok else "failed"
        if not ok:
            failed[head.name] = (what, fix)
    if ship and head.name not in failed:
        for w in cluster.workers:
            f = before[w.name]
            if f.good(pin.commit) and not actions[head.name].startswith(("cloned", "checked out")):
                continue
            if f.state == "other" and f.entries:
                failed[w.name] = (f"{paths[w.name]}: {f.describe()}",
                                  "move it away or set RECIPE_DIR elsewhere: the copy from the head would "
                                  "replace its contents (rsync --delete)")
                continue
            ok, what = _ship(cluster, profile, w, paths[head.name], paths[w.name])
            actions[w.name] = what if ok else "failed"
            if not ok:
                failed[w.name] = (f"rsync from the head failed: {what}",
                                  "check ssh head -> worker over the fabric (step 00) and free disk; run again "
                                  "(the copy resumes)")
    after = probe_all() if ship else before      # the verify (a dry run records it too: the review shows it)
    for node in cluster:
        f = after[node.name]
        path = paths[node.name]
        data = {"path": path, "state": f.state, "commit": f.commit, "dirty": f.dirty, "missing": f.missing,
                "action": actions[node.name]}
        if node.name in failed:
            observed, fix = failed[node.name]
            checks.add(check("recipe checkout at the pinned commit", False, node=node.name, observed=observed,
                             expected=f"{pin.repo} @ {pin.commit[:12]} at {path}", fix=fix, data=data))
            continue
        if head.dry_run and ship and not f.good(pin.commit):
            checks.add(not_applicable("recipe checkout at the pinned commit",
                                      f"dry run: {path} is {f.describe()}; would fetch/ship it", node=node.name))
            continue
        ok = f.good(pin.commit)
        status_noop = ok and actions[node.name] == "none"
        fix = (f"git -C {path} status (local changes?) / the recipe lacks a file the chain mounts: "
               f"is RECIPE_COMMIT the commit this runbook's chain was written for?" if f.at(pin.commit)
               else "run the launch again (it fetches and ships the checkout), or " + _by_hand(pin, path))
        c = check("recipe checkout at the pinned commit", ok, node=node.name,
                  observed=f"{path}: {f.describe()}" + ("" if actions[node.name] == "none"
                                                        else f" ({actions[node.name]})"),
                  expected=f"{pin.repo} @ {pin.commit[:12]}, clean, every mounted file present",
                  fix=fix, data=data)
        if status_noop:
            c.status = Status.NOOP
        checks.add(c)
    record = {"repo": pin.repo, "commit": pin.commit, "dir": pin.dir,
              "nodes": {n: {"path": paths[n], "state": after[n].state, "commit": after[n].commit,
                            "action": actions[n]} for n in paths}}
    return checks, record


# ------------------------------------------------------------------------------------------------
# the lab recipe's "upstream": a git repository built from runbook/lab/recipe/ (lab only)
# ------------------------------------------------------------------------------------------------

_GIT_ENV = {"GIT_AUTHOR_NAME": "spark-runbook lab", "GIT_AUTHOR_EMAIL": "lab@spark-runbook.invalid",
            "GIT_COMMITTER_NAME": "spark-runbook lab", "GIT_COMMITTER_EMAIL": "lab@spark-runbook.invalid",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def _git(*args: str, cwd: Path | None = None, timeout: float = 60) -> str:
    env = {**os.environ, **_GIT_ENV}
    res = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise LabError(f"git {' '.join(args)} failed", observed=res.stderr.strip()[-400:])
    return res.stdout.strip()


def _lab_files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc")


def _build_lab_repo(src: Path, work: Path) -> str:
    """A git repository of ``src`` at ``work`` with one commit by a fixed author at a fixed date: its id
    depends only on the files (and which are executable). Returns the commit."""
    _git("init", "--quiet", "--template=", str(work))
    for p in _lab_files(src):
        dest = work / p.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dest)
    _git("add", "--all", cwd=work)
    for p in _lab_files(src):
        rel = str(p.relative_to(src))
        _git("update-index", f"--chmod={'+' if rel.endswith('.sh') else '-'}x", rel, cwd=work)
    _git("-c", "commit.gpgSign=false", "commit", "--quiet", "--no-verify", "-m", "spark-runbook lab recipe",
         cwd=work)
    return _git("rev-parse", "HEAD", cwd=work)


def lab_source_commit(src: Path = LAB_SOURCE) -> str:
    """The commit the lab recipe's files make (what env/lab.env pins)."""
    with tempfile.TemporaryDirectory(prefix="lab-recipe-") as tmp:
        return _build_lab_repo(src, Path(tmp) / "work")


def lab_source_repo(profile, src: Path = LAB_SOURCE) -> Path:
    """The lab's stand-in for the recipe's upstream: a bare repository at RECIPE_REPO (a local path) built
    from ``runbook/lab/recipe/``, which the lab head clones like a real head clones from GitHub. Refuses
    when the files no longer make RECIPE_COMMIT (someone edited the lab recipe: update the pin)."""
    dest = profile.resolve_path(profile.recipe_repo)
    if dest.is_dir():
        try:
            if _git("--git-dir", str(dest), "cat-file", "-t", profile.recipe_commit) == "commit":
                return dest
        except LabError:
            pass
    with tempfile.TemporaryDirectory(prefix="lab-recipe-") as tmp:
        work = Path(tmp) / "work"
        commit = _build_lab_repo(src, work)
        if commit != profile.recipe_commit:
            raise LabError(f"the lab recipe files ({src}) make commit {commit}, but RECIPE_COMMIT="
                           f"{profile.recipe_commit}", fix=f"set RECIPE_COMMIT={commit} in {profile.source or 'the profile'}")
        staged = Path(tmp) / "bare.git"
        _git("clone", "--quiet", "--bare", str(work), str(staged))
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(staged), str(dest))
    return dest
