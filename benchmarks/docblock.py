"""Benchmark output as a block of a document: rerunning a benchmark refreshes its figures.

A benchmark that prints figures a document quotes writes them (with ``--doc FILE``)
between two markers in that document::

    <!-- fake_memory.py: begin -->
    ... the command, date and machine, then the printed lines ...
    <!-- fake_memory.py: end -->

The first run appends the block; later runs replace what lies between the markers. The
text around it (the reading of the figures) stays the author's.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path


def machine_text() -> str:
    """This machine in a few words: CPU model, cores, and whether it has bf16 units
    (bf16 autocast is fast with them, many times slower without)."""
    model, flags = platform.processor() or "?", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = value
    except OSError:
        pass
    bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    return f"{model}, {os.cpu_count()} cores, {'with' if bf16 else 'no'} bf16 units"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def spliced(document: str, name: str, block: str) -> str:
    """``document`` with its block ``name`` replaced by ``block`` (appended if none);
    ``block`` includes its markers."""
    begin, end = markers(name)
    if begin in document and end in document:
        head, _, rest = document.partition(begin)
        _, _, tail = rest.partition(end)
        return head + block + tail
    return (document.rstrip("\n") + "\n\n" if document else "") + block + "\n"


def write(doc: Path, name: str, lines: list[str], command: str) -> None:
    """Put ``lines`` (a benchmark's output) into ``doc`` as the block ``name``, under the
    command that printed them, today's date and this machine."""
    begin, end = markers(name)
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    block = "\n".join(
        [
            begin,
            f"Printed by `{command}` on {today}, {machine_text()} (this block is written by "
            "that command with `--doc`):",
            "",
            "```",
            *lines,
            "```",
            end,
        ]
    )
    doc.write_text(spliced(doc.read_text() if doc.exists() else "", name, block))


@contextlib.contextmanager
def recording(doc: Path | None, name: str, argv: list[str] | None = None) -> Iterator[None]:
    """Print as usual; with ``doc``, also write what was printed into ``doc`` as the block
    ``name`` once the body finished without an error, under the command ``argv`` (default
    ``sys.argv``) without its ``--doc FILE``."""
    if doc is None:
        yield
        return
    captured = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, text: str) -> int:
            captured.write(text)
            return sys.__stdout__.write(text)

        def flush(self) -> None:
            sys.__stdout__.flush()

    with contextlib.redirect_stdout(Tee()):
        yield
    kept, skip = [], False
    for arg in argv or sys.argv:  # the command without its --doc FILE
        if skip or arg == "--doc":
            skip = arg == "--doc"
            continue
        kept.append(arg)
    command = "python " + " ".join(shlex.quote(a) for a in [_relative(kept[0]), *kept[1:]])
    write(doc, name, captured.getvalue().rstrip("\n").splitlines(), command)


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def run(main: Callable[[], int | None], name: str) -> int:
    """Run a benchmark's ``main`` with ``--doc FILE`` taken off the command line: with it,
    what ``main`` prints becomes the block ``name`` of FILE (:func:`recording`)."""
    doc = None
    if "--doc" in sys.argv:
        i = sys.argv.index("--doc")
        if i + 1 >= len(sys.argv):
            sys.exit("--doc needs a file: the document whose block this run writes")
        doc = Path(sys.argv[i + 1])
        command_line = list(sys.argv)
        del sys.argv[i : i + 2]
    with recording(doc, name, command_line if doc else None):
        code = main()
    return int(code or 0)
