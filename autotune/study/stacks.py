"""Where a trial hung or crashed: its Python stacks, read back from the trial's folder.

Every trial process enables :mod:`faulthandler` (``autotune.trial.__main__``): a fatal
signal (SIGSEGV, SIGABRT...) writes the stacks of all its threads to ``stacks-<pid>.log``
in the trial's folder, and so does ``trial_spec.STACKS_SIGNAL``, which the supervisor sends to
the trial's process group before it kills a trial that overran its timeout (a forked
DataLoader worker writes its own file). :func:`locate` finds, in those dumps, the
innermost frame of the user's code and the kind of process it ran in.
"""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..trial_spec import STACKS_GLOB

STACKS_WAIT_S = 1.0  # time the processes get to write their stacks before the kill

_HEAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_WORKER = "torch/utils/data/_utils/worker.py"


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def text(self) -> str:
        return f"{self.func} ({Path(self.file).name}:{self.line})"


def stacks(text: str) -> list[list[Frame]]:
    """Every thread's stack that faulthandler wrote into ``text``, innermost frame first."""
    out: list[list[Frame]] = []
    current: list[Frame] | None = None
    for line in text.splitlines():
        if _HEAD.match(line):
            current = []
            out.append(current)
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            current.append(Frame(m["file"], int(m["line"]), m["func"]))
        elif line.strip():
            current = None
    return [s for s in out if s]


def _library_roots(strict: bool) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], str(Path(__file__).resolve().parents[1])}
    if strict:  # installed packages too (torch, numpy...): the user's code is elsewhere
        roots |= {paths["purelib"], paths["platlib"]}
    else:  # the user's code may be an installed package: leave out torch only
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            roots.add(str(Path(spec.origin).parent))
    return tuple(str(Path(r).resolve()) for r in roots)


def _user(frame: Frame, roots: tuple[str, ...]) -> bool:
    if frame.file.startswith("<"):
        return False
    try:
        path = str(Path(frame.file).resolve())
    except OSError:
        path = frame.file
    return not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def locate(text: str) -> str | None:
    """``"_hang (faulty.py:44) in a DataLoader worker"``: the innermost frame of user code
    in the stacks of ``text`` and the process it ran in; ``None`` without such a frame."""
    found = stacks(text)
    for strict in (True, False):
        roots = _library_roots(strict)
        for stack in found:
            frame = next((f for f in stack if _user(f, roots)), None)
            if frame is not None:
                worker = any(_WORKER in f.file for f in stack)
                kind = "a DataLoader worker" if worker else "the trial process"
                return f"{frame.text()} in {kind}"
    return None


def read_location(folder: Path) -> str | None:
    """:func:`locate` over the ``stacks-<pid>.log`` files the trial's processes wrote in
    ``folder`` (one per process)."""
    texts = []
    for path in sorted(folder.glob(STACKS_GLOB)):
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            continue
    return locate("\n".join(texts))


def clear(folder: Path, *, empty_only: bool = False) -> None:
    """Remove the stack files of ``folder`` (before a run: an earlier run's; after: the
    empty ones of processes that neither crashed nor were asked)."""
    for path in folder.glob(STACKS_GLOB):
        try:
            if not empty_only or path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass
