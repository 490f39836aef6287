#!/usr/bin/env python3
"""Standalone torch.distributed all-reduce bus-bandwidth sweep (stdlib + torch only).

Run on every node at once (same arguments except ``--rank``) with a python that has torch::

    python allreduce_sweep.py --rank 0 --world-size 2 --master-addr 169.254.77.1 \
        --master-port 29531 --iface enp1s0f0np0 [--backend gloo] [--min-bytes 1024] \
        [--max-bytes 16777216] [--iters 20] [--timeout 60]

The runbook feeds it through stdin (``python - ARGS <<'EOF' … EOF``) so nothing is copied to the
node. Message sizes are bounded to 1 KiB … 16 MiB (hard cap 64 MiB). Each size does a warm-up,
then ``iters`` timed all-reduces of float32 ones; the result is verified (every element equals
``world_size``). Prints ONE JSON line on stdout::

    {"tool": "allreduce_sweep", "backend": "gloo", "rank": 0, "world_size": 2, "iface": "…",
     "correct": true, "torch": "…", "results": [{"bytes": 1024, "iters": 20, "time_us": …,
     "algbw_gbs": …, "busbw_gbs": …}, …]}

or ``{"tool": "allreduce_sweep", "error": "…"}`` (exit 1). ``busbw = algbw * 2 (n-1) / n``.
"""
import argparse
import datetime
import json
import os
import sys
import time

HARD_CAP = 64 << 20


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, default=29531)
    ap.add_argument("--iface", default="")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=16 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args(argv)
    head = {"tool": "allreduce_sweep", "backend": a.backend, "rank": a.rank,
            "world_size": a.world_size, "iface": a.iface}
    try:
        if a.iface:
            os.environ["GLOO_SOCKET_IFNAME"] = a.iface
            os.environ["NCCL_SOCKET_IFNAME"] = a.iface
            os.environ["TP_SOCKET_IFNAME"] = a.iface
        import torch
        import torch.distributed as dist
        head["torch"] = torch.__version__
        torch.set_num_threads(1)
        dist.init_process_group(a.backend, init_method=f"tcp://{a.master_addr}:{a.master_port}",
                                rank=a.rank, world_size=a.world_size,
                                timeout=datetime.timedelta(seconds=a.timeout))
        max_bytes = min(max(a.max_bytes, a.min_bytes), HARD_CAP)
        sizes, size = [], max(4, a.min_bytes)
        while size <= max_bytes:
            sizes.append(size)
            size *= max(2, a.factor)
        if sizes[-1] != max_bytes:
            sizes.append(max_bytes)
        results, correct, n = [], True, a.world_size
        for nbytes in sizes:
            numel = max(1, nbytes // 4)
            buf = torch.ones(numel, dtype=torch.float32)
            for _ in range(a.warmup):
                buf.fill_(1.0)
                dist.all_reduce(buf)
            correct = correct and bool(torch.all(buf == float(n)))
            iters = a.iters if nbytes <= (1 << 20) else max(3, a.iters // 4)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            dt = (time.perf_counter() - t0) / iters
            algbw = numel * 4 / dt / 1e9
            results.append({"bytes": numel * 4, "iters": iters, "time_us": round(dt * 1e6, 3),
                            "algbw_gbs": round(algbw, 6), "busbw_gbs": round(algbw * 2 * (n - 1) / n, 6)})
        dist.barrier()
        dist.destroy_process_group()
        head.update(correct=correct, results=results)
        print(json.dumps(head), flush=True)
        return 0
    except Exception as exc:  # noqa: BLE001 - the runbook parses this line; the traceback goes to stderr
        import traceback
        traceback.print_exc(file=sys.stderr)
        head["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(head), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
