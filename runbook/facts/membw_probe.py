#!/usr/bin/env python3
"""Standalone memory-bandwidth probe of one rank: decode-shaped reads on the GPU, memcpy on the CPU (stdlib; torch or numpy when present).

Run on a node with the python that serves (``python - ARGS <<'EOF' … EOF``, nothing copied)::

    python membw_probe.py [--device auto|gpu|cpu] [--bytes N] [--iters 20] [--json]

* GPU (torch with CUDA): a bf16 matrix of ``--bytes`` (default 1 GiB, at least 8 x the L2 cache) read
  once per iteration by a matrix-vector product (GEMV, the shape of a decode step's weight reads),
  a plain reduction over the same buffer, and a device-to-device copy (read + write bytes). Each
  iteration is timed with CUDA events after warm-up. The headline ``gbs`` is the GEMV median: what a
  decode step can read. A GB10 in its hidden slow state reads ~70 instead of ~230 GB/s
  (field-reports-2026-12.md); nvidia-smi shows nothing.
* CPU (the lab, or a node without torch): ``memoryview`` copies of a buffer of ``--bytes`` (default
  128 MiB, far above any L3), counted as read + write bytes (STREAM "copy"); numpy's ``copyto`` too
  when numpy is importable (reported beside it; the headline is always the memcpy, so two ranks
  compare like for like). Labelled "CPU memory bandwidth (lab)": it says what this host's memory
  does, not what a Spark does.

Prints ONE JSON line on stdout::

    {"tool": "membw_probe", "device": "gpu", "name": "…", "label": "…", "gbs": 231.4,
     "method": "gemv", "bytes": …, "iters": 20, "results": {"gemv": {"median_gbs": …, "best_gbs": …,
     "bytes_per_iter": …}, …}}

or ``{"tool": "membw_probe", "error": "…"}`` with exit 1. GB/s = 10^9 bytes per second.
"""
import argparse
import json
import statistics
import sys
import time

GIB = 1 << 30
MIB = 1 << 20
CPU_LABEL = "CPU memory bandwidth (lab): memcpy, read + write bytes"
GPU_LABEL = "GPU memory bandwidth: decode-shaped GEMV reads (bf16 matrix x vector)"


def _summary(times_s, bytes_per_iter):
    rates = [bytes_per_iter / t / 1e9 for t in times_s if t > 0]
    return {"median_gbs": round(statistics.median(rates), 2), "best_gbs": round(max(rates), 2),
            "worst_gbs": round(min(rates), 2), "bytes_per_iter": bytes_per_iter, "iters": len(rates)}


def gpu_probe(nbytes, iters):
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA device")
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    nbytes = max(int(nbytes or GIB), 8 * l2, 64 * MIB)
    free, _total = torch.cuda.mem_get_info(dev)
    if 2 * nbytes + 64 * MIB > free:        # the copy needs two buffers; never push a serving rank out of memory
        nbytes = max(64 * MIB, (free - 64 * MIB) // 4)
    cols = 4096                               # a decode step's GEMV: hidden-sized vector, many weight rows
    rows = max(1, nbytes // (2 * cols))
    w = torch.empty((rows, cols), dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    x = torch.empty((cols,), dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    read_bytes = w.numel() * w.element_size()

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize(dev)
        out = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1000.0)
        return out

    results = {"gemv": _summary(timed(lambda: torch.mv(w, x)), read_bytes),
               "sum": _summary(timed(lambda: w.sum(dtype=torch.float32)), read_bytes)}
    flat = w.view(-1)
    dst = torch.empty_like(flat)
    results["copy"] = _summary(timed(lambda: dst.copy_(flat)), 2 * read_bytes)
    del dst, w, x
    torch.cuda.empty_cache()
    return {"device": "gpu", "name": torch.cuda.get_device_name(dev), "label": GPU_LABEL, "method": "gemv",
            "gbs": results["gemv"]["median_gbs"], "bytes": read_bytes, "l2_bytes": l2, "iters": iters,
            "results": results, "torch": torch.__version__,
            "cuda": getattr(torch.version, "cuda", None)}


def cpu_probe(nbytes, iters):
    nbytes = max(int(nbytes or 128 * MIB), 16 * MIB)
    src = bytearray(b"\x5a") * nbytes        # touched pages: the copy measures memory, not page faults
    dst = bytearray(nbytes)
    s, d = memoryview(src), memoryview(dst)

    def timed(fn):
        fn()
        out = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    def copy():
        d[:] = s

    results = {"memcpy": _summary(timed(copy), 2 * nbytes)}
    if dst[nbytes - 1] != 0x5A:
        raise RuntimeError("memcpy check failed")
    try:
        import numpy as np
        a = np.frombuffer(src, dtype=np.uint8)
        b = np.frombuffer(dst, dtype=np.uint8)
        results["numpy_copyto"] = _summary(timed(lambda: np.copyto(b, a)), 2 * nbytes)
    except ImportError:
        pass
    best = "memcpy"      # the same method on every rank, whichever python has numpy
    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"device": "cpu", "name": name or "cpu", "label": CPU_LABEL, "method": best,
            "gbs": results[best]["median_gbs"], "bytes": nbytes, "iters": iters, "results": results}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument("--bytes", type=int, default=0, help="buffer size (GPU default 1 GiB, CPU 128 MiB)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print only the JSON line (the default prints it too)")
    args = ap.parse_args(argv)
    if args.bytes < 0 or args.bytes > 64 * GIB or not 1 <= args.iters <= 1000:
        print(json.dumps({"tool": "membw_probe", "error": "--bytes must be 0..64 GiB and --iters 1..1000"}))
        return 1
    out = {"tool": "membw_probe"}
    try:
        device = args.device
        if device == "auto":
            try:
                import torch
                device = "gpu" if torch.cuda.is_available() else "cpu"
            except ImportError:
                device = "cpu"
        out.update(gpu_probe(args.bytes, args.iters) if device == "gpu" else cpu_probe(args.bytes, args.iters))
    except Exception as exc:  # noqa: BLE001 - one JSON line whatever failed
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out))
        return 1
    if not args.json:
        print(f"{out['label']}: {out['gbs']:.1f} GB/s ({out['name']})", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
