"""``python -m runbook``: parses flags, calls one library function, maps errors to exit codes."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from .console import duration
from .errors import ExitStatus, RunbookError, UsageError

DEFAULT_PROFILE = "env/lab.env"


def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UsageError(f"override {pair!r} is not KEY=VALUE", fix="write -p MAX_MODEL_LEN=4096")
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _lab_dir(args) -> Path:
    from .lab import netlab
    return Path(args.lab_dir) if getattr(args, "lab_dir", None) else netlab.default_lab_dir()


def cmd_run(args) -> int:
    """Each step as one live line; at the end the summary table, the verdict in one line and the report's
    path (runbook/console.py). The full stream is in the run folder's console.log, and here with -v."""
    from . import runner
    from .console import Console
    from .lab.control import ensure_lab
    only = [s for s in (args.only or "").split(",") if s]
    overrides, rehearsal = _overrides(args.param), None
    _rehearsal_only(args)
    console = Console(verbose=args.verbose)
    if args.rehearse:
        from .lab.rehearsal import load_rehearsal
        from .site import count, count_text
        _, overrides, subs = load_rehearsal(args.profile, overrides, publish=True, ssh_user=args.ssh_user or "",
                                            echo=console.detail)
        rehearsal = [s.to_dict() for s in subs]
        console.say(f"rehearsal of {args.profile} on the lab: {len(subs)} key(s) substituted "
                    f"({count_text(count(rehearsal))}; see rehearsal.json in the run folder); every other key runs "
                    "as the recipe has it")
    lab_up = None if args.no_lab else (lambda profile: ensure_lab(profile, echo=console.detail))
    with console.capture_stdio():
        run_dir, outcomes = runner.run(args.profile, start=args.start or "", stop=args.stop or "", only=only,
                                       resume=args.resume or "", dry_run=args.dry_run,
                                       overrides=overrides, step_timeout=args.step_timeout,
                                       lab_up=lab_up, rehearsal=rehearsal, echo=console.say, console=console)
    failed = [o for o in outcomes if o.status != "passed"]
    took = sum(o.seconds for o in outcomes)
    verdict = console.report_verdict
    if failed:
        first = failed[0]
        code = first.exit or ExitStatus.FAILED      # the failing step's class (checks, action, remote, ...)
        console.finish(f"failed at {first.name} (exit {int(code)}) after {len(outcomes)} step(s)" +
                       (f"; verdict: {verdict}" if verdict else ""),
                       extra=[x for x in (console.first_fix_text(),) if x]
                       + [f"resume after fixing: python -m runbook run --profile {args.profile} "
                          f"--resume {run_dir.run_id}"])
        return code
    other = run_dir.manifest().get("other_servers") or {}
    if other:                # every step passed, but 05-07's evidence belongs to another start of the server
        first, *more = other.values()
        console.finish(f"not passed: {first}", extra=more + [
            f"re-run them: python -m runbook run --profile {args.profile} --resume {run_dir.run_id} "
            f"--from {next(iter(other))[:2]}"])
        return ExitStatus.FAILED
    word = "dry run done" if args.dry_run else "passed"
    console.finish(f"{word}: {len(outcomes)} step(s) in {duration(took)}" + (f"; verdict: {verdict}" if verdict else "")
                   if outcomes else f"nothing to run in {run_dir.run_id}")
    return ExitStatus.OK


def cmd_validate(args) -> int:
    """"valid" with what the profile acts on, then the review list; ``--json``: the validated profile (secrets
    masked) on stdout, the rest on stderr."""
    from .profile import executing_keys_changed, load_profile, refuse_unservable
    from .profile.rules import review_notes
    profile = load_profile(args.profile, overrides=_overrides(args.param))
    if not args.ray_cluster:        # checked up to the Ray cluster alone: EXECUTOR=ray on the lab's CPU vLLM passes
        refuse_unservable(profile)
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    if args.json:
        print(json.dumps(profile.redacted(), indent=2, default=str))
    nodes = ", ".join(f"{n.name} {n.ssh}" for n in profile.nodes)
    say(f"{args.profile}: valid (profile {profile.profile_name}, recipe {profile.recipe}, "
        f"{len(profile.nodes)} nodes: {nodes}; topology {profile.topology})")
    for note in review_notes(profile):
        say(f"review: {note}")
    changed = executing_keys_changed(profile)
    if changed:     # the profile is code: what runs or is fetched differs from the shipped recipe
        say(f"review: {len(changed)} key(s) that execute or fetch differ from env/{profile.recipe}.env:")
        for key, value, shipped in changed:
            say(f"  {key}={value}   (shipped: {shipped or '(empty)'})")
    else:
        say(f"review: nothing that executes or fetches differs from env/{profile.recipe}.env")
    return ExitStatus.OK


def cmd_lab(args) -> int:
    from .lab import netlab
    lab_dir = _lab_dir(args)
    if args.action == "up":
        info = netlab.up(lab_dir, nodes=args.nodes, topology=args.topology)
        print(json.dumps(info.to_dict(), indent=2, default=str))
    elif args.action == "down":
        from .lab import control
        control.stop_hub()
        netlab.down(lab_dir)
        print("lab down")
    else:
        print(json.dumps(netlab.status(lab_dir), indent=2, default=str))
    return ExitStatus.OK


def _rehearsal_only(args) -> None:
    if getattr(args, "ssh_user", None) and not args.rehearse:
        raise UsageError("--ssh-user chooses who logs in to the lab's nodes in a rehearsal",
                         fix="add --rehearse, or set the user in HEAD_SSH/WORKER_SSH (user@host) of your profile")


def _ssh_user_arg(parser) -> None:
    parser.add_argument("--ssh-user", metavar="USER",
                        help="with --rehearse: log in to the lab's nodes as USER: root (default) or spark, the lab's "
                             "non-root operator with exactly the runbook's sudoers drop-in")


def _server_profile_args(parser) -> None:
    """--profile, -p and --rehearse of the commands that reach a profile's server (see _server_cluster)."""
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("-p", "--param", action="append", metavar="KEY=VALUE", help="override a profile key")
    parser.add_argument("--rehearse", action="store_true",
                        help="the recipe profile as `run --rehearse` runs it on the lab")
    _ssh_user_arg(parser)


def _server_cluster(args):
    from .profile import load_profile
    from .remote import Cluster
    _rehearsal_only(args)
    if args.rehearse:      # the rehearsed server of a recipe profile, as `run --rehearse` ran it
        from .lab.rehearsal import load_rehearsal
        profile, _, _ = load_rehearsal(args.profile, _overrides(args.param), publish=True,
                                       echo=lambda line: print(line, file=sys.stderr), ssh_user=args.ssh_user or "")
    else:
        profile = load_profile(args.profile, overrides=_overrides(args.param))
    names = [n.name for n in profile.nodes]
    node = vars(args).get("node")             # only the commands that take one node have the argument
    if node and node not in names:
        raise UsageError(f"no node {node!r} in {args.profile}", expected="one of " + ", ".join(names),
                         fix=f"name one of the profile's {len(names)} nodes, or leave the node out (all)")
    return profile, Cluster.from_profile(profile)


def cmd_start(args) -> int:
    """Start the server of a profile outside a run, as step 04 does (``launch.launch_plan`` then
    ``launch.bring_up``: image, worker(s) then head, readiness). Exit 0 when it came up, 3 when its ranks were
    already running with the same configuration (the seeds' contract), 1 when it could not start."""
    from .errors import ALREADY_RUNNING
    from .launch import bring_up, exposure, server
    from .lab.site import site_for
    from .launch.plan import launch_plan
    from .remote import ClusterLock
    profile, cluster = _server_cluster(args)
    key_row = exposure.ensure_api_key(profile)      # a bind beyond loopback gets a key before the plan renders
    print(f"{key_row.name}: {key_row.status.value} {key_row.observed}")
    with cluster, ClusterLock(cluster.head, command="start", echo=_say):
        # no run: the GID indexes are resolved from the nodes (under the site's GID tables, as step 04 reads them)
        plan = launch_plan(cluster, profile, site=site_for(profile))
        outcome = bring_up(cluster, profile, plan, go=not key_row.failed)
    if outcome.started is None:
        print(outcome.checks.to_text())
        return ExitStatus.FAILED
    print(outcome.started.checks.to_text())
    code = server.exit_code(outcome.started)
    if code == ALREADY_RUNNING:
        print(f"not a failed start: the ranks already run with fingerprint {plan.fingerprint[:12]} (dockerd restores "
              f"them after a reboot); exit {ALREADY_RUNNING}", file=sys.stderr)
    return code


def cmd_render(args) -> int:
    """Print every command each step would run on every node, offline (no SSH, no lab), secrets masked; with
    ``--step N`` only that step, with ``--diff OTHER`` the unified diff of the two profiles' renders. Exit 0 (a
    diff too: it is a review, not a check), 2 for a refused profile or secrets file or a bad argument."""
    from .review import review, review_diff
    kw = {"home": args.home or "", "overrides": _overrides(args.param), "step": args.step or ""}
    if args.diff:
        print(review_diff(args.profile, args.diff, **kw) or
              f"# {args.profile} and {args.diff} run the same commands\n", end="")
    else:
        print(review(args.profile, **kw), end="")
    return 0


def cmd_diagnose(args) -> int:
    """Live: collect from every node, write results/<run>/diagnose/diagnose-<stamp>.tar.gz with its pages, print
    the catalogue entries that match; exit 0 when none matched, 1 when some did. Offline (--log/--text): rank
    the entries against logs, bundles or a sentence with no nodes and no profile; exit 0 when it ran (matched or
    not), 2 when an input is missing, unreadable, too large, not a regular file or not text. --accuracy: the
    matcher's measured accuracy on the corpus; exit 0 (2: a --corpus folder that is missing or holds a bad file). Everything printed goes through the secrets redactor (the
    known secrets and every secret shape): this is the text users paste into issue trackers."""
    from .secrets import redactor_from_env
    redactor = redactor_from_env()
    if args.accuracy:
        from .diagnose.accuracy import DEFAULT_CORPUS, evaluate, load_corpus
        from .diagnose.inputs import Budget, InputError, check_file
        try:
            if args.corpus:         # a user's folder: no FIFO, device or oversized file reaches the reader
                budget = Budget()
                for path in sorted(Path(args.corpus).glob("*.jsonl")):
                    check_file(path, budget)
            report = evaluate(load_corpus(args.corpus or DEFAULT_CORPUS))
        except InputError as exc:
            raise UsageError(redactor(exc.what), fix=redactor(exc.fix)) from None
        except (OSError, ValueError) as exc:       # no such folder, a bad case line: a bad argument
            raise UsageError(redactor(str(exc))) from None
        print(report.table())
        print(f"{report.cell().positives} cases over {report.classes} failure classes, "
              f"{report.cell().negatives} off-domain texts")
        return 0
    if args.log or args.text:
        from .diagnose import offline
        from .diagnose.inputs import InputError
        try:
            ranked = offline.diagnose_inputs(args.log or [], args.text or "", redactor)
        except InputError as exc:       # the path itself may hold a token
            raise UsageError(redactor(exc.what), fix=redactor(exc.fix)) from None
        ranked = offline.redact(ranked, redactor)
        if args.json:
            print(json.dumps(redactor.redact_obj([r.to_dict() for r in ranked]), indent=2))
        else:
            print(redactor(offline.render(ranked, top=args.top)))
        return 0
    from .evidence import RESULTS_ROOT, RunDir
    from .launch import diagnosis
    from .lab.site import site_for
    from .launch.plan import launch_plan
    from .remote import ClusterLock
    from .runner import run_folder
    profile, cluster = _server_cluster(args)
    with cluster, ClusterLock(cluster.head, command="diagnose", echo=_say):
        run = RunDir(run_folder(args.run, RESULTS_ROOT), redactor) if args.run else \
            RunDir.create(profile.profile_name, RESULTS_ROOT, redactor)
        status = "failed"
        try:
            plan = launch_plan(cluster, profile, site=site_for(profile))
            archive, findings = diagnosis.diagnose_server(cluster, profile, run.path, redactor, plan=plan)
            status = "passed"
        finally:
            if not args.run:      # its own folder: finished (an existing run's status is that run's)
                run.update_manifest(status=status, finished=time.time(), mode="diagnose")
    for finding in findings:
        print(redactor(finding.to_text()) + "\n")
    print(f"{len(findings)} known failure(s) matched; bundle: {archive}")
    return ExitStatus.FAILED if findings else ExitStatus.OK


def cmd_watch(args) -> int:
    """The serving watchdog in the foreground over the profile's server (Ctrl-C ends it). Exit 1 if it fired."""
    import time
    from .api.watchdog import Watchdog
    from .profile import load_profile
    profile = load_profile(args.profile, overrides=_overrides(args.param))
    dog = Watchdog(profile, stall_s=args.stall).start()
    print(f"watching {profile.served_model_name} on port {profile.port} (stall limit {dog.stall_s:.0f} s); Ctrl-C ends")
    try:
        deadline = time.monotonic() + args.seconds if args.seconds else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        dog.stop()
    row = dog.check()
    print(f"{row.status.value}: {row.observed}")
    return ExitStatus.FAILED if dog.alerts else ExitStatus.OK


def cmd_stop(args) -> int:
    from .launch import stop
    from .remote import ClusterLock
    profile, cluster = _server_cluster(args)
    with cluster, ClusterLock(cluster.head, command="stop", echo=_say):
        result = stop.stop(cluster, profile, nodes=[args.node] if args.node else None)
    print(result.checks.to_text())
    return ExitStatus.OK if result.ok else ExitStatus.ACTION_FAILED


def cmd_status(args) -> int:
    """A short table (node, rank, state; the API), the verdict line with what to do; ``--json``: one JSON
    document on stdout instead (with ``verdict``). Exit by verdict (``status.VERDICT_EXIT``): 0 up, 10 stopped,
    11 partial, 12 frozen, 13 orphaned, 8 a node could not be read."""
    from .launch import status
    profile, cluster = _server_cluster(args)
    if not args.json:
        print(f"status of {profile.profile_name} ({profile.source}): {', '.join(n.name for n in profile.nodes)}")
    with cluster:
        state = status.status(cluster, profile)
    word, line = status.verdict(state, profile)
    state["verdict"] = word
    if args.json:
        print(json.dumps(state, indent=2, default=str))
        print(line, file=sys.stderr)         # stdout stays one JSON document for scripts
    else:
        print("\n".join(status.table(state)))
        print(line)
    return status.VERDICT_EXIT[word]


def cmd_logs(args) -> int:
    """The log tails. Exit 0 when every rank shown is running, 10 when one is not (its log is still shown)."""
    from .facts import ranks
    from .launch import status
    profile, cluster = _server_cluster(args)
    down = []
    with cluster:
        for node in ([args.node] if args.node else [n.name for n in cluster.nodes]):
            print(f"==> {node} <==")
            print(status.logs(cluster, profile, node, tail_lines=args.tail))
            if not ranks.rank_state(cluster[node], profile).running:
                down.append(node)
    if down:
        print(f"not running: {', '.join(down)}", file=sys.stderr)
    return ExitStatus.SERVER_DOWN if down else ExitStatus.OK


def cmd_report(args) -> int:
    """Write results/<run>/report.html (+ results/index.html/json); print the drift summary."""
    from . import report
    root = Path(args.results) if args.results else None
    run = report.resolve_run(args.run, root)
    path, model = report.write_report(run, results_root=root or run.parent, rel_tol=args.tolerance,
                                      index=not args.no_index)
    print(f"report: {path}")
    if model.drift is not None:
        print(f"drift: {model.drift.summary()}" + (f" (vs {model.drift.previous_run_id})"
                                                   if model.drift.previous_run_id else ""))
    bad = model.inconsistent()
    for f in bad:
        print(f"MISMATCH {f.key}: recomputed {f.value} != recorded {f.recorded} ({f.source})", file=sys.stderr)
    for note in model.notes:
        print(f"note: {note}", file=sys.stderr)
    return ExitStatus.FAILED if bad else ExitStatus.OK


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
    run.add_argument("--rehearse", action="store_true",
                     help="run a recipe profile on the embedded lab: what the lab cannot run as written is "
                          "substituted (listed in rehearsal.json by class; hardware-only rows say SIMULATED)")
    _ssh_user_arg(run)
    run.add_argument("--step-timeout", type=int, default=0,
                     help="seconds one notebook may run (default: sized from the profile's downloads)")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="show the full stream (every cell's output, papermill's cell markers, the kernel's "
                          "stderr) as it comes; it is always kept in the run folder's console.log")
    run.set_defaults(func=cmd_run)

    val = sub.add_parser("validate", help="validate a profile: 'valid' and the keys to review (--json: the profile)")
    val.add_argument("--profile", default=DEFAULT_PROFILE)
    val.add_argument("-p", "--param", action="append", metavar="KEY=VALUE")
    val.add_argument("--json", action="store_true", help="print the validated profile as JSON (secrets masked) on "
                                                         "stdout; the verdict and review list go to stderr")
    val.add_argument("--ray-cluster", action="store_true",
                     help="check the profile up to its Ray cluster only (EXECUTOR=ray on the lab's CPU vLLM, which "
                          "cannot serve through Ray, passes)")
    val.set_defaults(func=cmd_validate)

    lab = sub.add_parser("lab", help="the embedded lab (2 to 8 nodes)")
    lab.add_argument("action", choices=["up", "down", "status"])
    lab.add_argument("--nodes", type=int, default=2, help="2 to 8 nodes")
    lab.add_argument("--topology", choices=["cable", "triangle", "switch"],
                     help="how the fabric is wired (default: a cable for 2 nodes, the triangle for 3, else a switch)")
    lab.add_argument("--lab-dir")
    lab.set_defaults(func=cmd_lab)

    start = sub.add_parser("start", help="start the profile's server (exit 3: its ranks already run)")
    _server_profile_args(start)
    start.set_defaults(func=cmd_start)

    rend = sub.add_parser("render", help="print every command each step would run on every node, offline "
                                         "(no SSH, no lab; review before the nodes are cabled)")
    rend.add_argument("--profile", default=DEFAULT_PROFILE)
    rend.add_argument("-p", "--param", action="append", metavar="KEY=VALUE", help="override a profile key")
    rend.add_argument("--home", help="the nodes' home directory for ~ paths (default: /home/<ssh user>)")
    rend.add_argument("--step", metavar="N", help="only this step's commands (4, 04 or 04_launch)")
    rend.add_argument("--diff", metavar="OTHER_PROFILE",
                      help="a unified diff of this profile's render and OTHER_PROFILE's (same --home, -p, --step): "
                           "what the change does to the commands")
    rend.set_defaults(func=cmd_render)

    diag = sub.add_parser("diagnose", help="collect a support bundle from every node and match known failures; "
                                           "offline with --log/--text (no nodes, no profile)")
    _server_profile_args(diag)
    diag.add_argument("--run", help="write into this run folder under results/ (default: a new one)")
    diag.add_argument("--log", nargs="+", metavar="FILE",
                      help="offline: log files, diagnose-*.tar.gz bundles or their folders to match")
    diag.add_argument("--text", help="offline: what you saw, in your own words (or pasted lines)")
    diag.add_argument("--top", type=int, default=5, help="offline: matches shown (default 5)")
    diag.add_argument("--json", action="store_true", help="offline: print the ranked matches as JSON")
    diag.add_argument("--accuracy", action="store_true",
                      help="print the offline matcher's top-1/top-3/false alarms on the test corpus")
    diag.add_argument("--corpus", help="with --accuracy: a folder of *.jsonl cases (default: the tests' corpus)")
    diag.set_defaults(func=cmd_diagnose)

    watch = sub.add_parser("watch", help="alert when the server stops generating while requests wait (wedge)")
    _server_profile_args(watch)
    watch.add_argument("--seconds", type=float, default=0, help="stop after this long (default: until Ctrl-C)")
    watch.add_argument("--stall", type=float, default=None,
                       help="seconds without a processed token that count (default: 20 on the lab, 180 on Sparks)")
    watch.set_defaults(func=cmd_watch)

    for name, func, text in (("stop", cmd_stop, "stop the vLLM server on both nodes (proves teardown)"),
                             ("status", cmd_status, "state of every vLLM rank and the API: up, partial, frozen, orphaned or stopped"),
                             ("logs", cmd_logs, "the last lines of the vLLM logs")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("node", nargs="?", help="one node of the profile: head, worker, worker2 ... (default: all)")
        _server_profile_args(sp)
        if name == "logs":
            sp.add_argument("--tail", type=int, default=100, help="lines per node")
        if name == "status":
            sp.add_argument("--json", action="store_true", help="one JSON document on stdout (the verdict line "
                            "on stderr)")
        sp.set_defaults(func=func)

    sub.add_parser("bench", help="benchmark an OpenAI-compatible server (see: bench --help)", add_help=False)

    rep = sub.add_parser("report", help="write a run's self-contained HTML report (+ drift, results index)")
    rep.add_argument("run", help="run id under the results folder, or a run folder path")
    rep.add_argument("--results", help="results folder (default: results/, or the run folder's parent)")
    rep.add_argument("--tolerance", type=float, default=0.20,
                     help="relative change that counts as drift for figures without a spread (default 0.20)")
    rep.add_argument("--no-index", action="store_true", help="do not regenerate results/index.html|json")
    rep.set_defaults(func=cmd_report)
    from .fit.cli import add_parser as add_plan_parser
    add_plan_parser(sub)
    return parser


def _masked(text: str) -> str:
    """Text through the secrets redactor: the known secrets (a refused secrets file is skipped) and every shape."""
    from .secrets import Redactor, redactor_from_env
    try:
        red = redactor_from_env()
    except Exception:          # noqa: BLE001 - an unreadable secrets file must not hide the error being reported
        red = Redactor()
    return red(text)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # papermill streams each cell's output through its logger: show it live
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("papermill").setLevel(logging.INFO)
    try:
        if argv and argv[0] == "bench":
            return cmd_bench(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except RunbookError as exc:
        print(f"error: {_masked(str(exc))}", file=sys.stderr)     # a message may quote what the user typed
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
