"""The command line: a thin layer that parses arguments and calls the library."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from .credentials import has_secret, redact_url, warn_literal_password
from .errors import ArgumentError, AutotuneError
from .measurement import OK

STORAGE_HELP = (
    "Optuna storage URL (default: $AUTOTUNE_STORAGE, else the space's study.storage); "
    "a password shows in `ps`: prefer PGPASSWORD, ~/.pgpass or $AUTOTUNE_STORAGE"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autotune", description=__doc__)
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (
        _add_run,
        _add_validate,
        _add_show,
        _add_report,
        _add_export,
        _add_verify,
        _add_knobs,
    ):
        add(sub)  # one function per command, in the order `autotune --help` lists them
    return p


def _add_run(sub: argparse._SubParsersAction) -> None:
    """The ``autotune run`` command and its flags."""
    run = sub.add_parser("run", help="search a space and recommend the fastest config")
    run.add_argument("space", help="space file (YAML)")
    run.add_argument("--n-trials", type=int, help="distinct configs to measure (overrides budget)")
    run.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    run.add_argument("--storage", help=STORAGE_HELP)
    run.add_argument("--study-name", help="study name (default: the space file's stem)")
    run.add_argument("--out", help="folder for trial logs and best_config.yaml")
    par = run.add_mutually_exclusive_group()
    par.add_argument("--gpus", help="one worker per GPU: '0,1,2,3' or 'all' (CUDA_VISIBLE_DEVICES)")
    par.add_argument("--jobs", type=int, help="N workers on this machine sharing the study")
    run.add_argument(
        "--worker-index",
        type=int,
        help="this worker's number when several share a study (seed offset; "
        "default: $AUTOTUNE_WORKER_INDEX or 0)",
    )
    run.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)


def _add_validate(sub: argparse._SubParsersAction) -> None:
    """The ``autotune validate`` command and its flags."""
    val = sub.add_parser(
        "validate",
        help="check a space file, then build its workload and run one step on the CPU",
    )
    val.add_argument("space")
    val.add_argument(
        "--no-build",
        action="store_true",
        help="check the space file only (do not import or build the workload)",
    )


def _add_show(sub: argparse._SubParsersAction) -> None:
    """The ``autotune show`` command and its flags."""
    show = sub.add_parser("show", help="summarise a stored study")
    show.add_argument("space", help="the space file the study was run from")
    show.add_argument("--storage", help=STORAGE_HELP)
    show.add_argument("--study-name")


def _add_report(sub: argparse._SubParsersAction) -> None:
    """The ``autotune report`` command and its flags."""
    rep = sub.add_parser(
        "report", help="summary, plots and bottleneck analysis of a stored study (HTML + PNG)"
    )
    rep.add_argument("space", help="the space file the study was run from")
    rep.add_argument("--storage", help=STORAGE_HELP)
    rep.add_argument("--study-name")
    rep.add_argument(
        "--out", help="the run folder given to `run` (report goes to OUT/STUDY/report/)"
    )
    rep.add_argument(
        "--no-profile",
        action="store_true",
        help="do not profile baseline and best (use profiles already stored in the study)",
    )
    rep.add_argument(
        "--reprofile", action="store_true", help="profile again even if profiles are stored"
    )
    rep.add_argument(
        "--profile-steps", type=int, default=5, help="optimizer steps under the profiler"
    )


def _add_export(sub: argparse._SubParsersAction) -> None:
    """The ``autotune export`` command and its flags."""
    exp = sub.add_parser("export", help="the best config for a trainer: yaml, json, hf, ...")
    exp.add_argument("source", help="a best_config.yaml, or a space file (its study's best)")
    exp.add_argument(
        "--format",
        "-f",
        default="yaml",
        help="yaml | json | hf (TrainingArguments) | lightning | env | torch (plain loop) "
        "(default: yaml)",
    )
    exp.add_argument("--output", "-o", help="write to this file instead of stdout")
    exp.add_argument("--storage", help="with a space file: " + STORAGE_HELP)
    exp.add_argument("--study-name", help="with a space file: the study name")


def _add_verify(sub: argparse._SubParsersAction) -> None:
    """The ``autotune verify`` command and its flags."""
    ver = sub.add_parser(
        "verify",
        help="run baseline and recommendation longer, in paired rounds: predicted vs observed",
    )
    ver.add_argument("space", help="the space file the study was run from")
    ver.add_argument("--storage", help=STORAGE_HELP)
    ver.add_argument("--study-name")
    ver.add_argument("--out", help="the run folder given to `run` (runs go to OUT/STUDY/verify/)")
    ver.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="the least paired rounds, the order alternating (default: 3); more run while "
        "the error's interval crosses an edge of the ±5%% goal",
    )
    ver.add_argument(
        "--max-rounds",
        type=int,
        default=None,
        help="the most paired rounds (default: 8, at least --rounds)",
    )
    ver.add_argument(
        "--steps-factor",
        type=int,
        default=10,
        help="each run times this many times the trial's measured steps (default: 10)",
    )
    ver.add_argument(
        "--endless",
        action="store_true",
        help="stream the trials' seeded permutations instead of epochs of the loader",
    )
    ver.add_argument(
        "--timeout", type=float, help="seconds per run (default: trial.timeout_s x steps factor)"
    )
    ver.add_argument("--json", action="store_true", help="print the verification as JSON")


def _add_knobs(sub: argparse._SubParsersAction) -> None:
    """The ``autotune knobs`` command and its flags."""
    kn = sub.add_parser("knobs", help="list the knobs a space can tune")
    kn.add_argument(
        "--markdown", action="store_true", help="print docs/knobs.md: the knobs as a table"
    )


def _worker_index(args: argparse.Namespace) -> int:
    """``--worker-index``, else ``AUTOTUNE_WORKER_INDEX``, else 0."""
    if args.worker_index is not None:
        return args.worker_index
    raw = os.environ.get("AUTOTUNE_WORKER_INDEX", "0")
    try:
        return int(raw)
    except ValueError:
        raise ArgumentError(f"AUTOTUNE_WORKER_INDEX must be an integer but got {raw!r}") from None


def _run(args: argparse.Namespace) -> int:
    from .output.console import ConsoleReporter, print_summary
    from .output.export import suggested_format
    from .space_file import load_space
    from .study.tuner import check_arguments, tune
    from .study.workers import run_workers

    worker_index = _worker_index(args)
    check_arguments(args.n_trials, args.timeout, worker_index)
    reporter = ConsoleReporter(prefix=f"[w{worker_index}] " if args.no_summary else "")
    if args.gpus is not None or (args.jobs is not None and args.jobs != 1):
        result = run_workers(
            args.space,
            jobs=args.jobs,
            gpus=args.gpus,
            n_trials=args.n_trials,
            timeout_s=args.timeout,
            storage=args.storage,
            study_name=args.study_name,
            out_dir=args.out,
            worker_index=worker_index,
            reporter=reporter,
        )
        print_summary(result, reporter.console)
        return 0 if result.best is not None else 2
    space = load_space(args.space)
    reporter.console.print(
        f"autotune: study {args.study_name or space.study.name} "
        f"in {redact_url(space.storage_url(args.storage))}"
    )
    result = tune(
        space,
        n_trials=args.n_trials,
        timeout_s=args.timeout,
        storage=args.storage,
        study_name=args.study_name,
        out_dir=args.out,
        reporter=reporter,
        worker_index=worker_index,
    )
    if args.no_summary:
        return 0 if result.best is not None else 2
    print_summary(result, reporter.console)
    if result.best is not None:
        again = " ".join(
            f"{flag} {value}"
            for flag, value in (
                ("--storage", args.storage and redact_url(args.storage)),
                ("--study-name", args.study_name),
                ("--out", args.out),
            )
            if value
        )
        fmt = suggested_format(result.environment)  # the workload's framework's
        reporter.console.print(
            f"next: autotune report {args.space} {again}".rstrip()
            + f" · autotune export {result.best_config_path} --format {fmt}"
        )
    return 0 if result.best is not None else 2


def _validate(args: argparse.Namespace) -> int:
    from .space_file import load_space

    space = load_space(args.space)
    if space.study.storage_env is None and has_secret(space.study.storage):
        warn_literal_password(space.study.storage, space.source)
    searched = space.searched
    print(
        f"{args.space}: the space file is valid; workload {space.workload}; "
        f"{len(searched)} searched knobs: {', '.join(searched) or 'none'}"
    )
    if args.no_build:
        return 0
    import tempfile
    from pathlib import Path

    from .study.runner import check

    with tempfile.TemporaryDirectory(prefix="autotune-validate-") as folder:
        result = check(space, Path(folder))
    if result.get("status") != OK:
        print(f"autotune: error: {result.get('reason', 'the build check failed')}", file=sys.stderr)
        return 1
    for problem in result["problems"]:
        print(f"autotune: error: {problem}", file=sys.stderr)
    if result["problems"]:
        return 1
    print(_built(result["facts"]))
    return 0


def _built(facts: dict) -> str:
    """What the build check built, in one line."""
    blocks = f", {facts['blocks']} blocks" if facts.get("blocks") else ""
    return (
        f"built on the CPU: model {facts['model']} ({facts['parameters']:,} parameters"
        f"{blocks}), dataset {facts['dataset']} ({facts['samples']:,} samples); one fp32 "
        f"step: batch {facts['batch']}, loss {facts['loss']:.4g}, backward ok"
    )


def _show(args: argparse.Namespace) -> int:
    from .output.console import print_summary
    from .space_file import load_space
    from .study.storage import load_result

    _, result = load_result(load_space(args.space), args.storage, args.study_name)
    print_summary(result)
    return 0


def _report(args: argparse.Namespace) -> int:
    from .output.console import ConsoleReporter, print_report
    from .output.report import make_report
    from .space_file import load_space

    reporter = ConsoleReporter()
    report = make_report(
        load_space(args.space),
        storage=args.storage,
        study_name=args.study_name,
        out_dir=args.out,
        profile=not args.no_profile,
        profile_steps=args.profile_steps,
        reprofile=args.reprofile,
        reporter=reporter,
    )
    print_report(report, reporter.console)
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .output.export import FORMATS, export_config, load_best

    if args.format not in FORMATS:  # before the study is opened
        raise ArgumentError(f"format must be one of {', '.join(FORMATS)} but got {args.format!r}")
    config, evidence = load_best(args.source, storage=args.storage, study_name=args.study_name)
    text = export_config(config, args.format, evidence=evidence)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as e:
            raise AutotuneError(f"cannot write {args.output}: {e.strerror or e}") from None
        print(f"{args.format} config written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _verify(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.markup import escape

    from .output.console import make_console
    from .output.verify_view import print_verification, run_line
    from .results import TuneResult
    from .space_file import load_space
    from .study.verify import VerifyRun, check_arguments, verify

    # With --json, stdout holds only the JSON; progress goes to stderr.
    console = Console(stderr=True, highlight=False) if args.json else make_console()

    def on_run(run: VerifyRun, index: int, total: int) -> None:
        console.print(escape(run_line(run, index, total)), soft_wrap=True)

    check_arguments(args.rounds, args.steps_factor, args.timeout, args.max_rounds)
    space = load_space(args.space)

    def on_start(result: TuneResult) -> None:
        # Once the study is found: a storage or a study that is not there is the error's
        # one line (with --json this header goes to stderr too).
        console.print(
            escape(
                f"autotune: verifying study {result.study_name} "
                f"in {redact_url(space.storage_url(args.storage))}: {args.rounds} paired rounds"
                " or more, until the error is resolved"
            ),
            soft_wrap=True,
        )

    verification = verify(
        space,
        storage=args.storage,
        study_name=args.study_name,
        out_dir=args.out,
        rounds=args.rounds,
        max_rounds=args.max_rounds,
        steps_factor=args.steps_factor,
        endless=args.endless,
        timeout_s=args.timeout,
        on_run=on_run,
        on_start=on_start,
    )
    if args.json:
        print(json.dumps(verification.to_dict(), indent=1))
    else:
        print_verification(verification, console)
    return 0 if verification.same_config or verification.observed is not None else 2


def _knobs(args: argparse.Namespace) -> int:
    from .knobs import KNOBS, markdown, show

    if args.markdown:
        print(markdown(), end="")
        return 0
    for knob in KNOBS.values():
        print(f"{knob.name:24} default {show(knob.default):8} [{knob.domain}]  {knob.help}")
    return 0


COMMANDS = {
    "run": _run,
    "validate": _validate,
    "show": _show,
    "report": _report,
    "export": _export,
    "verify": _verify,
    "knobs": _knobs,
}


def _sigterm_as_interrupt() -> None:
    """A scheduler's SIGTERM (preemption, scancel) stops like Ctrl-C: trial killed, resumable."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (main() called from a library)
        pass


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _sigterm_as_interrupt()
    try:
        return COMMANDS[args.command](args)
    except AutotuneError as e:
        if args.debug:
            traceback.print_exc()
        print(f"autotune: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autotune: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `autotune ... | head`: the reader left; no traceback
        # Python's own advice: point stdout at devnull so the flush at exit cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a process the pipe closed on


if __name__ == "__main__":
    sys.exit(main())
