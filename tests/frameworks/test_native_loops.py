"""Trials of a Trainer or a Lightning pair run the framework's own loop: ``Trainer.train()``
and ``Trainer.fit()`` with the exported arguments, timed at its optimizer steps."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from autotune.config import Config
from autotune.knobs import Capabilities
from autotune.space_file import load_space
from autotune.study.runner import probe, run_trial

pytest.importorskip("transformers")
pytest.importorskip("datasets")

TRAINERS = Path(__file__).parent / "trainers.py"
WARMUP, MEASURED = 2, 4


# The least steps only (no least time), so that a test knows each phase's steps.
STEPS_ONLY = "min_warmup_s: 0, min_window_s: 0"


def _space(
    tmp_path: Path, function: str, args: dict, knobs: str = "{}", times: str = STEPS_ONLY
) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(
        textwrap.dedent(f"""
        workload: {TRAINERS}:{function}
        workload_args: {json.dumps(args)}
        knobs: {knobs}
        trial: {{warmup_steps: {WARMUP}, measured_steps: {MEASURED}, timeout_s: 180, {times}}}
        """)
    )
    return path


def _trial(tmp_path: Path, function: str, args: dict, times: str = STEPS_ONLY, **values):
    """One trial of the workload ``function`` returns, at its own baseline and ``values``."""
    space = load_space(_space(tmp_path, function, args, times=times))
    baseline = {"batch_size": 16, "accumulation_steps": 2}
    if function == "make_pair":
        baseline = {"batch_size": 64, "accumulation_steps": 1}
    config = Config.from_dict({**space.baseline.to_dict(), **baseline, **values})
    return run_trial(space, config, tmp_path / f"trial-{len(list(tmp_path.iterdir()))}")


def test_a_trainer_trial_times_the_trainers_own_steps_with_clipping_and_its_schedule(tmp_path):
    record = tmp_path / "record.json"
    m = _trial(tmp_path, "make_trainer", {"record": str(record), "max_grad_norm": 0.01})
    assert m.ok, m.reason
    assert m.loop == "transformers"
    seen = json.loads(record.read_text())
    # the user's callback saw every step of the run, and the window is its last MEASURED
    assert seen["steps"] == WARMUP + MEASURED
    assert m.measured_steps == MEASURED and len(m.losses) == WARMUP + MEASURED
    # the Trainer's gradient clipping ran before each optimizer step ...
    assert max(seen["norms"]) <= 0.01 * 1.001
    # ... and its linear schedule decayed the rate step by step to zero at max_steps
    lrs = seen["lrs"]
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False)) and lrs[-1] == 0.0
    assert m.samples_per_step == 32 and m.unit == "tokens" and m.tokens_per_s > 0
    parts, _ = m.time_split()
    assert parts["framework set-up"] > 0 and parts["build"] > 0


def test_the_steps_loss_is_the_mean_whatever_the_split(tmp_path):
    """A sequence classifier's Trainer sums its micro-batches' means (transformers 5):
    the trial's loss per step is the mean, so splits compare for the accuracy guard."""
    split = _trial(tmp_path, "make_trainer", {"n": 192})
    whole = _trial(tmp_path, "make_trainer", {"n": 192}, batch_size=32, accumulation_steps=1)
    assert split.ok and whole.ok, (split.reason, whole.reason)
    assert split.losses[0] == pytest.approx(whole.losses[0], rel=0.02)
    assert split.losses[0] == pytest.approx(0.693, rel=0.1)  # two classes, random init


def test_a_bf16_trainer_trial_runs_where_the_trainer_runs(tmp_path):
    """bf16=True on the CPU is valid only with use_cpu=True in the same arguments."""
    m = _trial(tmp_path, "make_trainer", {"n": 128}, amp_dtype="bf16")
    assert m.ok, m.reason


def _hf_padding(steps: range, **trainer_args) -> float:
    """The padding share of ``steps`` optimizer steps as HF's own train loader batches
    them (its sampler, the same seed), built in this process."""
    import trainers
    import transformers

    trainer = trainers.make_trainer(**trainer_args)
    transformers.set_seed(trainer.args.seed)
    loader = trainer.get_train_dataloader()
    batches = iter(loader)
    per_step = trainer.args.gradient_accumulation_steps
    real = positions = 0
    for step in range(steps.stop):
        for _ in range(per_step):
            mask = next(batches)["attention_mask"]
            if step in steps:
                real, positions = real + int(mask.sum()), positions + mask.numel()
    return 1 - real / positions


def test_a_grouped_trial_pads_as_hfs_own_sampler_does(tmp_path):
    sys.path.insert(0, str(TRAINERS.parent))
    args = {"n": 512, "group_by_length": True}
    m = _trial(tmp_path, "make_trainer", args, length_grouping="grouped")
    assert m.ok, m.reason
    expected = _hf_padding(range(WARMUP, WARMUP + MEASURED), **args)
    assert m.padding_share == pytest.approx(expected, abs=1e-9)
    # and it is not the padding of the random order
    shuffled = _hf_padding(range(WARMUP, WARMUP + MEASURED), n=512)
    assert abs(shuffled - expected) > 0.05


def test_a_grouped_trial_is_rated_as_its_epoch_not_its_window(tmp_path):
    """A token trial in the Trainer's loop is rated as an epoch of the Trainer's own
    sampler (group_by_length: mega-batches each sorted longest first), its window's time
    scaled to the epoch's mean step (trial/epoch.py): its real tokens per step are the
    epoch's mean, every sample once over its 16 steps, not the window's few. The window
    lasts half a second: the fit needs 4 steps within 3x the median step, which a window
    of MEASURED (4) steps missed when one step was slow (the suite beside it, 2026-12-06)."""
    times = "min_warmup_s: 0, min_window_s: 0.5"
    args = {"n": 512, "group_by_length": True}
    space = load_space(_space(tmp_path, "make_trainer", args, times=times))
    values = {**space.baseline.to_dict(), "batch_size": 32, "accumulation_steps": 1}
    config = Config.from_dict({**values, "length_grouping": "grouped"})
    (tmp_path / "probe").mkdir()
    probe(space, tmp_path / "probe")  # every sample's length, as a study's trials read them
    lengths = json.loads((tmp_path / "probe" / "lengths.json").read_text())
    space = space.__class__(
        **{**space.__dict__, "lengths_path": str(tmp_path / "probe" / "lengths.json")}
    )
    m = run_trial(space, config, tmp_path / "grouped")
    assert m.ok, m.reason
    assert m.epoch_scale is not None and m.window_rate is not None
    assert m.tokens_per_step == pytest.approx(sum(lengths) / 16)


def test_a_trainer_whose_train_fails_is_a_failed_trial_naming_the_frames(tmp_path):
    m = _trial(tmp_path, "make_trainer", {"fail": True})
    assert m.status == "failed"
    assert m.reason.startswith("in Trainer.train(), transformers/trainer")
    assert "the user's callback broke" in m.reason


@pytest.mark.parametrize("function", ["make_trainer", "make_pair"])
def test_a_fast_step_framework_trials_window_lasts_its_least_time(tmp_path, function):
    """The tiny Trainer and pair take milliseconds a step: MEASURED steps are a window
    far under a second. With min_window_s the window goes on, in the framework's own
    loop, until it has taken that long, and the framework stops there: its own callback
    saw as many steps as the trial's warm-up and window ran. The warm-up covers
    min_warmup_s alike. (Before, a framework trial ran exactly its least steps: a
    Lightning pair at 20 ms a step was timed over 0.22 s.)"""
    if function == "make_pair":
        pytest.importorskip("lightning")
    record = tmp_path / "record.json"
    # Each least time must be well over one step, so that the least steps cannot cover it
    # (the Trainer's step takes up to ~60 ms on a slow 2-core machine, the pair's ~2 ms),
    # and under MAX_STEPS_FACTOR x the least steps, so that the cap does not stop it first.
    warmup_s, window_s = {"make_trainer": (0.3, 0.6), "make_pair": (0.05, 0.25)}[function]
    times = f"min_warmup_s: {warmup_s}, min_window_s: {window_s}"
    m = _trial(tmp_path, function, {"record": str(record)}, times=times)
    assert m.ok, m.reason
    assert m.window_s >= window_s and m.measured_steps > MEASURED
    assert m.warmup_s >= warmup_s
    seen = json.loads(record.read_text())["steps"]
    assert seen == len(m.losses) and seen > WARMUP + m.measured_steps  # the warm-up's too
    assert m.measured_steps <= MEASURED * 100  # never past MAX_STEPS_FACTOR


def test_a_lightning_trial_runs_fit_with_the_exported_arguments(tmp_path):
    pytest.importorskip("lightning")
    record = tmp_path / "record.json"
    whole = _trial(tmp_path, "make_pair", {"record": str(record)})
    assert whole.ok, whole.reason
    assert whole.loop == "lightning"
    assert json.loads(record.read_text()) == {"steps": WARMUP + MEASURED, "batches": 6}
    split = _trial(
        tmp_path, "make_pair", {"record": str(record)}, batch_size=32, accumulation_steps=2
    )
    # accumulate_grad_batches=2: twice the batches, the same steps and the same mean loss
    assert json.loads(record.read_text()) == {"steps": WARMUP + MEASURED, "batches": 12}
    assert split.losses[0] == pytest.approx(whole.losses[0], rel=1e-4)
    assert split.measured_steps == MEASURED and split.samples_per_step == 64


def test_a_knob_the_trainer_cannot_set_is_refused_by_validate(tmp_path):
    space = _space(tmp_path, "make_trainer", {"n": 64}, "{jit: ['off', script]}")
    out = run_cli("validate", str(space), cwd=tmp_path, timeout=300)
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if "knobs.jit" in line]
    assert lines == [
        f"autotune: error: {space}: knobs.jit: script cannot apply: the Trainer's loop has "
        "no setting for it (TrainingArguments has no such field)"
    ]


def test_the_space_refuses_what_the_framework_loop_cannot_set_and_nothing_else():
    space = load_space(ROOT / "search_spaces" / "hf_trainer.yaml")
    refused = {"jit": "no", "world_size": "one process", "optimizer_impl=foreach": "no"}
    caps = Capabilities(device="cpu", framework_refused=refused)
    assert space.framework_refusals(caps) == []  # its knobs are all the Trainer's
    searched = space.__class__(
        **{**space.__dict__, "knobs": {**space.knobs, "optimizer_impl": ("default", "fused")}}
    )
    assert searched.framework_refusals(caps) == []  # fused is a TrainingArguments value
    searched = space.__class__(
        **{**space.__dict__, "knobs": {**space.knobs, "optimizer_impl": ("default", "foreach")}}
    )
    assert [line.split(": ", 1)[1] for line in searched.framework_refusals(caps)] == [
        "knobs.optimizer_impl: foreach cannot apply: no"
    ]


def test_autotune_hf_and_lightning_work_after_a_plain_import():
    code = (
        "import autotune, transformers\n"
        "args = transformers.TrainingArguments(output_dir='x', report_to='none')\n"
        "new = autotune.hf.apply(args, {'batch_size': 4, 'accumulation_steps': 8})\n"
        "print(new.per_device_train_batch_size, new.gradient_accumulation_steps, "
        "callable(autotune.lightning.from_trainer))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["4", "8", "True"], out.stderr


def test_a_causal_lm_trainer_trial_weighs_its_micro_batches_by_their_tokens(tmp_path):
    """examples/hf_causal_lm.py: the Trainer divides each micro-batch's token sum by the
    step's tokens (num_items_in_batch), so 8 x 4 and 32 x 1 run the same step's loss; the
    tokens counted are the batches' real ones."""
    space = tmp_path / "lm.yaml"
    space.write_text(
        f"workload: {ROOT / 'examples' / 'hf_causal_lm.py'}:make_trainer\n"
        "workload_args: {n: 256, hidden: 32, layers: 1}\n"
        "knobs: {}\n"
        f"trial: {{warmup_steps: 1, measured_steps: 2, timeout_s: 180, {STEPS_ONLY}}}\n"
    )
    loaded = load_space(space)
    runs = {}
    for split in ((8, 4), (32, 1)):
        values = {**loaded.baseline.to_dict(), "batch_size": split[0]}
        config = Config.from_dict({**values, "accumulation_steps": split[1]})
        runs[split] = run_trial(loaded, config, tmp_path / f"t{split[0]}")
        assert runs[split].ok, runs[split].reason
    split, whole = runs[(8, 4)], runs[(32, 1)]
    assert split.losses == pytest.approx(whole.losses, rel=2e-3)
    assert split.unit == "tokens" and split.tokens_per_step == whole.tokens_per_step
    assert 8 * 32 <= split.tokens_per_step <= 256 * 32  # real tokens, 8 to 256 a sample
    assert split.padding_share > 0.3  # a random batch of texts of 8 to 256 tokens


def test_a_verify_run_trains_in_the_trainers_own_loop(tmp_path):
    """A run of ``autotune verify`` (``python -m autotune.trial.verify``), as the driver
    starts it for each round: the Trainer's own loop, for the verify's steps."""
    from autotune.study.verify import run_child
    from autotune.trial_spec import trial_spec

    record = tmp_path / "record.json"
    space = load_space(_space(tmp_path, "make_trainer", {"record": str(record), "n": 128}))
    spec = trial_spec(
        space,
        "verify",
        replace(space.baseline, batch_size=16, accumulation_steps=2),
        device="cpu",
        seed=0,
        warmup_steps=WARMUP,
        measured_steps=2 * MEASURED,
    )
    payload = run_child(spec, tmp_path / "run", 180)
    assert payload["status"] == "ok", payload.get("reason")
    assert payload["loop"] == "transformers" and payload["steps"] == 2 * MEASURED
    # the user's callback saw the verify run's steps: warm-up, then the timed ones
    assert json.loads(record.read_text())["steps"] == WARMUP + 2 * MEASURED
