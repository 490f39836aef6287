"""Diagnose: the catalogue over captured bundles, the healthy lab logs, the bundle writer (planted
secrets), the collection contract, and the parsers it adds to runbook.facts.

Fixtures: ``data/<scenario>/`` are bundles laid out as the archive is (``<node>/<name>``,
``context.json``, ``timings.json``); each has a ``SOURCE.md`` saying what was captured for real and
what follows a published format. ``data/EXPECTED.json`` is the reviewed set of entries each scenario
must match: exactly those, no more.
"""
from __future__ import annotations

import json
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest

from runbook.diagnose import (BY_ID, ENTRIES, LOCAL, Bundle, Context, Entry, NodeInfo, catalogue_markdown,
                              collect_commands, match, page_paths, read_bundle, write_bundle)
from runbook.diagnose import archive as A
from runbook.diagnose import bundle as B
from runbook.facts import docker_pull, firewall, hostlog, ibv, procs, sockets
from runbook.profile import load_profile
from runbook.secrets import Redactor

HERE = Path(__file__).parent
DATA = HERE / "data"
ROOT = HERE.parents[2]
LOGS = ROOT / "tests" / "unit" / "data" / "vllm_logs"
EXPECTED: dict[str, list[str]] = json.loads((DATA / "EXPECTED.json").read_text())
SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "context.json").is_file())


# --------------------------------------------------------------------------- catalogue over fixtures


def test_every_scenario_has_an_expectation_and_a_source():
    assert SCENARIOS, "no fixture scenarios found"
    assert sorted(EXPECTED) == SCENARIOS
    for name in SCENARIOS:
        assert (DATA / name / "SOURCE.md").is_file(), f"{name}: say where the fixture comes from"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_matches_exactly_its_entries(scenario):
    findings = match(read_bundle(DATA / scenario))
    assert sorted({f.id for f in findings}) == EXPECTED[scenario]
    for f in findings:
        assert f.evidence and all(isinstance(e, str) and e for e in f.evidence), f.id
        assert "{master_port}" not in f.proof and "{port}" not in f.fix, "placeholders the context knows are filled"


def test_every_entry_has_a_positive_fixture_or_corpus_case():
    """A bundle scenario where one can be captured or follows a published format; otherwise at least one
    case of the accuracy corpus (real report text) that the entry must rank first on."""
    from runbook.diagnose.accuracy import load_corpus
    covered = {e for ids in EXPECTED.values() for e in ids}
    covered |= {c.expect for c in load_corpus() if c.expect}
    assert ENTRIES
    missing = [e.id for e in ENTRIES if e.id not in covered]
    assert not missing, f"entries without a positive fixture or corpus case: {missing}"


def test_catalogue_entries_are_complete():
    assert len(ENTRIES) >= 45
    for e in ENTRIES:
        assert e.severity in ("fatal", "degraded", "warning")
        assert e.signature is not None or e.lines or e.words, f"{e.id}: nothing recognises it"
        for field in ("title", "symptom", "detect", "cause", "fix", "proof", "source", "lab"):
            assert getattr(e, field).strip(), f"{e.id}: empty {field}"


def _lab_context(head_ip: str, worker_ip: str, *, names=("head", "worker"), ifname="enp1s0f0np0") -> Context:
    return Context(nodes=tuple(NodeInfo(n, i, ip, ifname, ip, ifname) for i, (n, ip) in
                               enumerate(zip(names, (head_ip, worker_ip)))),
                   master_port=29501, port=8000, served_model_name="tiny", fabric_mtu=9000, runtime="process")


HEALTHY = [
    ("cpu032_tp2_head.log", "cpu032_tp2_worker.log", _lab_context("169.254.77.1", "169.254.77.2")),
    ("cpu032_tp2_docker_head.log", "cpu032_tp2_docker_worker.log", _lab_context("169.254.77.1", "169.254.77.2")),
    # the TP3 loopback run: every rank on one host, rendezvous on 127.0.0.1 (rank 2 is the third node)
    ("cpu032_tp3_loopback_head.log", "cpu032_tp3_loopback_rank2.log",
     _lab_context("127.0.0.1", "127.0.0.1", names=("head", "worker2"), ifname="lo")),
]


@pytest.mark.parametrize("head_log,worker_log,ctx", HEALTHY, ids=[h[0] for h in HEALTHY])
def test_no_entry_matches_healthy_captured_lab_logs(head_log, worker_log, ctx):
    texts = {ctx.nodes[0].name: {B.RANK_LOG: (LOGS / head_log).read_text()},
             ctx.nodes[1].name: {B.RANK_LOG: (LOGS / worker_log).read_text()}}
    assert all(t[B.RANK_LOG].strip() for t in texts.values())
    assert match(Bundle(texts=texts, context=ctx)) == []


def test_the_mgmt_signature_needs_a_failed_rendezvous():
    """The healthy head log with a context whose fabric is elsewhere: an off-fabric address that
    works (BOOTSTRAP_IF on a reachable interface) is not a finding; the same plus a SYN-SENT is."""
    ctx = _lab_context("192.168.100.1", "192.168.100.2")
    texts = {"head": {B.RANK_LOG: (LOGS / "cpu032_tp2_head.log").read_text()}}
    assert "rendezvous-mgmt-address" not in {f.id for f in match(Bundle(texts, ctx))}
    texts["worker"] = {B.SS: (DATA / "mgmt_rendezvous/worker/ss.txt").read_text().replace("10.214.0.11", "169.254.77.1")}
    hit = [f for f in match(Bundle(texts, ctx)) if f.id == "rendezvous-mgmt-address"]
    assert hit and "169.254.77.1" in hit[0].evidence[0]


def test_wedge_is_not_reported_once_tokens_move_again():
    """Real scrapes: stopped engine (metrics_2) then resumed (metrics_resumed, >= 15 s later)."""
    ctx = Context.from_dict(json.loads((DATA / "serving_wedge/context.json").read_text()))
    local = {B.LOCAL_HEALTH: "200\n", B.LOCAL_METRICS_1: (DATA / "serving_wedge/local/metrics_2.txt").read_text(),
             B.LOCAL_METRICS_2: (DATA / "metrics/metrics_resumed.txt").read_text()}
    assert match(Bundle({LOCAL: local}, ctx, {"metrics_interval_s": 15.0})) == []
    # the same frozen pair, but too close together to call it a wedge
    wedge = {k: (DATA / "serving_wedge/local" / k).read_text() for k in (B.LOCAL_HEALTH, B.LOCAL_METRICS_1, B.LOCAL_METRICS_2)}
    assert match(Bundle({LOCAL: wedge}, ctx, {"metrics_interval_s": 5.0})) == []
    assert [f.id for f in match(Bundle({LOCAL: wedge}, ctx, {"metrics_interval_s": 12.06}))] == ["serving-wedge"]


def test_a_signature_that_raises_is_reported_not_fatal():
    def boom(_b):
        raise KeyError("x")
    bad = Entry("boom", "t", "fatal", "s", "d", "c", "f", "p", boom, "src")
    out = match(Bundle({}), entries=(bad, BY_ID["wrong-model-on-port"]))
    assert [f.id for f in out] == ["boom:error"]


def test_catalogue_table_in_docs_is_current():
    tests: dict[str, list[str]] = {}
    for scenario, ids in EXPECTED.items():
        for i in ids:
            tests.setdefault(i, []).append(scenario)
    from runbook.diagnose.accuracy import load_corpus
    corpus: dict[str, int] = {}
    for c in load_corpus():
        if c.expect:
            corpus[c.expect] = corpus.get(c.expect, 0) + 1
    table = catalogue_markdown(ENTRIES, tests=tests, corpus=corpus)
    doc = (ROOT / "docs" / "diagnose.md").read_text()
    assert table in doc, "docs/diagnose.md is out of date: paste runbook.diagnose.catalogue_markdown(...) output"


# --------------------------------------------------------------------------- bundle writer


HF = "hf_PlantedSecretToken0123456789abcd"
API = "sk-planted-api-key-7f3e9a1c"


def test_write_bundle_masks_planted_secrets_and_round_trips(tmp_path):
    src = read_bundle(DATA / "mgmt_rendezvous")
    texts = {n: dict(items) for n, items in src.texts.items()}
    texts["head"][B.RANK_LOG] += f"\nINFO non-default args: {{'api_key': ['{API}']}}\nHF_TOKEN={HF}\n"
    texts["head"][B.ENV] += f"HF_TOKEN={HF}\nVLLM_API_KEY={API}\n"
    texts["head"][B.CMDLINE] = f"python3 -m vllm serve /m --api-key {API} --port 8000\n"
    texts[LOCAL] = {B.LOCAL_LAUNCH_PLAN: f"env HF_TOKEN={HF} vllm serve /m --api-key {API}\n",
                    B.LOCAL_COMMANDS: json.dumps({"node": "head", "command": f"curl -H 'Authorization: Bearer {API}'",
                                                  "stderr_tail": f"token {HF}"}) + "\n"}
    red = Redactor([HF, API])
    archive = write_bundle(tmp_path, texts, red, context=src.context, timings={"since_head_start_s": 120.0})
    assert archive.is_file() and archive.parent == tmp_path / "diagnose"
    md, page = page_paths(archive)
    assert md.is_file() and page.is_file()
    blobs = [md.read_bytes(), page.read_bytes()]
    with tarfile.open(archive, "r:gz") as tar:
        names = tar.getnames()
        blobs += [tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()]
    assert len(names) > 40 and any(n.endswith("head/env.txt") for n in names)
    for secret in (HF, API):
        hits = [b for b in blobs if secret.encode() in b]
        assert not hits, f"planted secret found in {len(hits)} member(s)"
    assert any(b"***" in b for b in blobs)
    # the findings survive masking, and reading the archive back gives the same findings
    back = read_bundle(archive)
    assert back.context == src.context and back.timings == {"since_head_start_s": 120.0}
    ids = [f.id for f in match(back)]
    assert ids == [f.id for f in match(src)] and "rendezvous-mgmt-address" in ids
    assert "rendezvous-mgmt-address" in md.read_text() and "rendezvous-mgmt-address" in page.read_text()


def test_write_bundle_refuses_unsafe_names_before_writing(tmp_path):
    for texts in ({"../etc": {"x.txt": "a"}}, {"head": {"../../x": "a"}}, {"head": {"a/b.txt": "a"}}):
        with pytest.raises(ValueError, match="plain file name"):
            write_bundle(tmp_path, texts, Redactor())
    with pytest.raises(ValueError, match="unknown timing key"):
        write_bundle(tmp_path, {"head": {"a.txt": "x"}}, Redactor(), timings={"bogus": 1.0})
    with pytest.raises(TypeError, match="Redactor"):
        write_bundle(tmp_path, {"head": {"a.txt": "x"}}, None)
    assert not (tmp_path / "diagnose").exists()


def test_write_bundle_with_nothing_matched_says_so(tmp_path):
    archive = write_bundle(tmp_path, {"head": {B.RANK_LOG: (LOGS / "cpu032_tp2_head.log").read_text()}}, Redactor(),
                           context=_lab_context("169.254.77.1", "169.254.77.2"))
    md, _ = page_paths(archive)
    assert "No catalogue entry matched" in md.read_text()


def test_read_bundle_missing_path_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="diagnose-"):
        read_bundle(tmp_path / "nope.tar.gz")


# --------------------------------------------------------------------------- collection contract

_CHANGES_A_NODE = ("rm ", "kill", "docker rm", "docker stop", "reboot", "> /", "tee ", "mv ", "ip link set", "nft add",
                   "iptables -A", "ufw allow", "systemctl")


def test_collect_commands_contract_lab_profile():
    p = load_profile(ROOT / "env" / "lab.env")
    cmds = collect_commands(p)
    assert list(cmds) == [n.name for n in p.nodes]
    for node, items in cmds.items():
        names = [c.name for c in items]
        assert len(names) == len(set(names)), f"{node}: duplicate names"
        for c in items:
            assert isinstance(c.cmd, str) and c.cmd and 0 < c.timeout <= 60, c
            assert not any(bad in c.cmd for bad in _CHANGES_A_NODE), f"{node} {c.name} may change the node: {c.cmd}"
            A.check_name("text", c.name)
        for needed in (B.RANK_LOG, B.ENV, B.SS, B.TCP_MASTER, B.FIREWALL, B.GIDS, B.IBV_DEVINFO, B.MEMINFO, B.DISK,
                       B.DMESG, B.PROCESSES):
            assert needed in names, f"{node}: {needed} not collected"
        peers = [n.name for n in p.nodes if n.name != node]
        assert peers, f"{node}: no peer to ping"
        assert all(f"ping_{peer}.txt" in names and f"ping_mtu_{peer}.txt" in names for peer in peers)
    head_log = next(c for c in cmds["head"] if c.name == B.RANK_LOG).cmd
    assert head_log.startswith("tail -n") and '"$HOME"/' in head_log and "/launch/head.log" in head_log
    tcp = next(c for c in cmds["worker"] if c.name == B.TCP_MASTER).cmd
    assert "/dev/tcp/169.254.77.1/29501" in tcp


def test_collect_commands_docker_runtime_and_state_dirs():
    p = load_profile(ROOT / "env" / "lab.env", {"RUNTIME": "docker"})
    cmds = collect_commands(p)
    log = next(c for c in cmds["worker"] if c.name == B.RANK_LOG).cmd
    assert log.startswith("docker logs --tail") and p.container_worker in log
    p2 = load_profile(ROOT / "env" / "lab.env")
    cmds2 = collect_commands(p2, state_dirs={"head": "/srv/state"})
    assert "/srv/state/head.log" in next(c for c in cmds2["head"] if c.name == B.RANK_LOG).cmd


def test_the_collected_commands_run_here():
    """The shell lines are real bash: run the cheap, host-independent ones on this machine."""
    p = load_profile(ROOT / "env" / "lab.env")
    cmds = {c.name: c for c in collect_commands(p)["head"]}
    for name in (B.MEMINFO, B.OS, B.HOME, B.ENV, B.NCCL_CONF, B.IBDEV2NETDEV, B.IBV_DEVINFO):
        r = subprocess.run(["bash", "-c", cmds[name].cmd], capture_output=True, text=True, timeout=cmds[name].timeout)
        assert r.stdout.strip(), f"{name}: no output ({r.stderr[:200]})"
    # no RDMA here: the GID dump prints nothing and still succeeds
    assert subprocess.run(["bash", "-c", cmds[B.GIDS].cmd], capture_output=True, timeout=20).returncode == 0
    fw = subprocess.run(["bash", "-c", cmds[B.FIREWALL].cmd], capture_output=True, text=True, timeout=20).stdout
    assert {"### nft", "### iptables", "### ufw"} <= set(fw.splitlines())


# --------------------------------------------------------------------------- parsers added to facts


def _run(cmd: str, timeout: int = 15) -> str:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout).stdout


def test_tcp_connect_cmd_open_and_refused_for_real():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        [ok] = sockets.parse_tcp_connect(_run(sockets.tcp_connect_cmd("127.0.0.1", port, timeout_s=3)))
        assert (ok.result, ok.rc, ok.port) == ("open", 0, port)
    finally:
        srv.close()
    [ref] = sockets.parse_tcp_connect(_run(sockets.tcp_connect_cmd("127.0.0.1", port, timeout_s=3)))
    assert ref.result == "refused" and "refused" in ref.detail and not ref.dropped


def test_parse_ss_captured_syn_sent():
    socks = sockets.parse_ss((DATA / "firewall_drop/worker/ss.txt").read_text())
    assert len(socks) == 2
    [s] = sockets.connecting_to(socks, 29601)
    assert (s.local_ip, s.peer_ip, s.peer_port) == ("10.213.0.2", "10.213.0.1", 29601)
    assert s.process.startswith("python(pid ")
    listen = sockets.parse_ss((DATA / "mgmt_rendezvous/head/ss.txt").read_text())
    assert any(x.state == "LISTEN" and x.local_port == 29501 and x.peer_port is None for x in listen)
    [t] = sockets.parse_tcp_connect((DATA / "firewall_drop/worker/tcp_master.txt").read_text())
    assert t.dropped and t.ms >= 5000


def test_parse_firewall_captured_and_ufw():
    fw = firewall.parse_firewall((DATA / "firewall_drop/head/firewall.txt").read_text())
    assert fw.unreadable == ["ufw"]          # no ufw here; nft and iptables were read despite sudo missing
    assert fw.blocking(29601) == ['nft: iifname "enp1s0f0np0" tcp dport 29601 drop']
    assert fw.blocking(29501) == []          # the address-only drop rule does not name the port
    ufw = ("### ufw\nStatus: active\nLogging: on (low)\nDefault: deny (incoming), allow (outgoing), disabled (routed)\n"
           "New profiles: skip\n\nTo                         Action      From\n--                         ------      ----\n"
           "22/tcp                     ALLOW IN    Anywhere\n29500:29510/tcp            ALLOW IN    Anywhere\n")
    f2 = firewall.parse_firewall(ufw)
    assert f2.ufw_active and f2.blocking(29501) == [] and f2.blocking(8000)
    assert firewall.parse_firewall(ufw.replace("29500:29510/tcp", "Anywhere on enp1s0f0np0")).blocking(8000, "enp1s0f0np0") == []


def test_hostlog_kills_dry_run_and_conflicts():
    kills = hostlog.oom_kills((DATA / "oom_killed/head/dmesg.txt").read_text())
    assert [(k.by, k.name, k.dry_run) for k in kills] == [("kernel", "python", False)]
    dry = hostlog.oom_kills((DATA / "oom_killed/head/journal.txt").read_text())
    assert dry and all(k.by == "earlyoom" and k.dry_run for k in dry)
    names = hostlog.hostname_conflicts((DATA / "mdns_storm/head/journal.txt").read_text())
    assert names[-1] == "spark-head-528" and hostlog.conflict_suffix(names[-1]) == 528
    [h] = hostlog.hung_tasks((DATA / "nfs_dstate/worker/dmesg.txt").read_text())
    assert (h.name, h.pid, h.seconds) == ("VLLM::Worker", 4377, 122)


def test_docker_pull_classification_on_captured_output():
    kinds = {k: docker_pull.classify_pull((DATA / f"docker_pull_{k}/head/docker_pull.txt").read_text())
             for k in ("eof", "manifest", "dns")}
    assert {k: (v.kind, v.action) for k, v in kinds.items()} == {
        "eof": ("unexpected-eof", "retry"), "manifest": ("manifest-unknown", "stop"), "dns": ("dns", "fix-dns")}
    assert docker_pull.classify_pull("26.05-py3: Pulling from nvidia/vllm\nDigest: sha256:ab\nStatus: Downloaded") is None


def test_ibv_devinfo_and_ps_and_environ():
    ports = ibv.parse_ibv_devinfo((DATA / "roce_mtu_1024/worker/ibv_devinfo.txt").read_text())
    assert [(p.hca, p.port, p.active, p.active_mtu, p.max_mtu) for p in ports] == [
        ("rocep1s0f0", 1, True, 1024, 4096), ("roceP2p1s0f0", 1, True, 1024, 4096)]
    rows = procs.parse_ps((DATA / "mgmt_rendezvous/head/processes.txt").read_text())
    assert rows and any("VLLM::EngineCore" in r.cmd for r in rows) and not any(r.uninterruptible for r in rows)
    d = procs.parse_ps((DATA / "nfs_dstate/worker/d_threads.txt").read_text())
    assert [(r.tid, r.wchan) for r in d][:2] == [(4377, "folio_wait_bit_common"), (4391, "folio_wait_bit_common")]
    env = procs.parse_environ((DATA / "mgmt_rendezvous/head/env.txt").read_text())
    assert env["VLLM_HOST_IP"] == "10.214.0.11" and env["GLOO_SOCKET_IFNAME"] == "eth0"


# --------------------------------------------------------------------------- branches the scenarios do not reach


def _ids(texts, ctx=None, timings=None):
    return sorted({f.id for f in match(Bundle(texts, ctx or _lab_context("10.213.0.1", "10.213.0.2"), timings or {}))})


PS_HEADER = "  PID   TID STAT WCHAN                            ELAPSED COMMAND\n"


def test_d_state_counts_rank_threads_only():
    kernel = PS_HEADER + "  312   312 D    io_schedule                         5000 jbd2/vda-8\n"
    assert _ids({"worker": {B.D_THREADS: kernel}}) == []
    rank = PS_HEADER + " 4377  4391 D    folio_wait_bit_common                911 VLLM::Worker\n"
    assert _ids({"worker": {B.D_THREADS: rank}}) == ["rank-in-d-state"]


def test_inert_nccl_settings_from_env_and_plan():
    assert _ids({"worker": {B.ENV: "NCCL_NET_GDR_LEVEL=PHB\n"}}) == []
    assert _ids({"worker": {B.ENV: "NCCL_NET_GDR_LEVEL=5\n"}}) == ["inert-nccl-settings"]
    plan = "## rank 1 on worker (headless)\nenv NCCL_TIMEOUT=1800 VLLM_HOST_IP=10.213.0.2 vllm serve /m \\\n    --headless\n"
    assert _ids({LOCAL: {B.LOCAL_LAUNCH_PLAN: plan}}) == ["inert-nccl-settings"]


def test_socket_transport_when_rdma_is_expected():
    log = "spark-worker:1:2 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:192.168.100.2<0>\n"
    ctx = Context.from_dict(json.loads((DATA / "gid_per_nic/context.json").read_text()))
    assert _ids({"worker": {B.RANK_LOG: log}}, ctx) == ["nccl-ib-no-device"]
    lab = _lab_context("10.213.0.1", "10.213.0.2")      # the lab expects no RDMA: sockets are right there
    assert _ids({"worker": {B.RANK_LOG: log}}, lab) == []


def test_kernels_that_differ_between_nodes():
    os_text = (DATA / "kernel_bad/head/os.txt").read_text()
    same = {"head": {B.OS: os_text}, "worker": {B.OS: os_text}}
    ctx = Context.from_dict(json.loads((DATA / "kernel_bad/context.json").read_text()))
    assert _ids(same, ctx) == []
    other = os_text.replace("6.17.0-1032-nvidia", "6.17.0-1040-nvidia")
    [f] = match(Bundle({"head": {B.OS: os_text}, "worker": {B.OS: other}}, ctx))
    assert f.id == "kernel-known-bad" and f.node == "cluster" and "6.17.0-1040-nvidia" in f.evidence[0]


def test_worker_error_lines_are_shown_when_it_died():
    head = (DATA / "worker_never_started/head/rank.log").read_text()
    worker = ("Building wheel for deep_gemm (setup.py): started\n"
              "csrc/python_api.cpp:1:10: fatal error: Python.h: No such file or directory\n"
              "compilation terminated.\n")
    texts = {"head": {B.RANK_LOG: head}, "worker": {B.RANK_LOG: worker, B.PROCESSES: "  PID  PPID STAT WCHAN ELAPSED RSS COMMAND\n"}}
    [f] = [f for f in match(Bundle(texts, _lab_context("10.215.0.1", "10.215.0.2"))) if f.id == "worker-not-running"]
    assert any("Python.h" in e for e in f.evidence)
    texts["worker"][B.PROCESSES] += " 4242     1 Ssl  - 30 1000 python3 -m vllm.entrypoints.cli.main serve /m --headless\n"
    assert "worker-not-running" not in _ids(texts, _lab_context("10.215.0.1", "10.215.0.2"))


def test_ufw_default_deny_without_an_allow_rule():
    ufw = ("### ufw\nStatus: active\nDefault: deny (incoming), allow (outgoing), disabled (routed)\n\n"
           "To                         Action      From\n--                         ------      ----\n"
           "22/tcp                     ALLOW IN    Anywhere\n")
    assert _ids({"head": {B.FIREWALL: ufw}}) == ["firewall-master-port"]
    allowed = ufw + "Anywhere on enp1s0f0np0    ALLOW IN    Anywhere\n"
    assert _ids({"head": {B.FIREWALL: allowed}}) == []


@pytest.mark.parametrize("api_host,url", [("127.0.0.1", "http://127.0.0.1:8000"), ("0.0.0.0", "http://127.0.0.1:8000"),
                                          ("10.0.0.5", "http://10.0.0.5:8000"), ("", "http://127.0.0.1:8000")])
def test_the_api_proof_uses_the_address_the_api_binds(api_host, url):
    """issue 25: the proof curl went to the master (fabric) address, where a loopback-bound API does not answer."""
    ctx = Context.from_dict({**json.loads((DATA / "wrong_model/context.json").read_text()), "api_host": api_host})
    found = [f for f in match(Bundle(read_bundle(DATA / "wrong_model").texts, ctx)) if f.id == "wrong-model-on-port"]
    assert found and found[0].proof.startswith(f"curl -s {url}/v1/models")
    assert "{" not in found[0].proof


def test_context_from_the_lab_profile_carries_the_api_bind_address():
    ctx = Context.from_profile(load_profile(ROOT / "env" / "lab.env"))
    assert ctx.api_host and ctx.api_url.endswith(f":{ctx.port}")


def test_every_lab_test_an_entry_names_exists():
    """An entry's lab injection that names a lab test points at a real test function."""
    named = [(e.id, e.lab.split()[0]) for e in ENTRIES if e.lab.startswith("tests/lab/")]
    assert named
    for eid, ref in named:
        path, _, func = ref.partition("::")
        assert f"def {func}(" in (ROOT / path).read_text(), f"{eid}: {ref} does not exist"
    captured = {e.lab.split()[1] for e in ENTRIES if e.lab.startswith("capture_netns ")}
    assert captured and captured <= set(EXPECTED), captured - set(EXPECTED)
