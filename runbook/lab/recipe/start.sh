#!/bin/sh
# The lab recipe's start chain: what a recipe's in-container entrypoint does, small enough to read.
#
#   sh start.sh <vllm command ...> serve <model> [flags]
#
# It is the container entrypoint (docker runtime: this checkout is mounted at /opt/lab-recipe) or the
# node command (process runtime: run from the checkout on the node). In order:
#   1. patch target: the installed vLLM must define the function the overlay patches
#      (vllm.entrypoints.launchers.app.build_app); missing -> FATAL, exit 1, vLLM never starts
#   2. overlay: overlay/ goes first on PYTHONPATH; its sitecustomize.py arms the patch in every Python
#      process of this rank (boot-log line "overlay active"); the API server's app then answers with
#      the header X-Spark-Runbook-Recipe (boot-log line "patched ...build_app")
#   3. exec the argv unchanged: same pid, so the runbook's pid file and stop logic see vLLM itself
# Before the exec, with DSV41_SOURCE set (ENGRAM=1), overlay/engram_standin.py attaches this rank's packed Engram
# files the way recipe A's row store does and prints its boot-log lines (the lab's vLLM serves no Engram); a
# packed file it cannot read aborts the rank there, as recipe A's does.
# Every failure prints one "[lab-recipe] FATAL: ..." line and exits non-zero before vLLM starts.
set -u
say() { echo "[lab-recipe] $*"; }
fatal() { echo "[lab-recipe] FATAL: $*" >&2; exit 1; }

here=$(cd "$(dirname "$0")" 2>/dev/null && pwd) || fatal "cannot resolve the recipe directory of $0"
overlay="$here/overlay"
[ "$#" -ge 2 ] || fatal "no vLLM argv given (usage: start.sh <vllm command ...> serve <model> [flags])"

# the interpreter that runs vLLM: the argv's first word when it is a Python, else python3 on PATH
case "$(basename "$1")" in
    python*) py="$1" ;;
    *) py=$(command -v python3) || fatal "python3 not found: cannot locate the installed vLLM" ;;
esac

# step 1/2: the patch target exists in the installed vLLM (located without importing it)
for f in spark_lab_patch.py sitecustomize.py engram_standin.py; do
    [ -f "$overlay/$f" ] || fatal "missing $overlay/$f (the recipe checkout is incomplete)"
done
"$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import spark_lab_patch; sys.exit(spark_lab_patch.check_target())' \
    "$overlay" || fatal "step 1/2 patch target: not found in the vLLM of $py (line above); refusing to start"
say "applied step 1/2: patch target present"

# step 2/2: the overlay, ahead of everything else on the Python path of every process of this rank
export PYTHONPATH="$overlay${PYTHONPATH:+:$PYTHONPATH}"
say "applied step 2/2: overlay $overlay first on PYTHONPATH"

if [ -n "${DSV41_SOURCE:-}" ]; then
    "$py" "$overlay/engram_standin.py" "$@" || fatal "Engram: the packed file could not be read (line above)"
fi

say "start chain complete: 2 steps applied (pid $$)"
say "exec: $*"
exec "$@"
