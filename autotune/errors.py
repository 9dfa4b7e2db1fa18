"""The one exception root of autotune.

Every mistake a user can make (a bad space file, a workload that cannot be imported, a
storage URL that cannot be opened) is raised as an :class:`AutotuneError` subclass with a
one-line message; the CLI prints that line and exits 1.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose."""


class SpaceError(AutotuneError):
    """The space file is malformed or names something that does not exist.

    Several problems found in one file are gathered and reported together.
    """

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class WorkloadError(AutotuneError):
    """The workload reference cannot be loaded or its factories fail."""


class StorageError(AutotuneError):
    """The Optuna storage cannot be opened, or holds a study from another space."""


class ArgumentError(AutotuneError, ValueError):
    """An argument of a library call or of the command line is out of range, e.g.
    ``n_trials must be at least 1 but got 0``. Also a ``ValueError``."""


def first_line(exc: BaseException) -> str:
    """The informative start of an exception's message (compilers write pages).

    A first line that only introduces the next one (``backend='inductor' raised:``) is
    joined with it.
    """
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def yaml_problem(exc: BaseException) -> str:
    """A YAML parse error in one line: ``at line 3, column 7: expected ',' or ']'``."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or first_line(exc)
    return f"not valid YAML{where}: {problem}"


def make_folder(path, what: str):
    """``path`` (a ``pathlib.Path``) created with its parents, or an :class:`ArgumentError`
    naming ``what`` (``out``, the argument it came from) when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ArgumentError(f"{what}: cannot create the folder {path}: {e.strerror or e}") from None
    return path
