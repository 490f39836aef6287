"""The traffic tools 01_network runs on the nodes: perftest (``ib_write_bw``/``ib_write_lat``), OpenMPI's
``mpirun`` and nccl-tests' ``all_reduce_perf``.

Each node is probed once (read-only). A missing tool is never skipped silently: with ``install=True`` the
step installs it -- perftest and OpenMPI from the distribution (``sudo -n apt-get``), nccl-tests built from
source at the pinned tag :data:`NCCL_TESTS_TAG` under ``CACHE_DIR/nccl-tests`` (``make MPI=1`` against the
node's CUDA, OpenMPI and NCCL) -- and checks again; otherwise the row FAILs with the exact commands for that
node. nccl-tests is looked for in ``CACHE_DIR/nccl-tests/build`` and then ``~/nccl-tests/build`` (where
NVIDIA's NCCL playbook builds it); in a rehearsal the simulators' directory is the only place.

Check rows: ``net.tools`` (one per node, before any traffic).
"""
from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

from ..checks import Check, check
from ..lab import sim
from ..remote import expand_home
from ..facts.node_paths import node_user
from .context import Verification

NCCL_TESTS_REPO = "https://github.com/NVIDIA/nccl-tests.git"
NCCL_TESTS_TAG = "v2.18.3"
MPI_HOME = "/usr/lib/aarch64-linux-gnu/openmpi"      # Ubuntu/DGX OS openmpi on arm64 (NVIDIA's NCCL playbook)
CUDA_HOME = "/usr/local/cuda"
PERFTEST = ("ib_write_bw", "ib_write_lat")
APT_PERFTEST = "sudo -n apt-get install -y perftest"
APT_OPENMPI = "sudo -n apt-get install -y openmpi-bin libopenmpi-dev"
SIM_TOOLS = f"the rehearsal's simulators ({sim.SIM_DIR}, runbook.lab.sim) stand in for perftest and nccl-tests"


@dataclass
class NodeTools:
    node: str
    found: dict[str, str] = field(default_factory=dict)       # tool -> path on the node
    nccl_dir: str = ""                                        # the build dir holding all_reduce_perf
    candidates: list[str] = field(default_factory=list)       # where all_reduce_perf was looked for
    src_dir: str = ""                                         # where the step builds nccl-tests

    def missing(self, need_perftest: bool, need_nccl: bool) -> list[str]:
        want = (list(PERFTEST) if need_perftest else []) + (["mpirun"] if need_nccl else [])
        out = [t for t in want if t not in self.found]
        if need_nccl and not self.nccl_dir:
            out.append("all_reduce_perf")
        return out


def probe_cmd(dirs: list[str]) -> str:
    """One read-only probe: ``tool <name> <path>`` / ``missing <name>`` lines, ``nccl <dir>`` when found."""
    tools = " ".join((*PERFTEST, "mpirun"))
    looks = " ".join(shlex.quote(d) for d in dirs)
    return (f"for t in {tools}; do p=$(command -v $t 2>/dev/null) && echo \"tool $t $p\" || echo \"missing $t\"; "
            f"done; for d in {looks}; do [ -x \"$d/all_reduce_perf\" ] && echo \"nccl $d\"; done; true")


def parse_probe(text: str, out: NodeTools) -> NodeTools:
    for line in (text or "").splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0] == "tool":
            out.found[parts[1]] = parts[2]
        elif len(parts) >= 2 and parts[0] == "nccl" and not out.nccl_dir:
            out.nccl_dir = line.split(maxsplit=1)[1]
    return out


def nccl_build_cmd(src_dir: str) -> str:
    """Clone (once) nccl-tests at the pinned tag into ``src_dir`` and build it with MPI."""
    q = shlex.quote(src_dir)
    return (f"set -e; mkdir -p {shlex.quote(posixpath.dirname(src_dir))}; "
            f"[ -d {q}/.git ] || git clone --quiet {NCCL_TESTS_REPO} {q}; "
            f"git -C {q} fetch --quiet --tags origin; git -C {q} checkout --quiet --detach {NCCL_TESTS_TAG}; "
            f"make -C {q} -j4 MPI=1 MPI_HOME={MPI_HOME} CUDA_HOME={CUDA_HOME}; git -C {q} rev-parse HEAD")


def install_commands(t: NodeTools, need_perftest: bool, need_nccl: bool) -> list[str]:
    missing = t.missing(need_perftest, need_nccl)
    cmds = []
    if any(m in PERFTEST for m in missing):
        cmds.append(APT_PERFTEST)
    if "mpirun" in missing:
        cmds.append(APT_OPENMPI)
    if "all_reduce_perf" in missing:
        cmds.append(nccl_build_cmd(t.src_dir))
    return cmds


def locate(node, profile, *, rehearsal_dir: str = "", tests_dir: str = "") -> NodeTools:
    """Where the tools are on ``node`` (reads its home once for ``~`` in CACHE_DIR)."""
    t = NodeTools(node=node.name)
    if rehearsal_dir:
        t.candidates = [rehearsal_dir]
    else:
        home = node_user(node).home
        cache = str(getattr(profile, "cache_dir", "") or "")
        base = expand_home(cache, home, key="CACHE_DIR") if cache else home
        t.src_dir = posixpath.join(base, "nccl-tests")
        t.candidates = ([expand_home(tests_dir, home, key="nccl_tests_dir")] if tests_dir else
                        list(dict.fromkeys([posixpath.join(t.src_dir, "build"),
                                            posixpath.join(home, "nccl-tests", "build")])))
    res = node.read(probe_cmd(t.candidates), timeout=20)
    return parse_probe(getattr(res, "stdout", ""), t)


def tools_check(node, t: NodeTools, *, need_perftest: bool, need_nccl: bool, install: bool,
                rehearsal: bool = False) -> Check:
    """The ``net.tools`` row of one node; installs what is missing when ``install`` (never in a rehearsal)."""
    missing = t.missing(need_perftest, need_nccl)
    want = ", ".join(([*PERFTEST] if need_perftest else []) + (["mpirun", "all_reduce_perf"] if need_nccl else []))
    expected = f"{want} on {node.name}"
    if not missing:
        return check("net.tools", True, node=node.name, expected=expected,
                     observed="; ".join([f"{k} {v}" for k, v in sorted(t.found.items())] +
                                        ([f"all_reduce_perf in {t.nccl_dir}"] if need_nccl else [])))
    cmds = install_commands(t, need_perftest, need_nccl)
    what = ", ".join(missing) + (f" (looked in {', '.join(t.candidates)})" if "all_reduce_perf" in missing else "")
    if rehearsal or not install:
        how = ("reinstall the rehearsal simulators (they are installed by 00_preflight / 01_network)" if rehearsal
               else f"on {node.name} run: " + " && ".join(cmds) +
               " -- or let 01_network install them (INSTALL_NET_TOOLS=1 / runbook.network.run(step, install_tools=True))")
        return check("net.tools", False, node=node.name, observed=f"missing on {node.name}: {what}",
                     expected=expected, fix=how, data={"install_commands": cmds})
    done = []
    for cmd in cmds:
        res = node.run(cmd, timeout=1800, warn=True)
        if not res.ok:
            tail = ((res.stderr or "") + (res.stdout or "")).strip().splitlines()[-3:]
            return check("net.tools", False, node=node.name,
                         observed=f"installing {what} failed: {' | '.join(tail)[:300]}", expected=expected,
                         fix=f"on {node.name} run by hand and read the error: {cmd} (nccl-tests needs CUDA at "
                             f"{CUDA_HOME}, OpenMPI at {MPI_HOME} and NCCL's headers, e.g. libnccl-dev)",
                         data={"install_commands": cmds})
        if cmd.startswith("set -e"):
            commit = ((res.stdout or "").strip().splitlines() or ["?"])[-1][:12]
            done.append(f"nccl-tests {NCCL_TESTS_TAG} (commit {commit}) built in {t.src_dir}")
        else:
            done.append(cmd.split(" -y ", 1)[-1] + " from the distribution")
    again = locate_again(node, t)
    left = again.missing(need_perftest, need_nccl)
    return check("net.tools", not left, node=node.name, expected=expected,
                 observed=(f"installed {', '.join(missing)}: {'; '.join(done)}" if not left
                           else f"still missing after install: {', '.join(left)}"),
                 fix="read the install output in commands.jsonl", data={"install_commands": cmds})


def locate_again(node, t: NodeTools) -> NodeTools:
    res = node.read(probe_cmd(t.candidates), timeout=20)
    return parse_probe(getattr(res, "stdout", ""), NodeTools(node=t.node, candidates=t.candidates, src_dir=t.src_dir))


def tools_checks(ctx: Verification, tests_dir: str, install: bool) -> None:
    """perftest / mpirun / nccl-tests present on every node (installed when allowed), before any traffic."""
    need_perftest = ctx.expect_rdma
    need_nccl = ctx.expect_rdma and ctx.expect_gpu
    if not (need_perftest or need_nccl):
        return

    def one(node):
        t = locate(node, ctx.profile, rehearsal_dir=sim.NCCL_TESTS_DIR if ctx.rehearsal else "",
                   tests_dir=tests_dir)
        ctx.nccl_dirs[node.name] = t.nccl_dir or (t.candidates[0] if t.candidates else "")
        return tools_check(node, t, need_perftest=need_perftest, need_nccl=need_nccl, install=install,
                           rehearsal=ctx.rehearsal)

    for name, value in ctx.cluster.each(one).items():
        if isinstance(value, Exception):
            value = check("net.tools", False, node=name, observed=f"probe failed: {str(value).splitlines()[0][:200]}",
                          expected="perftest and nccl-tests located", fix="check the node is reachable")
        ctx.add_hw(value, SIM_TOOLS)
