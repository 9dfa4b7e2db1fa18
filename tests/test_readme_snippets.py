"""The README's Python snippets run as a user would paste them (issue 43).

Every fenced ``python`` block of the README and of the ``docs/`` pages its depth moved to
(issue 40), and every inline statement of the form
``name = autotune.something(...)``, runs in a fresh interpreter (so that nothing another
test imported, ``autotune.hf`` above all, is there already) after a plain
``import autotune``. What a snippet leaves to the reader is filled in with small real
objects (:data:`USER`): ``MyModel``, ``my_tokenized``, a ``trainer``'s arguments, a
``best_config.yaml`` written by the test where a snippet loads one. None of them needs a
study. A snippet that defines ``workload()`` has it called; ``run`` must have trained;
``args`` must carry the stored config.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

README = ROOT / "README.md"
# The README and the docs/ pages that took its depth (issue 40): their snippets run too.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
STATEMENT = re.compile(r"`(\w+ = autotune\.[^`]*)`")
CONFIG = "autotune-runs/cpu/best_config.yaml"  # where the README's snippets load it from

# The reader's own objects the snippets name, as small real ones; autotune is imported
# plainly first, as a user's script does (nothing here imports autotune.hf).
USER = textwrap.dedent(
    """
    import autotune
    import math
    import torch

    class MyModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))

        def forward(self, x):
            return self.layers(x)

    def MyDataset():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(128, 8, generator=g)  # 4 steps of 32: n_steps fit in one epoch
        return torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long())

    model, dataset, n_steps = MyModel(), MyDataset(), 3
    loss_fn = lambda model, batch: torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
    make_opt = lambda params: torch.optim.SGD(params, lr=0.1)
    my_tokenized = my_tokenized_dataset = [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6]}]
    causal_lm_loss = lambda model, batch: model(**batch).loss
    """
)
TRAINER = textwrap.dedent(
    """
    import transformers
    trainer = transformers.TrainingArguments("out", use_cpu=True, report_to="none")
    """
)
# What each snippet asserts once it ran, for the names it defined.
CHECK = textwrap.dedent(
    """
    if "workload" in dir() and callable(workload):
        assert isinstance(workload(), autotune.Workload)
    if "run" in dir():
        assert math.isfinite(float(loss)), loss
    if "args" in dir():
        assert args.per_device_train_batch_size == 16, args.per_device_train_batch_size
    print("snippet ran")
    """
)
# The reader's "..." where the snippet's own text cannot run as written.
FILLED = {
    "model=...,": "model=MyModel,",
    "autotune.load_config(...)": f"autotune.load_config({CONFIG!r})",
}


def snippets() -> list[tuple[str, str]]:
    """(where, code) of each snippet of :data:`PAGES`: the fenced blocks and inline
    statements."""
    found = []
    for page in PAGES:
        text, name = page.read_text(), page.relative_to(ROOT)
        line = lambda pos, text=text: text.count("\n", 0, pos) + 1  # noqa: E731
        found += [(f"{name}:{line(m.start())}", m.group(1)) for m in BLOCK.finditer(text)]
        found += [(f"{name}:{line(m.start())}", m.group(1)) for m in STATEMENT.finditer(text)]
    return found


def test_the_readme_has_the_snippets_this_file_runs():
    codes = [code for _, code in snippets()]
    assert len(codes) >= 5
    readme = [code for where, code in snippets() if where.startswith("README.md:")]
    assert any("autotune.hf.apply(trainer" in c for c in readme)
    assert any("autotune.apply(" in c and "load_config(" in c for c in readme)
    assert any("autotune.Tokens(" in c for c in codes)  # moved to docs/workload.md


@pytest.mark.parametrize(("where", "code"), snippets(), ids=[w for w, _ in snippets()])
def test_a_readme_snippet_runs_after_a_plain_import_autotune(where, code, tmp_path):
    for shown, filled in FILLED.items():
        code = code.replace(shown, filled)
    config = tmp_path / CONFIG
    config.parent.mkdir(parents=True)
    config.write_text("config: {batch_size: 16, accumulation_steps: 2}\n")
    script = USER + (TRAINER if "trainer" in code else "") + "\n" + code + "\n" + CHECK
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "snippet ran" in done.stdout, (
        f"{where}:\n{code}\n{done.stderr[-2000:]}"
    )
