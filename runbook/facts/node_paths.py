"""Node paths as the node sees them: ``~`` expanded with THAT node's home, and who runs there.

A profile path like ``~/.cache/huggingface`` means the home of the SSH user on each node, and a
worker's home can differ from the head's (anchors-2026-12 failure 13: "the head's cache path does
not exist there"). Quoting such a path for the shell (``shlex.quote``) would hand the shell a
literal ``~`` and create ``$HOME/~/…``; rendering ``"$HOME"`` into a command goes wrong under
``sudo`` (HOME may become root's). So each node is asked once, read-only, for its ``$HOME``, uid and
user name (:data:`USER_CMD`), and every path the weights step puts in a command is absolute.
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
