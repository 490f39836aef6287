"""``python -m runbook``: parses flags, calls one library function, maps errors to exit codes."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .errors import RunbookError

DEFAULT_PROFILE = "env/lab.env"


def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise RunbookError(f"override {pair!r} is not KEY=VALUE", fix="write -p MAX_MODEL_LEN=4096")
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def _lab_dir(args) -> Path:
    from .lab import netlab
    return Path(args.lab_dir) if getattr(args, "lab_dir", None) else netlab.default_lab_dir()


def cmd_run(args) -> int:
    from . import runner
    from .lab.control import ensure_lab
    only = [s for s in (args.only or "").split(",") if s]
    run_dir, outcomes = runner.run(args.profile, start=args.start or "", stop=args.stop or "", only=only,
                                   resume=args.resume or "", dry_run=args.dry_run,
                                   overrides=_overrides(args.param), step_timeout=args.step_timeout,
                                   lab_up=None if args.no_lab else ensure_lab)
    failed = [o for o in outcomes if o.status != "passed"]
    print(f"\nrun {run_dir.run_id}: " + ", ".join(f"{o.name}={o.status}" for o in outcomes))
    print(f"evidence: {run_dir.path}")
    if failed:
        print(f"first failure: {failed[0].name}\n{failed[0].error}\n"
              f"resume after fixing: python -m runbook run --profile {args.profile} --resume {run_dir.run_id}",
              file=sys.stderr)
        return 1
    return 0


def cmd_validate(args) -> int:
    from .profile import load_profile
    profile = load_profile(args.profile, overrides=_overrides(args.param))
    print(json.dumps(profile.redacted(), indent=2, default=str))
    print(f"\n{args.profile}: valid", file=sys.stderr)
    return 0


def cmd_lab(args) -> int:
    from .lab import netlab
    lab_dir = _lab_dir(args)
    if args.action == "up":
        info = netlab.up(lab_dir, nodes=args.nodes)
        print(json.dumps(info.to_dict(), indent=2, default=str))
    elif args.action == "down":
        from .lab import control
        control.stop_hub()
        netlab.down(lab_dir)
        print("lab down")
    else:
        print(json.dumps(netlab.status(lab_dir), indent=2, default=str))
    return 0


def cmd_bench(argv: list[str]) -> int:
    from .bench import cli as bench_cli
    return bench_cli.main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runbook", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="execute the runbook's notebooks in order (papermill)")
    run.add_argument("--profile", default=DEFAULT_PROFILE)
    run.add_argument("-p", "--param", action="append", metavar="KEY=VALUE", help="override a profile key")
    run.add_argument("--from", dest="start", help="first step (number, name or file stem)")
    run.add_argument("--to", dest="stop", help="last step")
    run.add_argument("--only", help="comma-separated steps")
    run.add_argument("--resume", metavar="RUN_ID", help="continue a run: skip its passed steps")
    run.add_argument("--dry-run", action="store_true", help="record every command without running actions")
    run.add_argument("--no-lab", action="store_true", help="do not bring the lab up (it is already up)")
    run.add_argument("--step-timeout", type=int, default=3600)
    run.set_defaults(func=cmd_run)

    val = sub.add_parser("validate", help="validate a profile and print it")
    val.add_argument("--profile", default=DEFAULT_PROFILE)
    val.add_argument("-p", "--param", action="append", metavar="KEY=VALUE")
    val.set_defaults(func=cmd_validate)

    lab = sub.add_parser("lab", help="the embedded two-node lab")
    lab.add_argument("action", choices=["up", "down", "status"])
    lab.add_argument("--nodes", type=int, default=2)
    lab.add_argument("--lab-dir")
    lab.set_defaults(func=cmd_lab)

    sub.add_parser("bench", help="benchmark an OpenAI-compatible server (see: bench --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # papermill streams each cell's output through its logger: show it live
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("papermill").setLevel(logging.INFO)
    try:
        if argv and argv[0] == "bench":
            return cmd_bench(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except RunbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
