"""The command line: a thin layer that parses arguments and calls the library."""

from __future__ import annotations

import argparse
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

    val = sub.add_parser("validate", help="check a space file without running anything")
    val.add_argument("space")

    show = sub.add_parser("show", help="summarise a stored study")
    show.add_argument("space", help="the space file the study was run from")
    show.add_argument("--storage")
    show.add_argument("--study-name")

    sub.add_parser("knobs", help="list the knobs a space can tune")
    return p


def _run(args: argparse.Namespace) -> int:
    from .report import ConsoleReporter, print_summary
    from .space import load_space
    from .tuner import tune

    space = load_space(args.space)
    reporter = ConsoleReporter()
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
    )
    print_summary(result, reporter.console)
    return 0 if result.best is not None else 2


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
    import optuna

    from .report import print_summary
    from .space import load_space
    from .tuner import TuneResult, baseline_of, best_of, records

    space = load_space(args.space)
    storage = args.storage or space.study.storage
    name = args.study_name or space.study.name
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except Exception as e:
        raise AutotuneError(f"cannot load study {name!r} from {storage!r}: {e}") from None
    trials = records(study)
    print_summary(
        TuneResult(
            name,
            storage,
            trials,
            baseline_of(trials),
            best_of(trials),
            study.user_attrs.get("environment", {}),
        )
    )
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


COMMANDS = {"run": _run, "validate": _validate, "show": _show, "knobs": _knobs}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
