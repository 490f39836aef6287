"""The tools 01_network runs on the nodes: ``iperf3`` and ``ethtool`` (every Spark run), perftest
(``ib_write_bw``/``ib_write_lat``, EXPECT_RDMA=1), OpenMPI's ``mpirun`` and nccl-tests' ``all_reduce_perf``
(EXPECT_RDMA=1 and EXPECT_GPU=1).

Each node is probed once (read-only). A missing tool is never skipped silently: with ``install=True``
(the profile's INSTALL_NET_TOOLS) the step installs it -- the distribution packages of :data:`APT_PACKAGES`
in one ``sudo -n apt-get install -y …`` (timeout 30 min), nccl-tests built from source at the pinned tag
:data:`NCCL_TESTS_TAG` under ``CACHE_DIR/nccl-tests`` (``make MPI=1`` against the node's CUDA, OpenMPI and
the NCCL headers found, ``NCCL_HOME``) -- and checks again; otherwise the row FAILs with the exact commands
for that node and names the key. nccl-tests is looked for in ``CACHE_DIR/nccl-tests/build`` and then ``~/nccl-tests/build`` (where
NVIDIA's NCCL playbook builds it); in a rehearsal the simulators' directory is the only place.

In a rehearsal the other tools are the lab's real packages (perftest, OpenMPI, iperf3, ethtool): the probe
looks them up with the simulators' directory left off PATH, so the row names the package's binary, and says
which of them a simulator shadows when the tests run (perftest's ``ib_write_bw``/``ib_write_lat``).

Check rows: ``net.tools`` (one per node, before any traffic).
"""
from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

from ..checks import Check, check
from ..remote import expand_home
from ..facts.node_paths import node_user
from ..site import SPARKS_SITE, Site
from ..weights_tools.nfs import sudo_argvs, sudo_probe_cmd
from .context import Verification

NCCL_TESTS_REPO = "https://github.com/NVIDIA/nccl-tests.git"
NCCL_TESTS_TAG = "v2.18.3"
MPI_HOME = "/usr/lib/aarch64-linux-gnu/openmpi"      # Ubuntu/DGX OS openmpi on arm64 (NVIDIA's NCCL playbook)
CUDA_HOME = "/usr/local/cuda"
PERFTEST = ("ib_write_bw", "ib_write_lat")
BASE_TOOLS = ("iperf3", "ethtool")                   # TCP bandwidth and link speed: every run
# what step 01 runs -> the Ubuntu / DGX OS package that installs it (libnccl-dev: NVIDIA's CUDA repository,
# configured on DGX OS; it puts nccl.h under /usr/include, NCCL_HOME=/usr)
APT_PACKAGES = {"ib_write_bw": "perftest", "ib_write_lat": "perftest", "mpirun": "openmpi-bin libopenmpi-dev",
                "iperf3": "iperf3", "ethtool": "ethtool", "nccl.h": "libnccl-dev"}
APT_INSTALL = "sudo -n apt-get install -y"
#: the drop-in that lets a non-root SSH user run exactly step 01's apt-get (apart from the NFS one: installing
#: packages as root is a wider right, given only where INSTALL_NET_TOOLS=1 is wanted)
NET_TOOLS_SUDOERS = "/etc/sudoers.d/spark-runbook-net-tools"
NCCL_HOMES = ("nccl/build", "/usr")       # NVIDIA's Spark NCCL playbook builds ~/nccl/build; libnccl-dev: /usr


def sim_tools(site: Site) -> str:
    """Why a rehearsal's ``net.tools`` row says SIMULATED (the site's simulator directories)."""
    return (f"perftest, OpenMPI, iperf3 and ethtool were found as the lab's own packages ({site.simulator_bin} left "
            f"off PATH); the tests then run the simulators of runbook.lab.sim that shadow ib_write_bw/ib_write_lat, "
            f"and all_reduce_perf is the simulator ({site.nccl_tests_dir}: nccl-tests needs a GPU)")


@dataclass
class NodeTools:
    node: str
    found: dict[str, str] = field(default_factory=dict)       # tool -> path on the node
    nccl_dir: str = ""                                        # the build dir holding all_reduce_perf
    candidates: list[str] = field(default_factory=list)       # where all_reduce_perf was looked for
    src_dir: str = ""                                         # where the step builds nccl-tests
    nccl_homes: list[str] = field(default_factory=list)       # where nccl.h was looked for (NCCL_HOME)
    nccl_home: str = ""                                       # the first of them holding include/nccl.h
    shadowed: dict[str, str] = field(default_factory=dict)    # rehearsal: tool -> the simulator run instead

    def missing(self, need_perftest: bool, need_nccl: bool) -> list[str]:
        want = [*BASE_TOOLS, *(PERFTEST if need_perftest else ()), *(("mpirun",) if need_nccl else ())]
        out = [t for t in want if t not in self.found]
        if need_nccl and not self.nccl_dir:
            out.append("all_reduce_perf")
            if not self.nccl_home:
                out.append("nccl.h")            # nccl-tests builds against the NCCL headers
        return out


def probe_cmd(dirs: list[str], *, tools: tuple[str, ...] = (*PERFTEST, "mpirun", *BASE_TOOLS),
              nccl_homes: list[str] = (), hide: str = "") -> str:
    """One read-only probe: ``tool <name> <path>`` / ``missing <name>`` lines (sbin included: ethtool lives
    there), ``nccl <dir>`` when all_reduce_perf is found, ``ncclhome <dir>`` for the first dir with nccl.h.
    ``hide`` (a rehearsal's simulator bin, first on PATH) is left off PATH for the lookup, and each tool it
    holds is named in a ``shadow <name> <path>`` line."""
    looks = " ".join(shlex.quote(d) for d in dirs)
    homes = " ".join(shlex.quote(d) for d in nccl_homes)
    path = f'${{PATH#{hide}:}}' if hide else "$PATH"
    shadow = f'; [ -x {shlex.quote(hide)}/$t ] && echo "shadow $t {hide}/$t"' if hide else ""
    cmd = (f"for t in {' '.join(tools)}; do p=$(PATH=\"{path}:/usr/sbin:/sbin\" command -v $t 2>/dev/null) && "
           f"echo \"tool $t $p\" || echo \"missing $t\"{shadow}; done; ")
    if looks:
        cmd += f"for d in {looks}; do [ -x \"$d/all_reduce_perf\" ] && echo \"nccl $d\"; done; "
    if homes:
        cmd += f"for d in {homes}; do [ -f \"$d/include/nccl.h\" ] && echo \"ncclhome $d\" && break; done; "
    return cmd + "true"


def parse_probe(text: str, out: NodeTools, hide: str = "") -> NodeTools:
    """The probe's lines into ``out``; a tool found only under ``hide`` (the simulators) is not found."""
    for line in (text or "").splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0] == "tool":
            if not (hide and parts[2].startswith(hide.rstrip("/") + "/")):
                out.found[parts[1]] = parts[2]
        elif len(parts) == 3 and parts[0] == "shadow":
            out.shadowed[parts[1]] = parts[2]
        elif len(parts) >= 2 and parts[0] == "nccl" and not out.nccl_dir:
            out.nccl_dir = line.split(maxsplit=1)[1]
        elif len(parts) >= 2 and parts[0] == "ncclhome" and not out.nccl_home:
            out.nccl_home = line.split(maxsplit=1)[1]
    return out


def nccl_build_cmd(src_dir: str, nccl_home: str = "/usr") -> str:
    """Clone (once) nccl-tests at the pinned tag into ``src_dir`` and build it with MPI against the NCCL
    headers and library under ``nccl_home`` (``NCCL_HOME``: include/nccl.h, lib/)."""
    q = shlex.quote(src_dir)
    return (f"set -e; mkdir -p {shlex.quote(posixpath.dirname(src_dir))}; "
            f"[ -d {q}/.git ] || git clone --quiet {NCCL_TESTS_REPO} {q}; "
            f"git -C {q} fetch --quiet --tags origin; git -C {q} checkout --quiet --detach {NCCL_TESTS_TAG}; "
            f"make -C {q} -j4 MPI=1 MPI_HOME={MPI_HOME} CUDA_HOME={CUDA_HOME} NCCL_HOME={shlex.quote(nccl_home)}; "
            f"git -C {q} rev-parse HEAD")


def install_commands(t: NodeTools, need_perftest: bool, need_nccl: bool) -> list[str]:
    """The exact commands that install what ``t`` lacks: one apt-get for the packages of
    :data:`APT_PACKAGES` (in table order, each once), then the nccl-tests build."""
    missing = t.missing(need_perftest, need_nccl)
    pkgs: list[str] = []
    for tool, pkg in APT_PACKAGES.items():
        if tool in missing:
            pkgs += [p for p in pkg.split() if p not in pkgs]
    cmds = [f"{APT_INSTALL} {' '.join(pkgs)}"] if pkgs else []
    if "all_reduce_perf" in missing:
        cmds.append(nccl_build_cmd(t.src_dir, t.nccl_home or "/usr"))
    return cmds


def wanted_tools(need_perftest: bool, need_nccl: bool) -> tuple[str, ...]:
    return (*(PERFTEST if need_perftest else ()), *(("mpirun",) if need_nccl else ()), *BASE_TOOLS)


def locate(node, profile, *, site: Site = SPARKS_SITE, tests_dir: str = "", need_perftest: bool = True,
           need_nccl: bool = True) -> NodeTools:
    """Where the tools are on ``node`` (reads its home once for ``~`` in CACHE_DIR, when nccl-tests is needed);
    where the site has its own nccl-tests (a rehearsal's simulator) only there, its simulators' bin left off PATH."""
    t = NodeTools(node=node.name)
    hide = site.simulator_bin if site.nccl_tests_dir else ""
    if site.nccl_tests_dir:
        t.candidates = [site.nccl_tests_dir]
    elif need_nccl:
        home = node_user(node).home
        t.src_dir = posixpath.join(expand_home(profile.cache_dir, home, key="CACHE_DIR"), "nccl-tests")
        t.candidates = ([expand_home(tests_dir, home, key="nccl_tests_dir")] if tests_dir else
                        list(dict.fromkeys([posixpath.join(t.src_dir, "build"),
                                            posixpath.join(home, "nccl-tests", "build")])))
        t.nccl_homes = [posixpath.join(home, d) for d in NCCL_HOMES]
    res = node.read(probe_cmd(t.candidates, tools=wanted_tools(need_perftest, need_nccl), nccl_homes=t.nccl_homes,
                              hide=hide), timeout=20)
    return parse_probe(res.stdout, t, hide)


def tools_check(node, t: NodeTools, *, need_perftest: bool, need_nccl: bool, install: bool,
                rehearsal: bool = False) -> Check:
    """The ``net.tools`` row of one node; installs what is missing when ``install`` (never in a rehearsal)."""
    missing = t.missing(need_perftest, need_nccl)
    want = ", ".join([*BASE_TOOLS, *(PERFTEST if need_perftest else ()),
                      *(("mpirun", "all_reduce_perf") if need_nccl else ())])
    expected = f"{want} on {node.name}"
    if not missing:
        return check("net.tools", True, node=node.name, expected=expected,
                     observed="; ".join([f"{k} {v}" + (f" (the tests run the simulator {t.shadowed[k]})"
                                                       if k in t.shadowed else "")
                                         for k, v in sorted(t.found.items())] +
                                        ([f"all_reduce_perf in {t.nccl_dir}"] if need_nccl else [])))
    cmds = install_commands(t, need_perftest, need_nccl)
    what = ", ".join(missing) + (f" (looked in {', '.join(t.candidates)})" if "all_reduce_perf" in missing else "")
    if rehearsal or not install:
        how = (rehearsal_fix(missing) if rehearsal
               else f"on {node.name} run: " + " && ".join(cmds) +
               " -- or set INSTALL_NET_TOOLS=1 in the profile and 01_network installs them (sudo -n apt-get; "
               "runbook.network.run(step, install_tools=True) for one run)")
        return check("net.tools", False, node=node.name, observed=f"missing on {node.name}: {what}",
                     expected=expected, fix=how, data={"install_commands": cmds})
    refused = install_sudo_refusal(node, cmds)
    if refused:
        return check("net.tools", False, node=node.name, observed=f"missing on {node.name}: {what}; {refused}",
                     expected=expected, fix=net_tools_sudoers_fix(node, cmds), data={"install_commands": cmds})
    done = []
    for cmd in cmds:
        res = node.run(cmd, timeout=1800, warn=True)
        if not res.ok:
            # stderr last: apt prints its progress on stdout and the error (E: ...) on stderr
            tail = ((res.stdout or "") + "\n" + (res.stderr or "")).strip().splitlines()[-3:]
            return check("net.tools", False, node=node.name,
                         observed=f"installing {what} failed: {' | '.join(tail)[:300]}", expected=expected,
                         fix=f"on {node.name} run by hand and read the error: {cmd} (nccl-tests needs CUDA at "
                             f"{CUDA_HOME}, OpenMPI at {MPI_HOME} and NCCL's headers, e.g. libnccl-dev)",
                         data={"install_commands": cmds})
        if cmd.startswith("set -e"):
            commit = ((res.stdout or "").strip().splitlines() or ["?"])[-1][:12]
            done.append(f"nccl-tests {NCCL_TESTS_TAG} (commit {commit}) built in {t.src_dir}")
        else:
            done.append(cmd.split(" -y ", 1)[-1] + " (apt-get)")
    again = locate_again(node, t, wanted_tools(need_perftest, need_nccl))
    left = again.missing(need_perftest, need_nccl)
    return check("net.tools", not left, node=node.name, expected=expected,
                 observed=(f"installed {', '.join(missing)}: {'; '.join(done)}" if not left
                           else f"still missing after install: {', '.join(left)}"),
                 fix="read the install output in commands.jsonl", data={"install_commands": cmds})


def install_sudo_refusal(node, cmds: list[str]) -> str:
    """Before anything is installed: '' when the SSH user is root or sudo allows each ``sudo -n`` command of
    ``cmds`` without a password (``sudo -n -l <command>``, read-only), else what sudo answered for the first one it
    refuses (a missing rule used to surface as "installing … failed: a password is required", after the probe)."""
    user = node_user(node)
    if user.is_root:
        return ""
    for argv in sudo_argvs(cmds):
        res = node.read(sudo_probe_cmd(argv), timeout=20)
        if not res.ok:
            said = ((res.stderr or "") + (res.stdout or "")).strip().splitlines()
            return (f"sudo refuses `{' '.join(argv)}` to {user.name} without a password "
                    f"(`{sudo_probe_cmd(argv)}`: exit {res.exit_code}{': ' + said[-1] if said else ''})")
    return ""


def net_tools_sudoers_line(user: str, cmds: list[str]) -> str:
    """The drop-in's line allowing ``user`` exactly the ``sudo -n`` commands of ``cmds`` (``apt-get install -y
    <packages>``; a program without a path is the distribution's, /usr/bin)."""
    rules = ", ".join(" ".join([argv[0] if "/" in argv[0] else f"/usr/bin/{argv[0]}", *argv[1:]])
                      for argv in sudo_argvs(cmds))
    return f"{user} ALL=(root) NOPASSWD: {rules}"


def net_tools_sudoers_fix(node, cmds: list[str]) -> str:
    """The drop-in for :func:`net_tools_sudoers_line`, or installing by hand, or leaving INSTALL_NET_TOOLS at 0."""
    line = net_tools_sudoers_line(node_user(node).name, cmds)
    return (f"on {node.name}: echo '{line}' | sudo tee {NET_TOOLS_SUDOERS} && sudo chmod 0440 {NET_TOOLS_SUDOERS} "
            f"&& sudo visudo -cf {NET_TOOLS_SUDOERS}; or run as an admin: " + " && ".join(cmds) +
            "; or set INSTALL_NET_TOOLS=0 and install them yourself")


def rehearsal_fix(missing: list[str]) -> str:
    """How a rehearsal gets what it lacks: the lab host's packages (each `lab up` after a `lab down` starts the
    nodes' own /usr from the lab host's), and the simulators for all_reduce_perf (there is no nccl-tests without
    CUDA)."""
    pkgs = [p for tool, pkg in APT_PACKAGES.items() if tool in missing and tool != "nccl.h" for p in pkg.split()]
    out = [f"install the lab's packages on the lab host: apt-get install -y {' '.join(dict.fromkeys(pkgs))} "
           "(make lab-deps), then `python -m runbook lab down` and `up` (each lab node starts from the lab host's "
           "packages)"] if pkgs else []
    if "all_reduce_perf" in missing:
        out.append("reinstall the rehearsal simulators (they are installed by 00_preflight / 01_network)")
    return "; ".join(out)


def locate_again(node, t: NodeTools, tools: tuple[str, ...]) -> NodeTools:
    res = node.read(probe_cmd(t.candidates, tools=tools, nccl_homes=t.nccl_homes), timeout=20)
    return parse_probe(res.stdout, NodeTools(node=t.node, candidates=t.candidates, src_dir=t.src_dir,
                                                 nccl_homes=t.nccl_homes))


def tools_checks(ctx: Verification, tests_dir: str, install: bool) -> None:
    """iperf3, ethtool, perftest / mpirun / nccl-tests present on every node (installed when allowed), before
    any traffic."""
    need_perftest = ctx.expect_rdma
    need_nccl = ctx.expect_rdma and ctx.expect_gpu
    if not (need_perftest or need_nccl):
        return      # the lab's profiles (no RDMA): its nodes run the host's iperf3 and ethtool, which `lab up` needs

    def one(node):
        t = locate(node, ctx.profile, site=ctx.site, tests_dir=tests_dir, need_perftest=need_perftest,
                   need_nccl=need_nccl)
        ctx.nccl_dirs[node.name] = t.nccl_dir or (t.candidates[0] if t.candidates else "")
        return tools_check(node, t, need_perftest=need_perftest, need_nccl=need_nccl, install=install,
                           rehearsal=ctx.rehearsal)

    for name, value in ctx.cluster.each(one).items():
        if isinstance(value, Exception):
            value = check("net.tools", False, node=name, observed=f"probe failed: {str(value).splitlines()[0][:200]}",
                          expected="perftest and nccl-tests located", fix="check the node is reachable")
        ctx.add_hw(value, sim_tools(ctx.site))
