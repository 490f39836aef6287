"""Benchmark (not a test): step 02's share of a synthetic checkpoint from the head to N-1 workers at once, by each
WEIGHT_TRANSPORT (rsync over real SSH; stream: sendfile/splice over plain TCP), against the fabric's TCP rate
measured the way step 01 measures it (iperf3, one stream, head to worker, JSON). Nodes are network namespaces on a switch of their own (``lab.switchlab``: a Linux bridge, MTU 9000),
each with its own throwaway sshd (private /run and /root, like ``tests/support/sshd.py``), never the embedded lab::

    sudo python -m runbook.bench_share --gib 3 --workers 3 --repeat 3    # ~3 GiB in 3 shards, head + 3 workers

Prints, and writes to ``<dir>/result.json``: iperf3 head->worker alone (step 01's figure) and to every worker at once,
then the share by each transport (``transfer.share_to_workers`` over ``sharing.rsync_to_worker`` /
``sharing.stream_to_worker``: the runbook's own code, verification and parity on each worker included), per worker and
in aggregate, with the ratio of each rate to the TCP rate beside it, the load (``os.getloadavg``) and how the machine's
CPU time split (``/proc/stat``) during each measurement. ``--repeat N`` runs the whole round N times, interleaved (the
machine is shared, its load moves), and prints the medians. Everything it made is removed at the end (``--keep``
keeps the checkpoint for the next run).

A top-level module beside the runner: it drives a step's code (``runbook.weights``) on the lab's switch
(``runbook.lab.switchlab``), and neither the lab (below the steps) nor a step (which never imports the lab) may.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .facts import net as fnet
from .lab import switchlab
from .profile.nodes import NodeSpec
from .remote import CommandLog, Node, SshSettings
from .weights.sharing import RSYNC_SSH, STREAM_STREAMS, rsync_to_worker, stream_to_worker
from .weights.transfer import share_to_workers
from .weights.verify import read_manifest, verify_dir

GIB = 1 << 30
CHUNK = 64 << 20
IPERF_PORT = 5301


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       check=True, capture_output=True)


def make_checkpoint(root: Path, gib: float, files: int) -> dict:
    """``files`` shards of random bytes (incompressible, no holes) summing to ``gib`` GiB plus a config.json, with the
    head's manifest (as step 02's verified download leaves it). Kept and reused when already complete."""
    root.mkdir(parents=True, exist_ok=True)
    size = int(gib * GIB) // files
    names = [f"model-{i:05d}-of-{files:05d}.safetensors" for i in range(1, files + 1)]
    manifest = read_manifest(root)
    if manifest and sorted(f["path"] for f in manifest["files"]) == sorted(["config.json", *names]) and all(
            f["size"] == size for f in manifest["files"] if f["path"] != "config.json"):
        return manifest
    (root / "config.json").write_text(json.dumps({"model_type": "bench", "shards": files}))
    expected = {"revision": "b" * 40, "files": []}
    for name in ["config.json", *names]:
        path, sha = root / name, hashlib.sha256()
        if name != "config.json":
            with open(path, "wb") as fh:
                left = size
                while left:
                    block = os.urandom(min(CHUNK, left))
                    fh.write(block)
                    sha.update(block)
                    left -= len(block)
        else:
            sha.update(path.read_bytes())
        expected["files"].append({"path": name, "size": path.stat().st_size, "sha256": sha.hexdigest()})
    report = verify_dir(root, expected)
    if not report["ok"]:
        raise SystemExit(f"the synthetic checkpoint did not verify: {report['failed']}")
    return read_manifest(root)


class Bench:
    """The switch, one sshd per node, and the runbook's Node objects reaching them."""

    def __init__(self, work: Path, prefix: str, subnet: str, nodes: int):
        self.work, self.nodes = work, nodes
        self.sw = switchlab.Switch(prefix=prefix, subnet=subnet)
        self.procs: list[subprocess.Popen] = []
        self.key = work / "id_ed25519"
        self.known_hosts = work / "known_hosts"
        self.ssh_config = work / "ssh_config"
        self.log = CommandLog(work / "commands.jsonl")

    def name(self, k: int) -> str:
        return "head" if k == 1 else "worker" if k == 2 else f"worker{k - 1}"

    def up(self) -> list[Node]:
        switchlab.down(self.sw)
        switchlab.up(self.sw, self.nodes)
        _keygen(self.key, "bench-share")
        pub = self.key.with_suffix(".pub").read_text()
        (self.work / "authorized_keys").write_text(pub)
        known, config = [], []
        for k in range(1, self.nodes + 1):
            d = self.work / f"n{k}"
            home = d / "home"
            (home / ".ssh").mkdir(parents=True, exist_ok=True)
            os.chmod(home, 0o700)
            hk = d / "ssh_host_ed25519_key"
            _keygen(hk, f"bench-share-n{k}")
            known.append(f"{self.sw.node_ip(k)} {' '.join(hk.with_suffix('.pub').read_text().split()[:2])}")
            (d / "sshd_config").write_text("\n".join([
                f"ListenAddress {self.sw.node_ip(k)}", "Port 22", f"HostKey {hk}", f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.work / 'authorized_keys'}", "PubkeyAuthentication yes",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
                "UsePAM no", "StrictModes no", "UseDNS no", "PrintMotd no", "MaxSessions 64",
                "Subsystem sftp internal-sftp", ""]))
            config += [f"Host {self.sw.prefix}-{self.name(k)}", f"  HostName {self.sw.node_ip(k)}", "  User root",
                       f"  IdentityFile {self.key}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {self.known_hosts}",
                       "  StrictHostKeyChecking yes", "  BatchMode yes"]
        self.known_hosts.write_text("\n".join(known) + "\n")
        self.ssh_config.write_text("\n".join(config) + "\n")
        for k in range(1, self.nodes + 1):
            home = self.work / f"n{k}" / "home"
            shutil.copy(self.key, home / ".ssh" / "id_ed25519")     # the head's rsync logs in to the workers
            shutil.copy(self.known_hosts, home / ".ssh" / "known_hosts")
            script = ('mount --make-rprivate / && mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd '
                      '&& mount --bind "$2" /root && exec /usr/sbin/sshd -D -e -f "$1"')
            log = open(self.work / f"n{k}" / "sshd.log", "ab")
            self.procs.append(subprocess.Popen(
                switchlab.node_argv(self.sw, k, ["unshare", "--mount", "--pid", "--fork", "--kill-child",
                                                 "--mount-proc", "sh", "-c", script, "sh",
                                                 str(self.work / f"n{k}" / "sshd_config"), str(home)]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True))
            log.close()
        for k in range(1, self.nodes + 1):
            self._wait_ssh(k)
        settings = SshSettings(ssh_config=self.ssh_config, key_file=self.key, known_hosts=self.known_hosts)
        return [Node(NodeSpec(self.name(k), k - 1, f"{self.sw.prefix}-{self.name(k)}", self.sw.node_ip(k),
                              switchlab.NODE_PORT), settings, log=self.log) for k in range(1, self.nodes + 1)]

    def _wait_ssh(self, k: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.sw.node_ip(k), 22), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-2.0-"):
                        return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"sshd of node {k} did not answer on {self.sw.node_ip(k)}:22 in {timeout:.0f} s: "
                         f"{(self.work / f'n{k}' / 'sshd.log').read_text()[-1000:]}")

    def sshd_pids(self) -> list[int]:
        """Each node's sshd (the child ``unshare`` forked): every session's CPU time, the transfer's rsync and ssh at
        both ends and the workers' verifier, is added to its children's times once the session is reaped."""
        pids = []
        for proc in self.procs:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            pids += [int(c) for c in children]
        return pids

    def sessions_cpu_s(self) -> float:
        """CPU seconds the nodes' finished sessions used (user + system, every node)."""
        tick, total = os.sysconf("SC_CLK_TCK"), 0
        for pid in self.sshd_pids():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[13]) + int(fields[14])        # cutime, cstime (stat fields 16, 17)
        return total / tick

    def down(self) -> None:
        switchlab.down(self.sw)          # kills every process in our namespaces (the sshds and their sessions)
        for proc in self.procs:
            proc.wait(timeout=10)


def iperf3(head: Node, workers: list[Node], seconds: int) -> dict[str, float]:
    """Gb/s head -> each worker, all started together (one worker: step 01's own measurement), as step 01 runs it:
    a one-shot server on the worker's fabric address, a one-stream client bound to the head's."""
    out: dict[str, float] = {}
    servers = []
    for i, w in enumerate(workers):
        t = threading.Thread(target=w.run, args=(fnet.iperf3_server_cmd(w.spec.fabric_ip, IPERF_PORT + i,
                                                                        timeout_s=seconds + 25),),
                             kwargs={"timeout": seconds + 40, "warn": True})
        t.start()
        servers.append(t)

    def client(i: int, w: Node) -> None:
        res = head.read(fnet.iperf3_client_cmd(w.spec.fabric_ip, IPERF_PORT + i, bind_ip=head.spec.fabric_ip,
                                               seconds=seconds), timeout=seconds + 40)
        got = fnet.parse_iperf3(res.stdout)
        out[w.name] = (got.receiver_bps or 0) / 1e9

    clients = [threading.Thread(target=client, args=(i, w)) for i, w in enumerate(workers)]
    for t in clients:
        t.start()
    for t in clients + servers:
        t.join()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=3.0, help="checkpoint size (GiB)")
    p.add_argument("--files", type=int, default=3, help="shards it is split into")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--dir", default="/tmp/bench-share", help="checkpoint, node homes and copies (on disk)")
    p.add_argument("--dest", default="", help="where the workers' copies go (default: --dir); e.g. a tmpfs, to "
                                             "take this machine's disk out of the measurement")
    p.add_argument("--prefix", default="wn")
    p.add_argument("--subnet", default="10.81.0")
    p.add_argument("--seconds", type=int, default=5, help="iperf3 duration")
    p.add_argument("--transport", default="rsync,stream", help="WEIGHT_TRANSPORTs to measure, comma-separated")
    p.add_argument("--streams", type=int, default=STREAM_STREAMS, help="TCP streams per worker (stream)")
    p.add_argument("--repeat", type=int, default=1, help="rounds (iperf3, then each transport), medians printed")
    p.add_argument("--sequential", action="store_true", help="also share one worker after the other")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint for the next run")
    p.add_argument("--cipher", default="", help="the ssh cipher(s) rsync's ssh asks for (default: step 02's, "
                                               "sharing.RSYNC_SSH), e.g. chacha20-poly1305@openssh.com")
    args = p.parse_args(argv)
    transports = [t for t in args.transport.split(",") if t]
    bad = [t for t in transports if t not in ("rsync", "stream")]
    if bad:
        p.error(f"--transport: {', '.join(bad)} is not rsync or stream")
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    src = work / "head-weights"
    print(f"checkpoint: {args.gib:g} GiB in {args.files} shards at {src}", flush=True)
    manifest = make_checkpoint(src, args.gib, args.files)
    bench = Bench(work, args.prefix, args.subnet, args.workers + 1)
    result: dict = {"gib": args.gib, "files": args.files, "workers": args.workers, "cpus": os.cpu_count(),
                    "streams": args.streams, "load_before": os.getloadavg(), "rounds": []}
    try:
        head, *workers = bench.up()
        dest = Path(args.dest) if args.dest else work
        dest.mkdir(parents=True, exist_ok=True)
        result["dest"] = str(dest)
        dst = str(dest / "worker-weights-{}")     # each worker's own directory on the shared disk (or --dest)
        for k in range(args.repeat):
            one: dict = {"round": k + 1}
            alone, one["iperf3_alone_cpu"] = {}, []
            for w in workers:
                load, c0 = os.getloadavg()[0], _cpu_fields()
                alone[w.name] = round(iperf3(head, [w], args.seconds)[w.name], 3)
                one["iperf3_alone_cpu"].append({"load1": round(load, 2), **_cpu_split(c0, _cpu_fields())})
            one["iperf3_alone_gbit_s"] = alone
            load, c0 = os.getloadavg()[0], _cpu_fields()
            together = iperf3(head, workers, args.seconds)
            one["iperf3_together_cpu"] = {"load1": round(load, 2), **_cpu_split(c0, _cpu_fields())}
            one["iperf3_together_gbit_s"] = {k: round(v, 3) for k, v in together.items()}
            one["iperf3_together_sum_gbit_s"] = round(sum(together.values()), 3)
            one["share"] = []
            for transport in transports:
                for parallel in ([True, False] if args.sequential else [True]):
                    one["share"].append(_share_each(bench, head, workers, str(src), dst, manifest, parallel=parallel,
                                                    cipher=args.cipher, transport=transport, streams=args.streams))
            result["rounds"].append(one)
            _print(result, one)
        result["load_after"] = os.getloadavg()
    finally:
        bench.down()
        for k in range(2, args.workers + 2):
            shutil.rmtree(Path(args.dest or work) / f"worker-weights-{k - 1}", ignore_errors=True)
        if not args.keep:
            shutil.rmtree(src, ignore_errors=True)
    result["medians"] = _medians(result)
    _print_medians(result)
    (work / "result.json").write_text(json.dumps(result, indent=1))
    return 0 if all(r["ok"] for one in result["rounds"] for s in one["share"] for r in s["workers"].values()) else 1


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _cpu_fields() -> list[int]:
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]


def _cpu_split(before: list[int], after: list[int]) -> dict[str, float]:
    """The machine's CPU time between two /proc/stat reads, as shares (``nice``: niced processes, e.g. another
    session's tests; ``system`` + ``softirq``: the kernel, the TCP stack's work among it)."""
    d = [b - a for a, b in zip(before, after)]
    total = sum(d) or 1
    return {name: round(v / total, 3) for name, v in zip(CPU_FIELDS, d)}


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU of this machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]                      # idle + iowait
    return sum(fields) - idle, sum(fields)


def _share_each(bench, head, workers, src, dst_pattern, manifest, *, parallel, cipher="", transport="rsync",
                streams=STREAM_STREAMS):
    """``share`` with each worker's own destination (the nodes share this machine's disk)."""
    dsts = {w.name: dst_pattern.format(w.spec.rank) for w in workers}
    for w in workers:
        w.run(f"rm -rf {dsts[w.name]}", timeout=120)
    head.close()                           # a fresh session per node: the CPU of this share is reaped when it ends
    for w in workers:
        w.close()
    subprocess.run(["sync"], check=False)  # the last round's copies on disk: no writeback from them meanwhile
    time.sleep(1)                          # sshd reaps the closed sessions (the iperf3 runs', the rm's)
    load, fields0 = os.getloadavg()[0], _cpu_fields()
    t0, (busy0, total0), cpu0 = time.monotonic(), _cpu_times(), bench.sessions_cpu_s()
    ssh = f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -c {cipher}" if cipher else RSYNC_SSH
    if transport == "stream":
        results = share_to_workers(workers, lambda w: stream_to_worker(head, w, src, dsts[w.name],
                                                                       head_manifest=manifest, streams=streams),
                                   parallel=parallel)
    else:
        results = share_to_workers(workers, lambda w: rsync_to_worker(head, w, src, dsts[w.name],
                                                                      head_manifest=manifest, ssh=ssh),
                                   parallel=parallel)
    wall, (busy1, total1), fields1 = time.monotonic() - t0, _cpu_times(), _cpu_fields()
    head.close()
    for w in workers:
        w.close()
    time.sleep(1)                          # sshd reaps the closed sessions
    cpu = bench.sessions_cpu_s() - cpu0
    total = sum(f["size"] for f in manifest["files"])
    rows = {}
    for name, r in results.items():
        failed = [c for c in r.checks if c.failed]
        # the copy's own time: rsync's command; the stream's sender (its last range acknowledged, not the setup)
        secs = r.data.get("send_seconds") if transport == "stream" else r.data.get("seconds")
        rows[name] = {"ok": not failed, "rsync_s": secs, "verify_s": (r.data.get("verify") or {}).get("seconds"),
                      "gbit_s": round(total * 8 / secs / 1e9, 3) if secs else None,
                      "failed": [f"{c.name}: {c.observed}" for c in failed]}
    span = (max if parallel else sum)(r["rsync_s"] or 0 for r in rows.values())
    return {"transport": transport, "streams": streams if transport == "stream" else 1, "load1": round(load, 2),
            "cpu_split": _cpu_split(fields0, fields1),
            "parallel": parallel, "cipher": (cipher or "step 02's (sharing.RSYNC_SSH)") if transport == "rsync" else "",
            "bytes_per_worker": total, "wall_s_incl_verify": round(wall, 2), "workers": rows,
            "rsync_span_s": round(span, 2), "cpu_busy": round((busy1 - busy0) / max(total1 - total0, 1), 3),
            "nodes_cpu_s": round(cpu, 1), "cpu_s_per_gib": round(cpu / (total * len(workers) / GIB), 2),
            "aggregate_gbit_s": round(total * len(workers) * 8 / span / 1e9, 3) if span else None}


def _cpu_text(c: dict) -> str:
    return (f"load {c['load1']:.1f}, CPU: kernel {c['system'] + c['softirq'] + c['irq']:.0%} (softirq "
            f"{c['softirq']:.0%}), user {c['user']:.0%}, niced {c['nice']:.0%}, idle {c['idle'] + c['iowait']:.0%}")


def _print(r: dict, one: dict) -> None:
    alone, together = one["iperf3_alone_gbit_s"], one["iperf3_together_gbit_s"]
    one_stream = sum(alone.values()) / len(alone)
    print(f"\nround {one['round']}: {r['gib']:g} GiB ({r['files']} shards) to {r['workers']} workers (copies in "
          f"{r['dest']}); {r['cpus']} CPUs")
    print("iperf3 head->worker (step 01: one stream, alone): " + ", ".join(f"{k} {v:.2f}" for k, v in alone.items())
          + f" Gb/s (mean {one_stream:.2f}); " + _cpu_text(one["iperf3_alone_cpu"][0]))
    print("iperf3 to all workers at once: " + ", ".join(f"{k} {v:.2f}" for k, v in together.items())
          + f" Gb/s, sum {one['iperf3_together_sum_gbit_s']:.2f}; " + _cpu_text(one["iperf3_together_cpu"]))
    for s in one["share"]:
        mode = ("in parallel" if s["parallel"] else "one after the other")
        how = f"stream, {s['streams']} TCP streams per worker" if s["transport"] == "stream" else \
            f"rsync over ssh, cipher {s['cipher']}"
        agg = s["aggregate_gbit_s"] or 0.0
        print(f"share {how}, {mode}: span {s['rsync_span_s']:.1f} s, aggregate {agg:.2f} Gb/s "
              f"(ratio {agg / one_stream:.2f} of step 01's iperf3 one stream, "
              f"{agg / one['iperf3_together_sum_gbit_s']:.2f} of iperf3 to all at once); "
              f"wall incl. verification {s['wall_s_incl_verify']:.1f} s; " + _cpu_text({**s["cpu_split"],
                                                                                       "load1": s["load1"]})
              + f"; the nodes' sessions used {s['nodes_cpu_s']:.1f} CPU-s, {s['cpu_s_per_gib']:.2f} CPU-s per GiB "
              "delivered (incl. the verifier)")
        for name, w in s["workers"].items():
            base = together[name] if s["parallel"] else alone[name]
            print(f"  {name}: {w['rsync_s']} s = {w['gbit_s']} Gb/s (ratio {(w['gbit_s'] or 0) / base:.2f} of "
                  f"iperf3 {base:.2f}), verify {w['verify_s']} s, {'ok' if w['ok'] else 'FAILED: ' + '; '.join(w['failed'])}")
    sys.stdout.flush()


def _medians(r: dict) -> dict:
    """Per transport (in parallel): the median over the rounds of the aggregate and of its ratio to that round's
    iperf3 (one stream alone: step 01's figure; all workers at once), beside iperf3's own medians."""
    rounds = r["rounds"]
    if not rounds:
        return {}
    one_stream = [sum(o["iperf3_alone_gbit_s"].values()) / len(o["iperf3_alone_gbit_s"]) for o in rounds]
    out = {"iperf3_one_stream_gbit_s": round(statistics.median(one_stream), 3),
           "iperf3_together_sum_gbit_s": round(statistics.median(o["iperf3_together_sum_gbit_s"] for o in rounds), 3),
           "rounds": len(rounds), "transports": {}}
    for transport in dict.fromkeys(s["transport"] for o in rounds for s in o["share"]):
        agg, ratio1, ratio_all, cpu = [], [], [], []
        for o, base in zip(rounds, one_stream):
            for s in o["share"]:
                if s["transport"] == transport and s["parallel"] and s["aggregate_gbit_s"]:
                    agg.append(s["aggregate_gbit_s"])
                    ratio1.append(s["aggregate_gbit_s"] / base)
                    ratio_all.append(s["aggregate_gbit_s"] / o["iperf3_together_sum_gbit_s"])
                    cpu.append(s["cpu_s_per_gib"])
        if agg:
            out["transports"][transport] = {
                "aggregate_gbit_s": round(statistics.median(agg), 3), "all": agg,
                "ratio_one_stream": round(statistics.median(ratio1), 3),
                "ratio_together": round(statistics.median(ratio_all), 3),
                "cpu_s_per_gib": round(statistics.median(cpu), 2)}
    return out


def _print_medians(r: dict) -> None:
    m = r.get("medians") or {}
    if not m:
        return
    print(f"\nmedians over {m['rounds']} round(s): iperf3 one stream alone (step 01) "
          f"{m['iperf3_one_stream_gbit_s']:.2f}"
          f" Gb/s, to all {r['workers']} workers at once {m['iperf3_together_sum_gbit_s']:.2f} Gb/s")
    for t, v in m["transports"].items():
        print(f"  {t}: aggregate {v['aggregate_gbit_s']:.2f} Gb/s (runs {', '.join(f'{a:.2f}' for a in v['all'])}); "
              f"ratio {v['ratio_one_stream']:.2f} of iperf3 one stream, {v['ratio_together']:.2f} of iperf3 at once; "
              f"{v['cpu_s_per_gib']:.2f} CPU-s per GiB")


if __name__ == "__main__":
    sys.exit(main())
