"""The study's compile caches: one per config, seeded with the machine's ISA probe."""

from __future__ import annotations

from pathlib import Path

from autotune import Config
from autotune.space_file import load_space
from autotune.study.compile_cache import (
    SEEDED,
    compile_cache,
    compiled,
    keep_machine_probe,
    machine_probe,
    may_compile,
)


def _machine(runs, files=("5u/c5u.cpp", "5u/c5u.so", "locks/c5u.lock")):
    machine = runs / "compile-cache" / "machine"
    for rel in files:
        (machine / rel).parent.mkdir(parents=True, exist_ok=True)
        (machine / rel).write_text(rel)
    return machine


def test_a_seeded_cache_is_cold_until_its_config_compiles(tmp_path):
    runs = tmp_path / "runs"
    _machine(runs)
    config = Config(compile_mode="default")
    env, state = compile_cache(config, runs / "trial-0001")
    cache = runs / "compile-cache" / env["TORCHINDUCTOR_CACHE_DIR"].rsplit("/", 1)[1]
    assert state == "cold" and env["TORCHINDUCTOR_CACHE_DIR"] == str(cache.resolve())
    # the machine's files, without its locks, and the list of what was copied
    assert (cache / "5u" / "c5u.so").read_text() == "5u/c5u.so"
    assert not (cache / "locks").exists() and (cache / SEEDED).is_file()
    (cache / "locks").mkdir()
    (cache / "locks" / "graph.lock").write_text("")  # a lock is not a compiled artefact
    assert compile_cache(config, runs / "trial-0002")[1] == "cold"
    (cache / "fxgraph").mkdir()
    (cache / "fxgraph" / "entry").write_text("graph")  # what the config's compile wrote
    assert compiled(cache) and compile_cache(config, runs / "trial-0003")[1] == "warm"
    # another config gets its own cold cache; an eager config none
    assert compile_cache(Config(compile_mode="default", batch_size=64), runs / "t")[1] == "cold"
    assert compile_cache(Config(), runs / "t") == ({}, None)
    assert sorted(p.name for p in (runs / "compile-cache").iterdir() if "tmp" in p.name) == []


def test_without_the_machine_probe_a_cache_starts_empty(tmp_path):
    env, state = compile_cache(Config(compile_mode="default"), tmp_path / "runs" / "trial-0001")
    assert state == "cold"
    assert list((tmp_path / "runs" / "compile-cache").iterdir()) == [
        Path(env["TORCHINDUCTOR_CACHE_DIR"])
    ]


def test_the_machine_probe_runs_once_and_only_where_a_config_compiles(write_space, tmp_path):
    compiles = load_space(
        write_space("workload: {workloads}:tiny\nknobs: {compile_mode: ['off', default]}\n")
    )
    eager = load_space(write_space("workload: {workloads}:tiny\n", name="eager.yaml"))
    assert may_compile(compiles) and not may_compile(eager)
    probe_dir = tmp_path / "runs" / "probe"
    assert machine_probe(eager, probe_dir) is None
    tmp = machine_probe(compiles, probe_dir)
    assert tmp is not None and tmp.is_dir() and tmp.parent.name == "compile-cache"
    keep_machine_probe(tmp, ok=False)  # a failed probe leaves nothing
    assert not tmp.exists() and not (tmp.parent / "machine").exists()
    tmp = machine_probe(compiles, probe_dir)
    (tmp / "lib.so").write_text("")
    keep_machine_probe(tmp, ok=True)
    assert (tmp.parent / "machine" / "lib.so").is_file() and not tmp.exists()
    assert machine_probe(compiles, probe_dir) is None  # a resumed study finds it


def test_a_probe_that_built_nothing_is_not_the_machines_and_the_next_probe_runs(
    write_space, tmp_path
):
    """An empty probe folder published as ``compile-cache/machine`` would stop every later
    probe (the study would think it had found the ISA) and seed nothing."""
    space = load_space(
        write_space("workload: {workloads}:tiny\nknobs: {compile_mode: ['off', default]}\n")
    )
    probe_dir = tmp_path / "runs" / "probe"
    tmp = machine_probe(space, probe_dir)
    assert tmp is not None and list(tmp.iterdir()) == []
    keep_machine_probe(tmp, ok=True)  # the probe succeeded but built nothing
    assert not tmp.exists() and not (tmp.parent / "machine").exists()
    again = machine_probe(space, probe_dir)
    assert again is not None and again.is_dir()  # the next probe runs again
