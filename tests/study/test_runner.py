"""One real trial in a real subprocess."""

from __future__ import annotations

from autotune import Config, load_space
from autotune.study.runner import probe, run_trial
from autotune.study.scoring import objective, rate_objective
from autotune.study.storage import records


def test_one_trial_is_measured_in_a_subprocess(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        knobs: {batch_size: [16]}
        trial: {warmup_steps: 2, measured_steps: 6, timeout_s: 120,
                min_window_s: 0, min_warmup_s: 0}
    """)
    )
    m = run_trial(space, Config(batch_size=16, accumulation_steps=2), tmp_path / "t0")
    assert m.ok, m.reason
    assert m.samples_per_step == 32 and m.measured_steps == 6
    assert m.samples_per_s > 0 and m.window_s > 0
    # throughput is the window's: steps x samples per step / window time
    assert abs(m.samples_per_s - 6 * 32 / m.window_s) < 1e-6 * m.samples_per_s
    assert m.step_time_median_s > 0 and m.step_time_cv >= 0
    assert m.warmup_s > 0 and m.startup_s > 0
    assert m.compile_s is None and m.compile_cache is None  # an eager config compiles nothing
    assert m.mem_kind == "cpu_rss" and m.peak_mem_bytes > 50 * 2**20  # torch alone is more
    assert len(m.losses) == 8  # warm-up and measured steps
    for name in ("spec.json", "result.json", "stdout.log", "stderr.log"):
        assert (tmp_path / "t0" / name).exists()
    # Where its time went: every phase recorded, and they add up to spawn-to-exit.
    parts, total = m.time_split()
    assert list(parts) == [
        "process start",
        "imports",
        "device",
        "build",
        "warm-up",
        "compile",
        "timed",
        "result and exit",
        "other",
    ]
    assert all(v >= 0 for v in parts.values()) and abs(sum(parts.values()) - total) < 1e-9
    assert m.process_start_s > 0 and m.import_s > 0 and m.build_s > 0 and m.exit_s > 0
    assert parts["timed"] == m.window_s and total > m.wall_s
    # the imports and the build come before the first step (startup_s)
    assert m.import_s + m.device_init_s + m.build_s <= m.startup_s


def test_same_config_and_seed_give_the_same_losses(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        trial: {min_window_s: 0, min_warmup_s: 0, warmup_steps: 1, measured_steps: 3}
    """)
    )
    a = run_trial(space, Config(batch_size=16, accumulation_steps=2), tmp_path / "a")
    b = run_trial(space, Config(batch_size=32, num_workers=1), tmp_path / "b")
    # same global batch, seed and sample order: the same trajectory up to float rounding
    assert all(abs(x - y) < 1e-4 for x, y in zip(a.losses, b.losses, strict=True))


def test_probe_reports_capabilities_and_environment(write_space, tmp_path):
    space = load_space(write_space("workload: {workloads}:tiny\n"))
    result = probe(space, tmp_path / "probe")
    caps, env = result["capabilities"], result["environment"]
    assert caps["device"] == "cpu" and caps["workload_blocks"] == 2
    assert not caps["conv2d"] and not caps["attention"] and caps["optimizer"] == "SGD"
    assert "math" in caps["sdpa_backends"] and caps["matmul_precisions"][0] == "highest"
    assert env["torch"] and env["cpu_count"] >= 1 and env["device_memory_bytes"] > 0
    assert result["workload"]["dataset_len"] == 512
    # a space that never compiles leaves inductor's vector-ISA probe alone
    assert "cpu_vec_isa" not in env and not (tmp_path / "compile-cache").exists()


def test_records_is_empty_for_a_fresh_study():
    import optuna

    assert records(optuna.create_study()) == []


def test_threads_are_set_before_the_workload_is_built(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:expects_threads
        workload_args: {threads: 1, interop: 1}
        trial: {warmup_steps: 1, measured_steps: 2}
    """)
    )
    m = run_trial(space, Config(num_threads=1, interop_threads=1), tmp_path / "t")
    assert m.ok, m.reason
    wrong = run_trial(space, Config(), tmp_path / "default")
    assert wrong.status == "failed" and "expected (1, 1)" in wrong.reason


def test_compiler_failures_are_recorded_with_a_readable_reason(write_space, tmp_path):
    def trial(workload, config):
        space = load_space(
            write_space(f"workload: {{workloads}}:{workload}\ntrial: {{measured_steps: 2}}\n")
        )
        return run_trial(space, config, tmp_path / workload)

    m = trial("graph_break", Config(compile_mode="default", compile_fullgraph=True))
    assert m.status == "failed"
    assert m.reason.startswith(
        "torch.compile (compile_mode=default compile_fullgraph=true) failed: Unsupported: "
    )
    assert "graph_break()" in m.reason
    m = trial("unscriptable", Config(jit="script"))
    assert m.status == "failed" and m.reason.startswith("jit=script: torch.jit.script failed: ")
    m = trial("tiny_attention", Config(sdpa_backend="efficient"))  # no such kernel on CPU
    assert m.status == "failed"
    assert m.reason.startswith("sdpa_backend=efficient: torch has no such attention kernel")


def test_each_compiled_config_compiles_cold_once_in_its_own_cache(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        global_batch: 32
        knobs: {compile_mode: ["off", default]}
        trial: {warmup_steps: 2, measured_steps: 3, planned_steps: 100}
    """)
    )
    a = Config(batch_size=16, accumulation_steps=2, compile_mode="default")
    b = Config(batch_size=32, compile_mode="default")
    runs = tmp_path / "runs"
    # The probe finds the machine's vector ISA as inductor does, once for every config:
    # it builds inductor's ISA test libraries, which each config's cache starts with.
    env = probe(space, runs / "probe")["environment"]
    machine = runs / "compile-cache" / "machine"
    libraries = {p.relative_to(machine): p.stat().st_mtime_ns for p in machine.rglob("*.so")}
    assert libraries and env["cpu_vec_isa"] and not env["cpu_vec_isa"].startswith("unknown")
    assert [p.name for p in (runs / "compile-cache").iterdir()] == ["machine"]  # no .tmp left
    first_a = run_trial(space, a, runs / "trial-0001")
    first_b = run_trial(space, b, runs / "trial-0002")  # after a: still a cold compile
    again_b = run_trial(space, b, runs / "trial-0003")
    eager = run_trial(space, Config(batch_size=32), runs / "trial-0004")
    for m in (first_a, first_b, again_b, eager):
        assert m.ok, m.reason
    assert (first_a.compile_cache, first_b.compile_cache, again_b.compile_cache) == (
        "cold",
        "cold",
        "warm",
    )
    caches = sorted(p for p in (runs / "compile-cache").iterdir() if p.name != "machine")
    assert len(caches) == 2 and all(any(c.iterdir()) for c in caches)  # one per config
    for cache in caches:  # what a warm repeat reuses: compiled graphs and joint graphs
        assert {"fxgraph", "aotautograd"} <= {p.name for p in cache.iterdir()}, cache
        # the ISA test libraries were copied in and used as they were, never rebuilt
        for rel, mtime in libraries.items():
            assert (cache / rel).stat().st_mtime_ns == mtime, (cache, rel)
    # torch.compile's own counters; an eager config compiles nothing.
    assert all(m.compile_s > 0 for m in (first_a, first_b, again_b))
    assert eager.compile_s is None and eager.compile_cache is None
    # The planned run of a warm repeat is charged the config's cold compile.
    cold = objective(again_b, space.trial, cold_compile_s=first_b.compile_s)
    expected = rate_objective(again_b.rate, first_b.compile_s, again_b.per_step, space.trial)
    assert cold == expected < again_b.rate
    assert objective(first_b, space.trial, cold_compile_s=123.0) == rate_objective(
        first_b.rate, first_b.compile_s, first_b.per_step, space.trial
    )  # a cold run keeps its own figure
