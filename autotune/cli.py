"""The command line: a thin layer that parses arguments and calls the library."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from .errors import AutotuneError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autotune", description=__doc__)
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="search a space and recommend the fastest config")
    run.add_argument("space", help="space file (YAML)")
    run.add_argument("--n-trials", type=int, help="distinct configs to measure (overrides budget)")
    run.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    run.add_argument("--storage", help="Optuna storage URL (default: the space's, sqlite)")
    run.add_argument("--study-name", help="study name (default: the space file's stem)")
    run.add_argument("--out", help="folder for trial logs and best_config.yaml")
    par = run.add_mutually_exclusive_group()
    par.add_argument("--gpus", help="one worker per GPU: '0,1,2,3' or 'all' (CUDA_VISIBLE_DEVICES)")
    par.add_argument("--jobs", type=int, help="N workers on this machine sharing the study")
    run.add_argument(
        "--worker-index",
        type=int,
        default=int(os.environ.get("AUTOTUNE_WORKER_INDEX", "0")),
        help="this worker's number when several share a study (seed offset)",
    )
    run.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)

    val = sub.add_parser("validate", help="check a space file without running anything")
    val.add_argument("space")

    show = sub.add_parser("show", help="summarise a stored study")
    show.add_argument("space", help="the space file the study was run from")
    show.add_argument("--storage")
    show.add_argument("--study-name")

    rep = sub.add_parser(
        "report", help="summary, plots and bottleneck analysis of a stored study (HTML + PNG)"
    )
    rep.add_argument("space", help="the space file the study was run from")
    rep.add_argument("--storage")
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

    exp = sub.add_parser("export", help="the best config for a trainer: yaml, json, hf, ...")
    exp.add_argument("source", help="a best_config.yaml, or a space file (its study's best)")
    exp.add_argument(
        "--format",
        "-f",
        default="yaml",
        help="yaml | json | hf (TrainingArguments) | lightning | env (default: yaml)",
    )
    exp.add_argument("--output", "-o", help="write to this file instead of stdout")
    exp.add_argument("--storage", help="with a space file: the Optuna storage URL")
    exp.add_argument("--study-name", help="with a space file: the study name")

    sub.add_parser("knobs", help="list the knobs a space can tune")
    return p


def _run(args: argparse.Namespace) -> int:
    from .report import ConsoleReporter, print_summary
    from .space import load_space
    from .tuner import tune

    space = load_space(args.space)
    if args.gpus or (args.jobs and args.jobs > 1):
        return _run_workers(args, space)
    reporter = ConsoleReporter(prefix=f"[w{args.worker_index}] " if args.no_summary else "")
    reporter.console.print(
        f"autotune: study {args.study_name or space.study.name} "
        f"in {args.storage or space.study.storage}"
    )
    result = tune(
        space,
        n_trials=args.n_trials,
        timeout_s=args.timeout,
        storage=args.storage,
        study_name=args.study_name,
        out_dir=args.out,
        reporter=reporter,
        worker_index=args.worker_index,
    )
    if args.no_summary:
        return 0 if result.best is not None else 2
    print_summary(result, reporter.console)
    if result.best is not None:
        again = " ".join(
            f"{flag} {value}"
            for flag, value in (
                ("--storage", args.storage),
                ("--study-name", args.study_name),
                ("--out", args.out),
            )
            if value
        )
        reporter.console.print(
            f"next: autotune report {args.space} {again}".rstrip()
            + f" · autotune export {result.best_config_path} --format hf"
        )
    return 0 if result.best is not None else 2


def _gpu_ids(spec: str) -> list[str]:
    if spec != "all":
        ids = [g.strip() for g in spec.split(",") if g.strip()]
        if not ids or not all(g.isdigit() for g in ids):
            raise AutotuneError(f"--gpus must be 'all' or a list like 0,1,2 but got {spec!r}")
        return ids
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as e:  # no driver, no library: NVMLError and friends
        raise AutotuneError(f"--gpus all: no NVIDIA GPUs found here ({e})") from None
    if count == 0:
        raise AutotuneError("--gpus all: no NVIDIA GPUs found here")
    return [str(i) for i in range(count)]


def _run_workers(args: argparse.Namespace, space) -> int:
    """Several workers on this machine share one study: one per GPU, or N on the CPU."""
    import subprocess

    from .tuner import open_study

    storage = args.storage or space.study.storage
    name = args.study_name or space.study.name
    open_study(space, storage, name)  # create it once: workers starting together only load it
    if args.gpus:
        devices: list[str | None] = list(_gpu_ids(args.gpus))
    else:
        devices = [None] * args.jobs
        print(
            f"autotune: warning: {args.jobs} CPU workers share this machine's cores; their "
            "trials slow each other down, so throughputs are distorted. Prefer one worker per "
            "machine or per GPU.",
            file=sys.stderr,
        )
    procs = []
    for index, device in enumerate(devices):
        cmd = [
            sys.executable,
            "-m",
            "autotune",
            "run",
            args.space,
            "--storage",
            storage,
            "--study-name",
            name,
            "--worker-index",
            str(args.worker_index * len(devices) + index),  # unique across hosts too
            "--no-summary",
        ]
        for flag, value in (
            ("--n-trials", args.n_trials),
            ("--timeout", args.timeout),
            ("--out", args.out),
        ):
            if value is not None:
                cmd += [flag, str(value)]
        env = dict(os.environ)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        procs.append(subprocess.Popen(cmd, env=env))
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()  # workers treat SIGTERM like Ctrl-C: trial killed, resumable
        for p in procs:
            p.wait()
        raise
    args.storage, args.study_name = storage, name
    _show(args)
    return max(codes) if any(codes) else 0


def _validate(args: argparse.Namespace) -> int:
    from .space import load_space

    space = load_space(args.space)
    searched = space.searched
    print(
        f"{args.space}: ok; workload {space.workload}; "
        f"{len(searched)} searched knobs: {', '.join(searched) or 'none'}"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    from .report import print_summary
    from .space import load_space
    from .tuner import load_result

    _, result = load_result(load_space(args.space), args.storage, args.study_name)
    print_summary(result)
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report import ConsoleReporter, print_report
    from .reporting import make_report
    from .space import load_space

    if args.profile_steps < 1:
        raise AutotuneError(f"--profile-steps must be at least 1 but got {args.profile_steps}")
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

    from .export import export_config, load_best

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


def _knobs(args: argparse.Namespace) -> int:
    from .knobs import KNOBS

    for knob in KNOBS.values():
        domain = (
            ", ".join(map(str, knob.choices))
            if knob.choices
            else ("true/false" if knob.kind == "bool" else f"integer >= {knob.minimum}")
        )
        default = str(knob.default).lower() if knob.kind == "bool" else str(knob.default)
        print(f"{knob.name:24} default {default:8} [{domain}]  {knob.help}")
    return 0


COMMANDS = {
    "run": _run,
    "validate": _validate,
    "show": _show,
    "report": _report,
    "export": _export,
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


if __name__ == "__main__":
    sys.exit(main())
