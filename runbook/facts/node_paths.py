"""Node paths as the node sees them: ``~`` expanded with THAT node's home, and who runs there.

A profile path like ``~/.cache/huggingface`` means the home of the SSH user on each node, and a
worker's home can differ from the head's (anchors-2026-12 failure 13: "the head's cache path does
not exist there"). Quoting such a path for the shell (``shlex.quote``) would hand the shell a
literal ``~`` and create ``$HOME/~/…``; rendering ``"$HOME"`` into a command goes wrong under
``sudo`` (HOME may become root's). So each node is asked once, read-only, for its ``$HOME``, uid and
user name (:data:`USER_CMD`), and every path the weights step puts in a command is absolute.

Where a command is built before the node's home is known (a read-only probe), :func:`shell_path` is the one
way to put a node path into it: a leading ``~`` becomes ``"$HOME"``, which the node's own shell expands.
"""
from __future__ import annotations

import posixpath
import re
import shlex
import weakref
from dataclasses import dataclass

from ..errors import RemoteError
from ..remote import expand_home

USER_CMD = 'printf "%s\\n" "$HOME"; id -u; id -un'


@dataclass(frozen=True)
class NodeUser:
    home: str
    uid: int
    name: str

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def parse_user(text: str) -> NodeUser | None:
    """:data:`USER_CMD` output -> NodeUser, or None when it is not three sane lines.

    >>> parse_user("/home/spark\\n1000\\nspark\\n")
    NodeUser(home='/home/spark', uid=1000, name='spark')
    """
    lines = (text or "").splitlines()
    if len(lines) < 3 or not lines[1].strip().isdigit():
        return None
    home = lines[0]
    if not posixpath.isabs(home):
        return None
    return NodeUser(posixpath.normpath(home), int(lines[1].strip()), lines[2].strip())


_USERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def node_user(node) -> NodeUser:
    """The node's home, uid and user name, read once per node object (a fact: runs in dry-run too)."""
    try:
        return _USERS[node]
    except (KeyError, TypeError):     # TypeError: an object without weak references (a test double)
        pass
    res = node.read(USER_CMD, timeout=20)
    user = parse_user(res.stdout)
    if user is None:
        raise RemoteError("cannot read the SSH user's home directory", node=node.name,
                          observed=repr(res.stdout)[:200],
                          expected="an absolute $HOME, a uid and a user name",
                          fix="log in to the node as the profile's SSH user and check that $HOME is set, "
                              "or use absolute paths in the profile")
    try:
        _USERS[node] = user
    except TypeError:
        pass
    return user


def on_node(node, path: str, *, key: str = "path") -> str:
    """``path`` as ``node`` sees it. Reads the node's home only when the path needs it."""
    path = str(path)
    if not path.startswith("~"):
        return expand_home(path, "/", key=key)
    return expand_home(path, node_user(node).home, key=key)


def shell_path(path: str) -> str:
    """``path`` as one shell word the node's shell expands: ``~`` / ``~/rest`` -> ``"$HOME"`` / ``"$HOME"/'rest'``,
    anything else quoted. The one place a node path reaches a shell unexpanded (``shlex.quote('~/x')`` hands the
    shell a literal ``~``: preflight's disk rows walked ``'~/.cache/…'`` up to ``.`` and measured the wrong
    filesystem). ``~user/…`` is refused like :func:`expand_home` does (another user's home).

    >>> print(shell_path("~/.cache/my dir"))
    "$HOME"/'.cache/my dir'
    >>> shell_path("/mnt/nvme/x")
    '/mnt/nvme/x'
    """
    path = str(path)
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"/'
    if path.startswith("~"):
        expand_home(path, "/")                   # raises: another user's home
    return shlex.quote(path)


def vllm_python(profile) -> str | None:
    """The python next to VLLM_BIN (``…/bin/vllm`` -> ``…/bin/python``), or VLLM_BIN if it is python: it has
    torch, which the all-reduce sweep (step 01) and the GPU bandwidth probe (step 07) need."""
    vb = profile.vllm_bin.strip()
    if not vb:
        return None
    first = shlex.split(vb)[0]
    if "/" in first and not first.startswith(("/", "~")):
        first = str(profile.resolve_path(first))   # repo-relative (the lab's nodes share the repo)
    if re.search(r"python[\d.]*$", first):
        return first
    if first.endswith("/vllm"):
        return first[: -len("vllm")] + "python"
    return None


# -- who else may reach a path: an NFS export read by a squashed root -----------------------------------------

def reach_cmd(path: str) -> str:
    """Read-only: the shell's umask, then each component from ``path`` (absolute) up to ``/`` -- ``have <mode>
    <owner> <path>`` (``stat -L``: a symlinked component counts as what it points to) or ``missing <path>`` --
    then the first file or directory under ``path`` that others cannot read (``closed <path>``)."""
    q = shlex.quote(posixpath.normpath(path))
    return (f"umask; p={q}; while :; do if [ -e \"$p\" ]; then stat -L -c 'have %a %U %n' -- \"$p\"; "
            f"else printf 'missing %s\\n' \"$p\"; fi; [ \"$p\" = / ] && break; p=$(dirname -- \"$p\"); done; "
            f"[ -d {q} ] && find {q} -xdev \\( \\( -type f ! -perm -o=r \\) -o \\( -type d ! -perm -o=rx \\) \\) "
            f"-printf 'closed %p\\n' -quit 2>/dev/null; true")


@dataclass(frozen=True)
class Reach:
    path: str
    umask: int | None                       # None: not read
    have: tuple[tuple[str, int, str], ...]  # (path, mode, owner) of each existing component, the path first
    missing: tuple[str, ...]                # components the path still lacks (made later with this umask)
    closed: str = ""                        # a file or directory under the path that others cannot read

    def blocking(self, user: str = "") -> list[tuple[str, str]]:
        """Why a reader who is only "other" (root squashed to nobody by an NFS export) cannot read the tree, each
        with the command that opens it (``sudo`` where ``user``, the SSH user, does not own the component):
        a component without o+x, the path itself without o+rx, content others cannot read, a umask that would
        make the missing components (or the download's files) closed. [] when nothing blocks."""
        out = []
        for p, mode, owner in self.have:
            own = p == self.path
            need = 0o005 if own else 0o001
            if mode & need != need:
                sudo = "" if owner == user else "sudo "
                out.append((f"{p} is {mode:o} ({owner}): others cannot {'list and enter' if own else 'enter'} it",
                            f"{sudo}chmod o+{'rx' if own else 'x'} {shlex.quote(p)}"))
        if self.closed:
            out.append((f"{self.closed} cannot be read by others", f"chmod -R o+rX {shlex.quote(self.path)}"))
        if self.umask is not None and self.umask & 0o005:
            made = "the missing " + ", ".join(self.missing) if self.missing else "new files under it"
            out.append((f"umask {self.umask:04o} makes {made} unreadable to others",
                        f"umask 022 for the SSH user (e.g. in ~/.profile), or chmod -R o+rX {shlex.quote(self.path)} "
                        "after the download"))
        return out


def parse_reach(path: str, text: str) -> Reach | None:
    """:func:`reach_cmd` output -> Reach, or None when it is not that output (no umask line, no component)::

        0022
        missing /home/spark/.cache/dsv41-flash-exl3/model
        have 755 spark /home/spark/.cache
        have 750 spark /home/spark
        have 755 root /home
        have 755 root /
    """
    umask, have, missing, closed = None, [], [], ""
    for line in (text or "").splitlines():
        if re.fullmatch(r"0?[0-7]{3,4}", line.strip()) and umask is None:
            umask = int(line.strip(), 8)
        elif line.startswith("have "):
            parts = line.split(" ", 3)
            if len(parts) == 4 and re.fullmatch(r"[0-7]{3,4}", parts[1]):
                have.append((parts[3], int(parts[1], 8), parts[2]))
        elif line.startswith("missing "):
            missing.append(line[len("missing "):])
        elif line.startswith("closed ") and not closed:
            closed = line[len("closed "):]
    if umask is None or not (have or missing):
        return None
    return Reach(posixpath.normpath(path), umask, tuple(have), tuple(missing), closed)
