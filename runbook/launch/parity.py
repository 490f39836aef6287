"""The parity table: every setting a recipe's own scripts make, beside what the runbook renders, with a verdict.

    table = load_table("exl3-v41")                 # docs/parity/exl3-v41.json (rows; tp3-dspark extends dspark-v4,
                                                   # tp4-v41 extends exl3-v41 with another recipe: base_label)
    plan = parity_plan(table)                      # the profile rendered by render.render, as step 04 would
    problems = check_table(table, plan)            # [] when every rendered item has a row and every *same* holds
    text = to_markdown(table, plan)                # docs/parity/exl3-v41.md (the "ours" column is the render)

A row: ``kind`` (env | docker | mount | serve | step | policy), ``name``, ``ref`` (where the recipe sets it:
``file:line@commit`` and the block; file@commit alone where that file or commit is not stored), ``recipe`` (its value: a
string for every rank, or ``{"head": ..., "worker": ...}`` per rank where a missing node means "not set
there"; ``<...>`` describes a per-node value and is checked for presence only), ``verdict`` (same |
deviation | n/a) and ``why`` (required unless *same*: the reason and what it costs).

Rendered items, per rank: ``env`` the container/process environment (a secret as ``***``), ``docker`` each
``docker run`` option before the image (repeated options joined with ``,``; the image and the entrypoint
too), ``mount`` each ``-v`` by its container path (value ``ro`` or ``rw``), ``serve`` each ``vllm serve``
flag (``true`` for a bare flag; ``model`` the positional). The checks: every rendered item has a row; a
*same* row's value is what renders on every rank; an *n/a* row of a rendered kind is not rendered at all.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..secrets import MASK
from .render import LaunchPlan, NodeFacts, render

__all__ = [
    "KINDS",
    "PARITY_DIR",
    "VERDICTS",
    "check_table",
    "load_table",
    "parity_plan",
    "rendered_items",
    "to_markdown",
    "write_docs",
]

PARITY_DIR = Path(__file__).resolve().parents[2] / "docs" / "parity"
RENDERED_KINDS = ("env", "docker", "mount", "serve")
KINDS = (*RENDERED_KINDS, "step", "policy")
VERDICTS = ("same", "deviation", "n/a")
TABLES = ("exl3-v41", "dspark-v4", "tp3-dspark", "tp4-v41")
_REPEATABLE = ("--cap-add", "--ulimit", "--device")


def load_table(name: str, directory: Path = PARITY_DIR) -> dict[str, Any]:
    """A table's JSON with its ``extends`` resolved (rows of the same kind+name replace the base's)."""
    data = json.loads((directory / f"{name}.json").read_text())
    if data.get("extends"):
        base = load_table(data["extends"], directory)
        own = {(r["kind"], r["name"]): r for r in data["rows"]}
        label = data.get("base_label", "")          # names the base's recipe on the rows this table keeps
        rows = [own.pop((r["kind"], r["name"]), {**r, "ref": f"{label}: {r['ref']}"} if label else r)
                for r in base["rows"]]
        rows += [r for r in data["rows"] if (r["kind"], r["name"]) in own]
        rows = [r for r in rows if not r.get("drop")]
        data = {**base, **{k: v for k, v in data.items() if k != "rows"}, "rows": rows}
    _validate(name, data)
    return data


def _validate(name: str, data: dict[str, Any]) -> None:
    for i, r in enumerate(data["rows"]):
        where = f"docs/parity/{name}.json row {i} ({r.get('kind')} {r.get('name')})"
        if r.get("kind") not in KINDS or r.get("verdict") not in VERDICTS or not r.get("name") or not r.get("ref"):
            raise ValueError(f"{where}: needs kind in {KINDS}, name, ref and verdict in {VERDICTS}")
        if r["verdict"] != "same" and not r.get("why"):
            raise ValueError(f"{where}: a {r['verdict']} row says why (and what it costs)")


def parity_plan(table: dict[str, Any], home: str = "/home/spark") -> LaunchPlan:
    """The table's profile rendered as step 04 renders it on recipe-cabled nodes: GID index 3 resolved by
    step 01, the packed Engram shard present on every node (the recipe then mounts it), an API key set (so
    the key's row is exercised; its value never appears)."""
    from ..profile import REPO_ROOT, load_profile
    profile = load_profile(REPO_ROOT / table["profile"])
    facts = {n.name: NodeFacts(home=home, gid_index=3, packed_engram=bool(profile.engram)) for n in profile.nodes}
    return render(profile, facts, api_key_set=True)


def _docker_items(argv: list[str]) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    i = 3                                         # docker run -d
    while i < len(argv):
        a = argv[i]
        if a == "--entrypoint":
            out[("docker", "--entrypoint")] = argv[i + 1]
            out[("docker", "image")] = argv[i + 2]
            break
        if a in ("-e", "-v"):
            i += 2
            continue
        if a.startswith("--") and "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            key, val = ("docker", a), argv[i + 1]
            out[key] = f"{out[key]},{val}" if key in out and a in _REPEATABLE else val
            i += 2
            continue
        out[("docker", a)] = "true"
        i += 1
    return out


def _serve_items(argv: list[str]) -> dict[tuple[str, str], str]:
    i = argv.index("serve")
    out = {("serve", "model"): argv[i + 1]}
    rest = argv[i + 2:]
    j = 0
    while j < len(rest):
        a = rest[j]
        vals = []
        while j + 1 < len(rest) and not rest[j + 1].startswith("--"):
            vals.append(rest[j + 1])
            j += 1
        out[("serve", a)] = " ".join(vals) if vals else "true"
        j += 1
    return out


def rendered_items(plan: LaunchPlan) -> dict[tuple[str, str], dict[str, str]]:
    """(kind, name) -> {node: value} over every rank of the plan."""
    items: dict[tuple[str, str], dict[str, str]] = {}

    def put(node: str, key: tuple[str, str], value: str) -> None:
        items.setdefault(key, {})[node] = value

    for r in plan.ranks:
        for k, v in r.env.items():
            put(r.node, ("env", k), v)
        for k in r.secret_env:
            put(r.node, ("env", k), MASK)
        for key, v in _serve_items(r.serve_argv).items():
            put(r.node, key, v)
        if r.docker_argv:
            for key, v in _docker_items(r.docker_argv).items():
                put(r.node, key, v)
            argv = r.docker_argv
            for i, a in enumerate(argv[:-1]):
                if a == "-v":
                    parts = argv[i + 1].split(":")
                    put(r.node, ("mount", parts[1]), "ro" if parts[2:] == ["ro"] else "rw")
    return items


def _expected(row: dict[str, Any], node: str) -> str | None:
    want = row["recipe"]
    return want.get(node) if isinstance(want, dict) else want


def check_table(table: dict[str, Any], plan: LaunchPlan) -> list[str]:
    """What makes the table untrue of the render: a rendered item without a row, a *same* row whose value is not
    what renders, an *n/a* row that renders, a row named twice."""
    problems: list[str] = []
    rows = {}
    for r in table["rows"]:
        key = (r["kind"], r["name"])
        if key in rows:
            problems.append(f"{key[0]} {key[1]}: two rows")
        rows[key] = r
    items = rendered_items(plan)
    nodes = [r.node for r in plan.ranks]
    for key, per_node in items.items():
        if key not in rows:
            problems.append(f"{key[0]} {key[1]}: rendered ({per_node.get('head', next(iter(per_node.values())))!r}) "
                            "but the table has no row")
    for key, r in rows.items():
        if r["kind"] not in RENDERED_KINDS:
            continue
        got = items.get(key, {})
        if r["verdict"] == "n/a" and got:
            problems.append(f"{key[0]} {key[1]}: n/a in the table but rendered {got}")
        if r["verdict"] != "same":
            continue
        for node in nodes:
            want, have = _expected(r, node), got.get(node)
            if isinstance(want, str) and want.startswith("<") and want.endswith(">"):
                ok = have is not None
            else:
                ok = have == want
            if not ok:
                problems.append(f"{key[0]} {key[1]} on {node}: the recipe's {want!r}, rendered {have!r}")
    return problems


def _cell(text: Any) -> str:
    if text == {}:
        return "(not set)"
    if isinstance(text, dict):
        text = "; ".join(f"{k}: {v}" for k, v in text.items())
    s = "" if text is None else str(text)
    return s.replace("|", "\\|").replace("\n", " ") or " "


def _ours(per_node: dict[str, str]) -> str:
    if not per_node:
        return "(not rendered)"
    values = set(per_node.values())
    if len(values) == 1 and len(per_node) > 1:
        return next(iter(values))
    return "; ".join(f"{n}: {v}" for n, v in per_node.items())


def to_markdown(table: dict[str, Any], plan: LaunchPlan) -> str:
    items = rendered_items(plan)
    counts = {v: sum(1 for r in table["rows"] if r["verdict"] == v) for v in VERDICTS}
    out = [f"# Parity: {table['title']}", "",
           f"Generated by `python -m runbook.launch.parity` from `docs/parity/{table['name']}.json` and the "
           f"render of `{table['profile']}` (`runbook/launch/parity.py`); `tests/unit/test_parity.py` fails when a "
           "*same* row differs from the render, an *n/a* row renders, or a rendered item has no row. Do not edit "
           "by hand: edit the JSON and regenerate.", "",
           *[f"{line}\n" for line in table.get("intro", [])],
           f"{len(table['rows'])} rows: {counts['same']} same, {counts['deviation']} deliberate deviations, "
           f"{counts['n/a']} not applicable. *ours* is the rendered value (rank: value where ranks differ).", "",
           "| kind | name | recipe (file:line@commit, block) | recipe value | ours | verdict | why (and what it costs) |",
           "|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        ours = _ours(items.get((r["kind"], r["name"]), {})) if r["kind"] in RENDERED_KINDS else r.get("ours", "")
        out.append("| " + " | ".join(_cell(x) for x in (r["kind"], f"`{r['name']}`", r["ref"], r["recipe"], ours,
                                                        r["verdict"], r.get("why") or r.get("note", ""))) + " |")
    return "\n".join(out) + "\n"


def write_docs(directory: Path = PARITY_DIR) -> list[Path]:
    """Regenerate every docs/parity/<table>.md from its JSON and the render."""
    paths = []
    for name in TABLES:
        table = load_table(name, directory)
        path = directory / f"{name}.md"
        path.write_text(to_markdown(table, parity_plan(table)))
        paths.append(path)
    return paths


if __name__ == "__main__":       # python -m runbook.launch.parity: regenerate the tables, print what differs
    for p in write_docs():
        t = load_table(p.stem)
        bad = check_table(t, parity_plan(t))
        print(f"{p}: {len(t['rows'])} rows" + (f"; {len(bad)} problem(s):\n  " + "\n  ".join(bad) if bad else ""))
