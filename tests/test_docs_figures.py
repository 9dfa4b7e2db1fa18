"""Every figure block of the README and docs/ names the command that produced it.

A *figure block* is a markdown table with a measured figure in a body row (a number with
a unit: ``1.57x``, ``12.3 s``, ``631 MiB``, ``4%``, ``1,234 samples/s``...). Between the
section's heading and the table there must be a command a reader can rerun: in backticks
or a fenced block, starting with ``python``, ``autotune``, ``pytest``, ``bash`` or
``benchmarks/``. Tables of settings and knobs carry no such figures and are not checked;
a table of figures that are not measurements (a worked example's arithmetic, a command's
``10x`` default, a mapping) says so with ``<!-- not measured: why -->`` right above it.

The exemption is for arithmetic and mappings only. A table under it whose body holds a
figure that only a run gives fails: a speedup with decimals (``1.74x``) or a signed
percentage (``-5.1%``, ``+2.5%``: an error against a prediction). Worked examples keep
to round inputs; measured tables name their command instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(\.\d+)?\s?(x|s|ms|MiB|GiB|%|samples/s|tokens/s)(?![\w/])")
COMMAND = re.compile(r"^\s*(\$ )?(python3?|autotune|pytest|bash|benchmarks/)\S*\s")
INLINE = re.compile(r"`(python3?|autotune|pytest|bash|benchmarks/)[^`]*`")
# What only a run gives: a speedup with decimals, a signed percentage (an error).
MEASURED = re.compile(r"(?<![\w.])\d+\.\d+x(?!\w)|(?<![\w.])[+\-\u2212]\d+(\.\d+)?%")
EXEMPT = "<!-- not measured:"


def figure_blocks_without_a_command(text: str) -> list[int]:
    """Line numbers (1-based) of the figure tables of ``text`` with no command between
    their section's heading and themselves, and of the tables under the "not measured"
    exemption that hold measured figures (:data:`MEASURED`)."""
    lines = text.splitlines()
    missing, i, fenced = [], 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        body = lines[start + 2 : i]  # past the header and the --- row
        if not any(FIGURE.search(row) for row in body):
            continue
        if start > 0 and lines[start - 1].startswith(EXEMPT):
            if any(MEASURED.search(row) for row in body):
                missing.append(start + 1)  # measured figures under the exemption
            continue
        above, inside = [], False
        for j in range(start - 1, -1, -1):
            if lines[j].startswith("#") and not inside:
                break
            if lines[j].startswith("```"):
                inside = not inside
            above.append(lines[j])
        if not any(INLINE.search(a) or COMMAND.match(a) for a in above):
            missing.append(start + 1)
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_figure_block_names_its_command(doc):
    missing = figure_blocks_without_a_command(doc.read_text())
    assert not missing, (
        f"{doc.name}: figure tables without a command above, or measured figures under "
        f"the not-measured exemption, lines {missing}"
    )


def test_a_planted_figure_block_without_a_command_fails():
    table = "| a | b |\n| --- | --- |\n| c | 1.5x |\n"
    good = "## Speed\n\n```bash\npython benchmarks/x.py\n```\n\n" + table
    planted = "## Speed\n\nMeasured by hand.\n\n" + table
    said = "## Example\n\n<!-- not measured: arithmetic -->\n" + table.replace("1.5x", "2x")
    assert figure_blocks_without_a_command(said) == []
    settings = "## Knobs\n\n| knob | values |\n| --- | --- |\n| `batch_size` | 8, 16 |\n"
    assert figure_blocks_without_a_command(good) == []
    assert figure_blocks_without_a_command(planted) == [5]
    assert figure_blocks_without_a_command(settings) == []


@pytest.mark.parametrize(
    "row",
    [
        "| verify | 1.738x | 1.65x (-5.06%) |",  # a measured speedup and its error
        "| verify | 2 runs | +2.5% |",
        "| study | 4.02x | 3 runs |",
    ],
)
def test_a_measured_table_under_the_exemption_fails(row):
    """ "Not measured" is for arithmetic and mappings: a table of measured speedups or
    errors under it fails, even with its command above; round arithmetic passes."""
    header = "## Verify\n\n```bash\nautotune verify space.yaml\n```\n\n"
    table = "| a | b | c |\n| --- | --- | --- |\n" + row + "\n"
    exempt = header + "<!-- not measured: what those commands printed -->\n" + table
    assert figure_blocks_without_a_command(exempt) == [8]
    assert figure_blocks_without_a_command(header + table) == []  # its command is enough
    arithmetic = "| baseline | 320 samples/s | 0.1 s |\n| compiled | 640 samples/s | 2x |\n"
    worked = "## Example\n\n<!-- not measured: arithmetic -->\n| a | b | c |\n| --- | --- | --- |\n"
    assert figure_blocks_without_a_command(worked + arithmetic) == []
