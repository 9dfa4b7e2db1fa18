"""``autotune validate`` builds the workload: each mistake of ``tests/broken.py`` gives a
line naming the field and what was expected. The build check runs in-process here
(:func:`autotune.trial.check.check`, what the subprocess runs), and through the CLI for a
few cases end to end."""

from __future__ import annotations

import pytest
from conftest import HERE

from autotune.cli import main
from autotune.errors import WorkloadError
from autotune.trial.check import check
from autotune.trial_spec import TrialSpec

BROKEN = HERE / "broken.py"

# mistake -> what its line says (the field, and what was expected or what went wrong)
EXPECTED = {
    "returns_dict": "must return autotune.Workload but returned dict",
    "dataset_instance": (
        "Workload.dataset must be a function (a factory) but got a Blobs; "
        "pass a function that builds it: dataset=lambda: Blobs(...)"
    ),
    "criterion": (
        "Workload.loss is a CrossEntropyLoss criterion but autotune calls loss(model, batch)"
    ),
    "model_instance": (
        "Workload.model must build the model (each trial builds its own) but got a MLP instance"
    ),
    "optimizer_instance": (
        "Workload.optimizer must build the optimizer over the params it is given but got "
        "a SGD instance"
    ),
    "unknown_framework": (
        "Workload.framework must be one of 'transformers', 'lightning' or None but got 'keras'"
    ),
    "loss_one_argument": "Workload.loss(model, batch): autotune calls it so, but it takes (batch)",
    "functional_criterion": (
        "must be Tensor, not MLP; the batch was a list of (tensor [8, 16] float32, tensor "
        "[8] int64) (a criterion? autotune calls loss(model, batch)"
    ),
    "model_with_arguments": "Workload.model(): autotune calls it so, but it takes (hidden)",
    "model_not_module": "Workload.model() returned dict; expected a torch.nn.Module",
    "blocks_not_modules": (
        "Workload.blocks(model)[0] is a str; expected a torch.nn.Module of the model"
    ),
    "blocks_of_another_model": (
        "Workload.blocks(model)[0] (Sequential) is not a module of the model"
    ),
    "iterable_dataset": "Workload.dataset() returned Stream, not a map-style dataset",
    "tiny_dataset": (
        "Workload.dataset() has 4 samples, fewer than the smallest batch_size of the space (8)"
    ),
    "batch_loss_cannot_take": (
        "Workload.loss(model, batch) raised TypeError: list indices must be integers"
    ),
    "loss_not_scalar": (
        "Workload.loss(model, batch) returned a tensor of shape [8]; expected a scalar"
    ),
    "loss_detached": "Workload.loss(model, batch) returned a tensor with no gradient",
    "optimizer_returns_list": (
        "Workload.optimizer(params) returned list; expected a torch.optim.Optimizer"
    ),
}


def _spec(mistake: str) -> TrialSpec:
    return TrialSpec(
        mode="check", workload=f"{BROKEN}:broken", workload_args={"mistake": mistake}, batch_size=8
    )


@pytest.mark.parametrize("mistake", sorted(EXPECTED))
def test_each_mistake_is_one_line_naming_the_field(mistake):
    try:
        problems = check(_spec(mistake))["problems"]
    except WorkloadError as e:  # the workload cannot be loaded: the trial's reason
        problems = [str(e)]
    assert len(problems) == 1, problems
    assert EXPECTED[mistake] in problems[0]
    assert "\n" not in problems[0]


def test_a_right_workload_has_no_problem_and_the_facts_of_its_step():
    result = check(_spec("none"))
    assert result["problems"] == []
    facts = result["facts"]
    assert (facts["model"], facts["dataset"], facts["samples"], facts["blocks"]) == (
        "MLP",
        "Blobs",
        512,
        2,
    )
    assert facts["batch"] == "a list of (tensor [8, 16] float32, tensor [8] int64)"
    assert 0.1 < facts["loss"] < 5


SPACE = """
    workload: {broken}:broken
    workload_args: {{mistake: {mistake}}}
    knobs: {{batch_size: [16, 8]}}
"""


def test_validate_names_a_bad_window_time_in_one_line(tmp_path, capsys):
    """The window's minimum time (docs/window.md): a number >= 0, else one line naming
    the field, exit 1, before anything is built."""
    path = tmp_path / "space.yaml"
    path.write_text("workload: m:f\ntrial: {min_window_s: -0.5, min_warmup_s: 0}\n")
    assert main(["validate", "--no-build", str(path)]) == 1
    err = capsys.readouterr().err
    assert "trial.min_window_s: must be a number >= 0 but got -0.5" in err
    assert err.count("\n") == 1 and "Traceback" not in err and "min_warmup_s" not in err


def test_validate_builds_in_a_subprocess_and_exits_1_on_a_mistake(tmp_path, capsys):
    """The CLI end to end: the check runs in a trial subprocess (the driver never imports
    the workload); ``--no-build`` checks the file only."""
    for mistake, rc in [("none", 0), ("criterion", 1), ("batch_loss_cannot_take", 1)]:
        path = tmp_path / f"{mistake}.yaml"
        path.write_text(SPACE.format(broken=BROKEN, mistake=mistake))
        assert main(["validate", str(path)]) == rc, mistake
        out, err = capsys.readouterr()
        assert "the space file is valid" in out
        if rc:
            assert err.count("\n") == 1 and err.startswith("autotune: error: ")
            assert EXPECTED[mistake] in err
        else:
            assert "one fp32 step: batch a list of (tensor [8, 16] float32" in out
        assert main(["validate", "--no-build", str(path)]) == 0
        assert capsys.readouterr().out.count("\n") == 1
    # nothing written beside the space files (the check's folder is a temporary one)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "batch_loss_cannot_take.yaml",
        "criterion.yaml",
        "none.yaml",
    ]
