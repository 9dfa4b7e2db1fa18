"""Property-based: whatever arguments arrive, the CLI exits 0, 1 or 2 and never with a
traceback (issue 17: arguments are validated at the boundary, like the space file)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os

from conftest import WORKLOADS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.cli import _parser, main

# No argument list may start real work: the files are missing, malformed YAML, or a
# mapping that is no space (errors at load, before storage or any trial); or a valid
# space (``good.yaml``) whose study is not stored, given to the commands that read a
# study (show, report, export, verify) and to ``validate --no-build``: their arguments
# are then judged past the loading, against the storage and the study.
FILES = ["missing.yaml", "bad.yaml", "nospace.yaml", "best.yaml", "-", ""]
LOADS = {"show", "report", "export", "verify", "validate"}


def _flags() -> dict[str, list[str]]:
    """Each subcommand's optional flags, read from the real parser (new flags join in)."""
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: sorted(
            opt
            for action in parser._actions
            for opt in action.option_strings
            if opt.startswith("--") and opt not in ("--help", "--debug")
        )
        for name, parser in sub.choices.items()
    }


FLAGS = _flags()
values = st.one_of(
    st.integers(-(2**40), 2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["all", "0,1", "x", "-1", "0", "yaml", "hf", "torch", "nope", ""]),
    st.text(max_size=8),
)


@st.composite
def argv(draw) -> list[str]:
    command = draw(st.sampled_from(sorted(FLAGS)))
    args = [command]
    if command in LOADS and draw(st.booleans()):
        args.append("good.yaml")
        if command == "validate":
            args.append("--no-build")  # building runs the workload: real work
    elif command != "knobs":
        args.append(draw(st.sampled_from(FILES)))
    for flag in draw(st.lists(st.sampled_from(FLAGS[command] or ["--nope"]), max_size=4)):
        args.append(flag)
        if draw(st.booleans()):
            args.append(draw(values))
    return args


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(args=argv())
def test_any_arguments_exit_0_1_or_2_without_a_traceback(args, tmp_path):
    (tmp_path / "bad.yaml").write_text("workload: [oops\n")
    (tmp_path / "nospace.yaml").write_text("just: a mapping\n")
    (tmp_path / "best.yaml").write_text("config: {batch_size: -3}\n")
    (tmp_path / "good.yaml").write_text(f"workload: {WORKLOADS}:tiny\n")
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as e:  # argparse: usage errors exit 2, --help 0
                code = e.code
    finally:
        os.chdir(cwd)
    assert code in (0, 1, 2), (args, code, err.getvalue())
    assert "Traceback" not in err.getvalue(), (args, err.getvalue())
    if code == 1:  # a user mistake: one line naming it
        assert len(err.getvalue().strip().splitlines()) == 1, (args, err.getvalue())


def test_a_valid_space_without_a_stored_study_gets_past_loading(tmp_path):
    """The fuzz's good.yaml reaches the storage: each study command says the space's
    default storage does not exist (exit 1, one line), which only a loaded space can say."""
    (tmp_path / "good.yaml").write_text(f"workload: {WORKLOADS}:tiny\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        # verify --json prints its progress on stderr: still one line (the fuzz found it)
        for command in (["show"], ["export"], ["verify"], ["verify", "--json"], ["report"]):
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                code = main([command[0], "good.yaml", *command[1:]])
            assert code == 1, (command, err.getvalue())
            said = err.getvalue()
            assert "storage 'sqlite:///autotune.db' does not exist" in said, (command, said)
            assert len(said.strip().splitlines()) == 1
    finally:
        os.chdir(cwd)
