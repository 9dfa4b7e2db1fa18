from __future__ import annotations

import pytest
from conftest import ROOT

from autotune import AutotuneError, Config, SpaceError, load_space
from autotune.knobs import Capabilities
from autotune.space_file import parse_space


def test_valid_space_parses_with_sorted_ordinals_and_baseline_added(write_space):
    space = load_space(
        write_space("""
        workload: pkg.mod:build
        knobs:
          batch_size: [64, 16, 32]
          amp_dtype: [fp32, bf16]
          compile_mode: [off, default]
        baseline: {batch_size: 48}
        global_batch: free
        budget: {n_trials: 5}
    """)
    )
    # ordinal knobs are sorted, and the user's current batch size becomes a candidate
    assert space.knobs["batch_size"] == (16, 32, 48, 64)
    # YAML's bare `off` (read as False) is the "off" compile mode
    assert space.knobs["compile_mode"] == ("off", "default")
    assert space.baseline == Config(batch_size=48)
    assert space.study.name == "space"  # the file's stem
    assert set(space.searched) == {"batch_size", "amp_dtype", "compile_mode"}


def test_single_value_fixes_a_knob(write_space):
    space = load_space(
        write_space("""
        workload: m:f
        knobs: {batch_size: [8, 16], num_workers: 2}
        global_batch: free
    """)
    )
    assert "num_workers" not in space.searched
    assert space.baseline.num_workers == 2
    assert space.config_from({"batch_size": 16}) == Config(batch_size=16, num_workers=2)


def test_problems_are_gathered_and_name_file_and_key(write_space):
    path = write_space("""
        workload: m:f
        knobs:
          batch_sise: [8]
          amp_dtype: [fp32, fp8]
          num_workers: [-1]
          compile_mode: []
        trial: {measured_steps: 1}
        budget: {n_trials: 0}
        colour: blue
    """)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    problems = info.value.problems
    text = "\n".join(problems)
    assert all(p.startswith(str(path)) for p in problems)
    assert "knobs.batch_sise: unknown key (did you mean 'batch_size'?)" in text
    assert "knobs.amp_dtype: must be one of fp32, bf16, fp16 but got 'fp8'" in text
    assert "knobs.num_workers: must be an integer >= 0 but got -1" in text
    assert "knobs.compile_mode: must list at least one value" in text
    assert "trial.measured_steps: must be an integer >= 2 but got 1" in text
    assert "budget.n_trials: must be an integer >= 1 but got 0" in text
    assert "colour: unknown key" in text
    assert len(problems) == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workload: [1, 2\n", "not valid YAML at line 2"),
        ("- a\n- b\n", "must be a mapping at the top level but got list"),
        ("knobs: {}\n", "workload: is required"),
        ("workload: nocolon\n", "workload: must be 'module:function'"),
        ("workload: m:f\nbudget: {n_trials: null}\n", "otherwise the study never ends"),
        ("workload: m:f\nsearch: {sampler: magic}\n", "search.sampler: must be one of tpe"),
        (
            "workload: m:f\ntrial: {launcher: thread}\n",
            "trial.launcher: must be one of fork, spawn but got 'thread'",
        ),
        (
            "workload: m:f\nsearch: {min_gain: 1.5}\n",
            r"search.min_gain: must be a number in \[0, 1\)",
        ),
        (
            "workload: m:f\nsearch: {confirm_rounds: -1}\n",
            "search.confirm_rounds: must be an integer",
        ),
        ("workload: m:f\nsearch: {ablate: maybe}\n", "search.ablate: must be"),
        (
            "workload: m:f\nsearch: {confirm_rounds: 5, confirm_max_rounds: 4}\n",
            r"search.confirm_max_rounds: must be at least search.confirm_rounds \(5\) but got 4",
        ),
        ("workload: m:f\nsearch: {confirm_max_s: -1}\n", "search.confirm_max_s: must be"),
        ("workload: m:f\nsearch: {noise_runs: -1}\n", "search.noise_runs: must be an integer"),
        (
            "workload: m:f\ntrial: {planned_steps: 10, cost_per_hour: -2}\n",
            r"trial.cost_per_hour: must be a number >= 0 but got -2$",
        ),
        (
            "workload: m:f\ntrial: {planned_steps: 10, planned_tokens: 9}\n",
            "trial.planned_steps and trial.planned_tokens: at most one of planned_steps, "
            "planned_samples, planned_tokens may be set",
        ),
        ("workload: m:f\ntrial: {planned_samples: many}\n", "trial.planned_samples: must be an"),
        ("workload: m:f\ntrial: {planned_tokens: 0.5}\n", "trial.planned_tokens: must be an"),
        ("workload: m:f\ntrial: {cost_per_hour: 3 EUR}\n", "trial.cost_per_hour: must be a"),
        ("workload: m:f\ntrial: {cost_per_hour: .inf}\n", "trial.cost_per_hour: must be a"),
        (
            "workload: m:f\ntrial: {planned_steps: 10, energy_price_per_kwh: -0.3}\n",
            r"trial.energy_price_per_kwh: must be a number >= 0 but got -0.3$",
        ),
        (
            "workload: m:f\ntrial: {energy_price_per_kwh: 30 ct}\n",
            "trial.energy_price_per_kwh: must be a number",
        ),
        (
            "workload: m:f\ntrial: {objective: joules}\n",
            r"trial.objective: must be one of throughput, energy but got 'joules'$",
        ),
        (
            "workload: m:f\ntrial: {min_window_s: -1}\n",
            r"trial.min_window_s: must be a number >= 0 but got -1$",
        ),
        (
            "workload: m:f\ntrial: {min_warmup_s: soon}\n",
            r"trial.min_warmup_s: must be a number >= 0 but got 'soon'$",
        ),
    ],
)
def test_bad_files_give_one_clear_error(write_space, text, message):
    with pytest.raises(SpaceError, match=message):
        load_space(write_space(text))


def test_confirm_repeats_of_the_first_release_reads_as_confirm_rounds(write_space):
    space = load_space(write_space("workload: m:f\nsearch: {confirm_repeats: 2}\n"))
    assert space.search.confirm_rounds == 2
    assert "search.confirm_repeats is now search.confirm_rounds (paired rounds)" in space.notes


def test_missing_file_is_a_space_error(tmp_path):
    with pytest.raises(SpaceError, match="cannot read space file"):
        load_space(tmp_path / "nope.yaml")


def test_restrict_drops_what_cannot_run_here_with_notes():
    space = parse_space(
        {
            "workload": "m:f",
            "knobs": {
                "cudnn_benchmark": [False, True],
                "amp_dtype": ["fp32", "bf16", "fp16"],
                "compile_mode": ["off", "default", "reduce-overhead"],
                "gradient_checkpointing": [False, True],
                "num_workers": [0, 2, 8],
            },
        }
    )
    cpu = Capabilities(device="cpu", fp16=False, cpu_count=2, workload_blocks=0)
    restricted, notes = space.restrict(cpu)
    assert restricted.knobs["cudnn_benchmark"] == (False,)
    assert restricted.knobs["amp_dtype"] == ("fp32", "bf16")
    assert restricted.knobs["compile_mode"] == ("off", "default")
    assert restricted.knobs["gradient_checkpointing"] == (False,)
    assert restricted.knobs["num_workers"] == (0, 2)
    text = "\n".join(notes)
    assert "cudnn_benchmark=True dropped: has no effect without CUDA" in text
    assert "amp_dtype=fp16 dropped" in text
    assert "reduce-overhead dropped" in text
    assert "gradient_checkpointing=True dropped" in text
    assert "num_workers=8 dropped" in text
    cuda = Capabilities(device="cuda", cpu_count=16, workload_blocks=4)
    full, notes = space.restrict(cuda)
    assert full.knobs == space.knobs and notes == []


def test_fingerprint_changes_with_the_space_not_the_budget():
    a = parse_space({"workload": "m:f", "knobs": {"batch_size": [8, 16]}})
    b = parse_space(
        {"workload": "m:f", "knobs": {"batch_size": [8, 16]}, "budget": {"n_trials": 3}}
    )
    c = parse_space({"workload": "m:f", "knobs": {"batch_size": [8, 32]}})
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_the_cost_never_changes_the_fingerprint_a_planned_length_does_when_set():
    """A stored study stays comparable when only the price of an hour changes, or when
    autotune grows planned_samples; a planned length changes the objective. Would catch
    cost_per_hour hashed, or a new unset setting hashed as None."""

    def space(**trial):
        return parse_space({"workload": "m:f", "trial": trial})

    plain = space().fingerprint()
    assert space(cost_per_hour=12.5).fingerprint() == plain
    # how a run's process starts changes no measurement: a study resumes with either
    assert space(launcher="spawn").fingerprint() == space(launcher="fork").fingerprint() == plain
    assert space(planned_samples=None, planned_tokens=None).fingerprint() == plain
    assert space(planned_samples=1000).fingerprint() != plain
    assert space(planned_tokens=1000).fingerprint() != plain
    steps = space(planned_steps=1000).fingerprint()
    assert space(planned_steps=1000, cost_per_hour=3).fingerprint() == steps != plain


def test_the_energy_price_never_changes_the_fingerprint_the_energy_objective_does():
    """The price of a kWh changes no measurement; the objective changes every value, so a
    stored study cannot be resumed under the other one. Would catch the price hashed, or
    the objective left out of the fingerprint (or hashed at its default)."""

    def space(**trial):
        return parse_space({"workload": "m:f", "trial": trial})

    plain = space().fingerprint()
    assert space(energy_price_per_kwh=0.3).fingerprint() == plain
    assert space(objective="throughput").fingerprint() == plain
    assert space(objective="energy").fingerprint() != plain
    with_price = parse_space({"workload": "m:f", "trial": {"energy_price_per_kwh": 0.3}})
    assert any("no run's energy cost is projected" in n for n in with_price.notes)


def test_a_cost_without_a_planned_length_is_a_note():
    space = parse_space({"workload": "m:f", "trial": {"cost_per_hour": 3}})
    assert any("no run's cost is projected" in n for n in space.notes)
    planned = parse_space({"workload": "m:f", "trial": {"cost_per_hour": 3, "planned_steps": 9}})
    assert not planned.notes


def test_global_batch_defaults_to_the_baseline_and_fixes_the_split(write_space):
    space = load_space(
        write_space("""
        workload: m:f
        knobs: {batch_size: [8, 16, 24, 32, 64]}
        baseline: {batch_size: 16, accumulation_steps: 2}
    """)
    )
    assert space.global_batch == 32
    assert space.knobs["batch_size"] == (8, 16, 32)  # 24 and 64 do not divide 32
    assert any("batch_size 24, 64 dropped" in n for n in space.notes)
    assert space.config_from({"batch_size": 8}).accumulation_steps == 4
    assert space.baseline.global_batch == 32


def test_global_batch_free_searches_accumulation(write_space):
    space = load_space(
        write_space("""
        workload: m:f
        knobs: {batch_size: [8, 16], accumulation_steps: [1, 2]}
        global_batch: free
    """)
    )
    assert not space.fixed_batch and "accumulation_steps" in space.searched


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("knobs: {accumulation_steps: [1, 2]}\n", "knobs.accumulation_steps: is derived"),
        ("global_batch: 100\nbaseline: {batch_size: 32}\n", "32 does not divide global_batch 100"),
        ("global_batch: 0\n", "global_batch: must be an integer >= 1 or 'free'"),
        (
            "global_batch: 64\nbaseline: {batch_size: 16, accumulation_steps: 2}\n",
            "batch_size x accumulation_steps = 32 but global_batch is 64",
        ),
        ("limits: {memory: 2.5}\n", "limits.memory: must be a fraction in"),
        ("limits: {memory: lots}\n", "limits.memory: must be a fraction in"),
        ("limits: {accuracy: {tolerance: -1}}\n", "limits.accuracy.tolerance: must be a number"),
        ("limits: {accuracy: {tol: 1}}\n", "limits.accuracy.tol: unknown key"),
    ],
)
def test_bad_limits_and_batches(write_space, text, message):
    with pytest.raises(SpaceError, match=message):
        load_space(write_space("workload: m:f\n" + text))


def test_memory_limits_parse_sizes_and_fractions(write_space):
    from autotune.space_file import parse_memory

    assert parse_memory("512MiB") == 512 * 2**20
    assert parse_memory("6 GB") == 6 * 10**9
    assert parse_memory(0.5) == 0.5 and parse_memory(4096) == 4096
    space = load_space(write_space("workload: m:f\nlimits: {memory: 0.25, accuracy: off}\n"))
    assert space.limits.memory_bytes(8 * 2**30) == 2 * 2**30
    assert not space.limits.accuracy.enabled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "knobs: {compile_mode: default, jit: [off, script]}\n",
            r"knobs.jit: script can never apply: needs compile_mode off \(compile_mode is defaul",
        ),
        (
            "knobs: {prefetch_factor: [2, 4], persistent_workers: [false, true]}\n",
            r"knobs.prefetch_factor: 4 can never apply: needs num_workers > 0 \(num_workers is 0\)",
        ),
        (
            "knobs: {compile_fullgraph: [false, true]}\n",
            "knobs.compile_fullgraph: true can never apply: needs compile_mode other than off",
        ),
        (
            "knobs: {checkpoint_every: [1, 2]}\n",
            "knobs.checkpoint_every: 2 can never apply: needs gradient_checkpointing true",
        ),
        (
            "baseline: {jit: trace, gradient_checkpointing: true}\n",
            "baseline: jit=trace needs gradient_checkpointing false",
        ),
        (
            "knobs: {num_workers: [0, 2]}\nbaseline: {prefetch_factor: 4}\n",
            r"baseline: prefetch_factor=4 needs num_workers > 0 \(num_workers is 0\)",
        ),
        (
            "knobs: {world_size: [1, 2], batch_size: [8, 16]}\nglobal_batch: 32\n",
            r"baseline.batch_size: 32 \(the default\) x world_size 2 \(searched\) does not "
            "divide global_batch 32",
        ),
        (
            "knobs: {fsdp: [off, blocks]}\n",
            r"knobs.fsdp: blocks can never apply: needs world_size > 1 \(world_size is 1\)",
        ),
        (
            "knobs: {world_size: [1, 2], fsdp_reshard_after_forward: [true, false]}\n"
            "global_batch: free\n",
            "knobs.fsdp_reshard_after_forward: false can never apply: needs fsdp other than off",
        ),
        (
            "knobs: {world_size: 2, fsdp: blocks, ddp_static_graph: [false, true]}\n",
            r"knobs.ddp_static_graph: true can never apply: needs fsdp off \(fsdp is blocks\)",
        ),
        (
            "knobs: {world_size: 2, fsdp: root, amp_dtype: fp16, fsdp_param_dtype: [fp32, bf16]}\n",
            "knobs.fsdp_param_dtype: bf16 can never apply: needs amp_dtype other than fp16",
        ),
    ],
)
def test_invalid_combinations_are_rejected_naming_both_knobs(write_space, text, message):
    with pytest.raises(SpaceError, match=message):
        load_space(write_space("workload: m:f\n" + text))


def test_conditional_knobs_apply_only_where_their_condition_holds(write_space):
    space = load_space(
        write_space("""
        workload: m:f
        knobs:
          num_workers: [0, 2]
          prefetch_factor: 4              # fixed: applies whenever there are workers
          compile_mode: [off, default]
          compile_fullgraph: [false, true]
          jit: [off, script]
        global_batch: free
    """)
    )
    assert space.baseline.prefetch_factor == 2  # the baseline has no workers
    assert space.config_from({"num_workers": 2}).prefetch_factor == 4
    assert space.config_from({"num_workers": 0}).prefetch_factor == 2
    with pytest.raises(AutotuneError, match="jit=script needs compile_mode off"):
        space.config_from({"compile_mode": "default", "jit": "script"})


def test_restrict_fixes_knobs_whose_condition_can_no_longer_hold():
    space = parse_space(
        {
            "workload": "m:f",
            "knobs": {
                "compile_mode": ["off", "default"],
                "compile_dynamic": ["auto", "true", "false"],
                "compile_fullgraph": [False, True],
                "pin_memory": [False, True],
                "channels_last": [False, True],
                "sdpa_backend": ["auto", "math", "efficient", "flash"],
                "matmul_precision": ["highest", "high", "medium"],
                "optimizer_impl": ["default", "foreach", "fused"],
            },
            "baseline": {"compile_mode": "default", "compile_fullgraph": True},
        }
    )
    caps = Capabilities(
        device="cpu",
        compile=False,
        compile_reason="no C++ compiler",
        attention=True,
        sdpa_backends=("math", "flash"),
        matmul_precisions=("highest", "medium"),
        optimizer="RMSprop",
        optimizer_impls=("foreach",),
    )
    restricted, notes = space.restrict(caps)
    assert restricted.knobs["compile_mode"] == ("off",)
    assert restricted.knobs["compile_fullgraph"] == (False,)
    assert restricted.knobs["compile_dynamic"] == ("auto",)
    assert restricted.knobs["pin_memory"] == (False,)
    assert restricted.knobs["channels_last"] == (False,)
    assert restricted.knobs["sdpa_backend"] == ("auto", "math", "flash")
    assert restricted.knobs["matmul_precision"] == ("highest", "medium")
    assert restricted.knobs["optimizer_impl"] == ("default", "foreach")
    assert restricted.baseline == Config()
    text = "\n".join(notes)
    assert "compile_fullgraph fixed to False: needs compile_mode other than off" in text
    assert "baseline compile_fullgraph=True replaced by False: needs compile_mode" in text
    assert "sdpa_backend=efficient dropped: torch has no efficient attention kernel" in text
    assert "optimizer_impl=fused dropped: RMSprop has no fused implementation here" in text


def test_an_unsupported_baseline_value_becomes_a_remaining_candidate():
    space = parse_space(
        {
            "workload": "m:f",
            "knobs": {"num_workers": [2, 4], "persistent_workers": True},
            "baseline": {"num_workers": 4},
        }
    )
    restricted, notes = space.restrict(Capabilities(device="cpu", cpu_count=2))
    assert restricted.baseline == Config(num_workers=2, persistent_workers=True)
    assert "baseline num_workers=4 replaced by 2: more DataLoader workers" in "\n".join(notes)


def test_every_shipped_space_is_valid():
    from conftest import ROOT

    paths = sorted((ROOT / "search_spaces").glob("*.yaml"))
    assert {p.name for p in paths} >= {"cpu.yaml", "vision.yaml", "transformer.yaml"}
    for path in paths:
        text = path.read_text()
        assert text.startswith(f"# autotune run search_spaces/{path.name}\n"), path
        space = load_space(path)
        for name in space.knobs:  # every knob says what it trades
            line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{name}:"))
            assert "#" in line, f"{path.name}: {name} has no comment"


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "search_spaces").glob("*.yaml"))
    + sorted((ROOT / "benchmarks" / "spaces").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_shipped_spaces_are_valid(path):
    space = load_space(path)
    assert space.searched and space.study.name == path.stem


def test_fsdp_blocks_without_blocks_is_a_mistake_and_offload_needs_cuda():
    space = parse_space(
        {
            "workload": "m:f",
            "knobs": {
                "world_size": 2,
                "fsdp": ["off", "blocks"],
                "fsdp_cpu_offload": [False, True],
            },
        }
    )
    checkpointing_only = Capabilities(device="cpu", cpu_count=2, workload_blocks=1)
    with pytest.raises(
        SpaceError,
        match=r"knobs.fsdp: blocks cannot apply: the workload "
        r"exposes no blocks to shard one by one \(Workload.blocks\)",
    ):
        space.restrict(checkpointing_only)
    cpu = Capabilities(device="cpu", cpu_count=2, workload_blocks=2, shardable_blocks=2)
    restricted, notes = space.restrict(cpu)
    assert restricted.knobs["fsdp"] == ("off", "blocks")
    assert restricted.knobs["fsdp_cpu_offload"] == (False,)
    assert "fsdp_cpu_offload=True dropped: the parameters already live in host memory" in (
        "\n".join(notes)
    )
    cuda = Capabilities(device="cuda", gpu_count=2, cpu_count=8, shardable_blocks=2)
    assert space.restrict(cuda)[0].knobs["fsdp_cpu_offload"] == (False, True)
