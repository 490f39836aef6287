"""A server that runs but is slow or silently wrong: a hidden GB10 slow state, Engram rows read at the wrong
rank offset, Engram rows served over NFS. None leaves an error line; they are recognised from a
reporter's words offline and proved by a measurement on the node."""
from __future__ import annotations

from .entry import DEGRADED, FATAL, Entry


GB10_SLOW_STATE = Entry(
    "gb10-slow-state", "A GB10 GPU is in its hidden slow state", DEGRADED,
    symptom="decode is ~1.5x slower (e.g. 94 instead of 63 ms per step, GEMV at ~70 instead of ~230 GB/s) while "
            "`nvidia-smi` shows normal clocks and no throttle reason",
    detect="offline only: the reporter's words (no log line shows it); on the node a GEMV bandwidth probe per rank",
    cause="the GB10 GPU latches into a slow performance state that no tool reports; in TP every rank waits for "
          "the slowest",
    fix="probe decode-shaped bandwidth on every rank before a bench and mark the bench invalid when a rank is "
        "below 80 % of the other; clear it by unplugging power for 30-60 s (a reboot does not), update BIOS and "
        "driver",
    proof="python3 -c 'a GEMV bandwidth probe on the GPU'   # the runbook's bandwidth probe per rank",
    signature=None,
    source="tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark#1 (2026-09-10); field-reports-2026-12 §0 #5, §2 #7",
    words=(r"slow (hidden )?state|hidden (slow )?state|clock latch|latch\w*|fast (and|vs\.?|or) (a )?slow state",
           r"ms/step|ms per step|\bgemv\b|\d+ ?gb/s|bandwidth|tok/s|decode",
           r"nvidia-smi (shows|reports|says) nothing|nothing in nvidia-smi|no throttle|clocks? (look|are|stay\w*) (normal|fine|the same)|unplug\w*|pull(ing)? the power|power[- ]cycl\w*",
           r"gb10|spark"),
    lab="none: the lab has no GPU (the CPU probe says so)")


ENGRAM_RANK_OFFSET = Entry(
    "engram-rank-offset", "Engram rows read at rank 0's offset on every rank", FATAL,
    symptom="TP>1 serves, but answers are worse than TP1 and nothing is logged; ranks 1-3 read rank 0's rows",
    detect="offline only: the reporter's words; on the node, compare each rank's rows against the source at its "
           "offset",
    cause="the disk reader of the Engram tables ignored each rank's row offset, so every rank reads rank 0's "
          "slice, silently",
    fix="use a reader that applies the rank's row offset, and verify rows per rank against the source tables "
        "before serving",
    proof="compare a sample of each rank's Engram rows with the source tables at that rank's offset",
    signature=None,
    source="tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark README fix 3 (docs/boot3-wedge-and-engram-offset.md)",
    words=(r"engram",
           r"(rank|row)[ -]?offset|rank 0'?s rows|wrong rows|same rows|ignor\w* .{0,30}offset",
           r"rank ?[1-3]\b|other ranks|ranks 1|every rank|silent\w*"),
    lab="none yet: the engram step's row check on the lab (tests/lab/test_engram_lab.py) covers the layout, not this reader")


ENGRAM_ROWS_OVER_NFS = Entry(
    "engram-rows-over-nfs", "Engram rows served over NFS slow every decode step", DEGRADED,
    symptom="decode steps cost 2-3x more (5.9-7.8 ms of Engram reads per step against 2.8 ms local)",
    detect="offline only: the reporter's words; on the node, `findmnt` under the Engram rows shows nfs",
    cause="the Engram n-gram rows are read on demand per decode step, and each read crosses the network to the "
          "NFS server",
    fix="copy each rank's rows to node-local NVMe (a sparse copy of that rank's slice) and point the rank at it",
    proof="findmnt -T <engram rows dir> -o TARGET,SOURCE,FSTYPE",
    signature=None,
    source="tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark README (boot 9 -> 10, node-local Engram rows); "
           "field-reports-2026-12 §2 #9",
    words=(r"engram",
           r"\bnfs\b|network (share|storage|mount|filesystem)|shared (storage|mount)",
           r"slow\w*|ms/step|per (decode )?step|\d+(\.\d+)? ?ms\b|[23] ?x\b|latency|node-local|local nvme"),
    lab="none yet: an NFS export in the lab would produce it")
