"""Variable-length token data: autotune's collate, real-token counting, the layout knobs,
the longest-batch memory step and torch.compile's recompiles."""

from __future__ import annotations

import time

import pytest
import torch
from workloads import texts

from autotune import AutotuneError, Config, Tokens, Workload, load_space
from autotune.errors import WorkloadError
from autotune.study.runner import run_trial
from autotune.study.scoring import judge
from autotune.trial.apply import apply_workload
from autotune.trial.tokens import TokenCollate, grouped, spread_order


def test_collate_pads_to_the_longest_or_a_multiple_and_masks_the_labels():
    batch = TokenCollate(pad_id=0)([{"input_ids": [5, 6, 7]}, [8]])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, -100, -100]]
    wide = TokenCollate(pad_id=9, pad_to_multiple_of=8)([[1, 2, 3]])
    assert wide["input_ids"].tolist() == [[1, 2, 3] + [9] * 5]
    assert wide["labels"].tolist() == [[1, 2, 3] + [-100] * 5]


def test_grouping_sorts_each_mega_batch_and_keeps_its_samples():
    lengths = [5, 1, 9, 3, 7, 2, 8]
    out = list(grouped(iter(range(7)), lengths, mega=3))
    assert out == [2, 0, 1, 4, 3, 5, 6]  # [0,1,2] by length, then [3,4,5], then [6]


def test_grouped_steps_come_in_spread_order_so_a_window_ranges_over_the_lengths():
    assert spread_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert sorted(spread_order(50)) == list(range(50))
    lengths = list(range(1, 1001))  # a mega-batch of 50 steps of 20 samples
    out = list(grouped(iter(range(1000)), lengths, mega=1000, step=20))
    assert sorted(out) == list(range(1000))
    steps = [out[i : i + 20] for i in range(0, 1000, 20)]
    # each step holds samples of similar length (20 neighbours in the sort)
    assert all(max(lengths[i] for i in s) - min(lengths[i] for i in s) == 19 for s in steps)
    # a window of 15 steps after 3 warm-up steps: its mean length is the mega-batch's
    # (500), where the sorted order's window held the longest third (mean ~790)
    window = [lengths[i] for s in steps[3:18] for i in s]
    assert abs(sum(window) / len(window) - 500.5) < 60
    # a partial step stays last
    tail = list(grouped(iter(range(50)), lengths, mega=50, step=20))
    assert tail[-10:] == sorted(range(10), key=lambda i: -lengths[i])


def _run(config: dict, steps: int = 6):
    applied = apply_workload(Config(**config), texts(), device="cpu", endless=True)
    batches = iter(applied.loader)
    for _ in range(steps):
        applied.train_step(batches)
    return applied


def test_tokens_are_counted_without_padding_and_the_layout_knobs_change_only_padding():
    plain = _run({"batch_size": 8, "accumulation_steps": 2})
    padded = _run({"batch_size": 8, "accumulation_steps": 2, "pad_to_multiple_of": 64})
    # Same samples in the same order: the same real tokens, more positions when padded.
    assert plain.real_tokens == padded.real_tokens > 0
    assert padded.positions > plain.positions > plain.real_tokens
    small = _run({"batch_size": 4, "accumulation_steps": 4})
    assert small.real_tokens == plain.real_tokens  # the micro-batch split sees the same data
    group = _run({"batch_size": 8, "accumulation_steps": 2, "length_grouping": "grouped"})
    share = 1 - group.real_tokens / group.positions
    assert share < 0.5 * (1 - plain.real_tokens / plain.positions)  # far less padding


def test_grouped_steps_hold_the_same_samples_for_every_micro_batch_size():
    def step_samples(batch_size: int) -> list[set[tuple[int, ...]]]:
        config = Config(batch_size=batch_size, accumulation_steps=32 // batch_size)
        config = config.replace(length_grouping="grouped")
        applied = apply_workload(config, texts(), device="cpu", endless=True)
        batches = iter(applied.loader)
        steps = []
        for _ in range(3):
            rows = set()
            for _ in range(config.accumulation_steps):
                batch = next(batches)
                for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
                    rows.add(tuple(ids[mask.bool()].tolist()))
            steps.append(rows)
        return steps

    assert step_samples(8) == step_samples(16) == step_samples(32)


def test_a_workload_with_its_own_collate_keeps_it_and_pad_multiple_is_unsupported():
    from autotune.knobs import KNOBS, Capabilities

    caps = Capabilities(device="cpu", tokens=True, token_collate=False)
    assert "pads its batches itself" in KNOBS["pad_to_multiple_of"].unsupported(caps, 64)
    assert KNOBS["length_grouping"].unsupported(caps, "grouped") is None
    plain = Capabilities(device="cpu")
    assert "not token sequences" in KNOBS["length_grouping"].unsupported(plain, "grouped")
    # packing: dropped with a note for an own collate, an error when not declared
    own = Capabilities(device="cpu", tokens=True, token_collate=False, packing_undeclared="")
    assert "pads its batches itself" in KNOBS["packing"].unsupported(own, "packed")
    assert KNOBS["packing"].mistake(own, "packed") is None
    undeclared = Capabilities(
        device="cpu", tokens=True, token_collate=True, packing_undeclared="needs causal_lm"
    )
    assert KNOBS["packing"].mistake(undeclared, "packed") == "needs causal_lm"
    assert KNOBS["packing"].mistake(undeclared, "off") is None


def test_token_workload_mistakes_are_one_line_naming_the_field():
    with pytest.raises(WorkloadError, match=r"tokens.pad_id must be an integer >= 0 but got None"):
        Tokens(pad_id=None)
    with pytest.raises(WorkloadError, match="Workload.dataset must be a function"):
        Workload(model=lambda: None, dataset=[1, 2], loss=lambda m, b: 0)
    with pytest.raises(AutotuneError, match="pad_to_multiple_of must be an integer >= 1 but got 0"):
        Config(pad_to_multiple_of=0)


def test_a_trial_reports_real_tokens_per_second_and_padding(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:texts
        baseline: {batch_size: 8}
        trial: {warmup_steps: 1, measured_steps: 4}
    """)
    )
    m = run_trial(space, space.baseline, tmp_path / "t")
    assert m.ok, m.reason
    assert m.unit == "tokens" and m.tokens_per_s and m.tokens_per_step
    assert m.tokens_per_s == pytest.approx(m.tokens_per_step * m.measured_steps / m.window_s)
    assert m.tokens_per_step < 8 * 96  # real tokens only: below the padded width
    assert 0.2 < m.padding_share < 0.95
    # The untimed longest-batch step is timed on its own and named in the time split.
    assert m.longest_s and m.time_split()[0]["longest batch"] == m.longest_s
    assert m.peak_longest_bytes is not None and m.longest_batch_tokens == max(
        (8 + torch.rand(256, generator=torch.Generator().manual_seed(0)) ** 3 * 88).long().tolist()
    )


def test_the_longest_batch_step_puts_a_rare_long_sample_in_the_memory_verdict(
    write_space, tmp_path
):
    """1 sample in 500 is 27x longer; the window (seed 0, 48 samples) never draws one.
    Without the longest-batch step the config fits a budget between the two peaks; with
    it, it is over memory."""
    text = """
        workload: {workloads}:long_tail
        baseline: {batch_size: 8}
        trial: {warmup_steps: 1, measured_steps: 5, longest_batch: LONGEST,
                min_window_s: 0, min_warmup_s: 0}
    """
    without = load_space(write_space(text.replace("LONGEST", "false"), "a.yaml"))
    with_ = load_space(write_space(text.replace("LONGEST", "true"), "b.yaml"))
    m_without = run_trial(without, without.baseline, tmp_path / "without")
    m_with = run_trial(with_, with_.baseline, tmp_path / "with")
    assert m_without.ok and m_with.ok, (m_without.reason, m_with.reason)
    assert m_without.peak_longest_bytes is None and m_with.longest_batch_tokens == 1280
    # Untimed and without an optimizer step, its gradients dropped and the RNG state kept:
    # the loss trajectory is the one without it, step for step.
    assert len(m_with.losses) == 6 and m_with.losses == m_without.losses
    gap = m_with.peak_mem_bytes - m_without.peak_mem_bytes
    assert gap > 200 * 2**20, gap  # the (1280 x 1280) scores of 4 heads, 8 samples
    budget = (m_with.peak_mem_bytes + m_without.peak_mem_bytes) // 2
    assert judge(m_without, without, memory_budget_bytes=budget).status == "ok"
    assert judge(m_with, with_, memory_budget_bytes=budget).status == "over-memory"


def test_lengths_that_disagree_with_the_dataset_fail_the_probe(write_space, tmp_path):
    from autotune.study.runner import probe

    space = load_space(write_space("workload: {workloads}:wrong_lengths\n"))
    with pytest.raises(WorkloadError, match="tokens.lengths disagrees with the dataset"):
        probe(space, tmp_path / "probe")


def test_recompiles_are_counted_and_the_recompile_limit_fails_the_trial(
    eager_inductor, tmp_path, monkeypatch
):
    import torch._dynamo
    import torch._inductor.compile_fx as compile_fx
    from conftest import WORKLOADS

    fake = compile_fx.compile_fx  # eager_inductor's: the FX graph, no C++ build

    def slow(gm, example_inputs, **kwargs):  # a compile of known cost: 1.5 s a graph
        time.sleep(1.5)
        return fake(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx", slow)

    from autotune.trial.build import build
    from autotune.trial.loop import measure
    from autotune.trial.main import failure_reason
    from autotune.trial_spec import TrialSpec

    spec = TrialSpec(
        mode="trial",
        workload=f"{WORKLOADS}:texts",
        device="cpu",
        config=Config(batch_size=8, compile_mode="default", compile_dynamic="false"),
        warmup_steps=1,
        measured_steps=3,
        longest_batch=False,
    )
    m = measure(build(spec), started=time.perf_counter())
    assert m.graphs and m.recompiles and m.recompiles >= 2  # a new length, a new graph
    # The recompiles' time left the window: each recompile in it cost 1.5 s or more (the
    # slow compile above), three steps of this small model well under that; left in,
    # the window would be at least the recompile time.
    assert m.recompile_s is not None and m.recompile_s >= 1.5 * m.recompiles
    assert m.window_s < m.recompile_s / 2, (m.window_s, m.recompile_s)
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 2
    try:
        with pytest.raises(Exception) as failed:
            measure(build(spec), started=time.perf_counter())
        assert "recompile limit (2 graphs" in failure_reason(failed.value, spec)
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.config.fail_on_recompile_limit_hit = False


def test_packing_concatenates_samples_with_eos_into_rows_and_pads_only_the_last():
    from autotune.trial.tokens import CountWithout, PackCollate

    batch = PackCollate(pad_id=0, eos_id=9, pack_length=4)([[1, 2, 3], {"input_ids": [4, 5]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 9], [4, 5, 9, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["labels"].tolist() == [[1, 2, 3, 9], [4, 5, 9, -100]]
    assert CountWithout(9)(batch) == 5  # the samples' tokens, not the separators


def test_a_packed_step_holds_the_same_real_tokens_with_little_padding():
    def run(config: dict):
        applied = apply_workload(
            Config(**config), texts(causal_lm=True), device="cpu", endless=True
        )
        batches = iter(applied.loader)
        for _ in range(6):
            applied.train_step(batches)
        return applied

    plain = run({"batch_size": 8, "accumulation_steps": 2})
    packed = run({"batch_size": 8, "accumulation_steps": 2, "packing": "packed"})
    assert packed.real_tokens == plain.real_tokens  # the same samples in every step
    # positions: the real tokens, one EOS per sample (6 steps x 16), and padding only in
    # the last row of each of the 12 micro-batches
    assert packed.positions == packed.real_tokens + 6 * 16 + packed.padding
    assert 0 < packed.padding < 12 * 64
    assert packed.padding < plain.padding / 3


def test_packing_a_workload_without_a_causal_lm_loss_is_an_error_before_any_trial(
    write_space, tmp_path
):
    from conftest import run_cli

    space = write_space("""
        workload: {workloads}:texts
        knobs: {packing: ["off", packed]}
        trial: {warmup_steps: 1, measured_steps: 2}
    """)
    r = run_cli("run", str(space), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().endswith(
        "knobs.packing: packed cannot apply: packing needs Tokens(causal_lm=True, eos_id, "
        "pack_length): a per-token causal-LM loss"
    )
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "runs").glob("*/trial-*"))  # the probe ran, no trial did


def test_a_space_with_pad_to_multiple_of_0_names_the_knob():
    from autotune import SpaceError
    from autotune.space_file import parse_space

    with pytest.raises(SpaceError, match=r"knobs.pad_to_multiple_of: must be an integer >= 1"):
        parse_space({"workload": "m:f", "knobs": {"pad_to_multiple_of": [0, 8]}})
