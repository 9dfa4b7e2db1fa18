"""The package's layers (docs/architecture.md): what may import what.

values (knobs, config, space, ...: each listed in TOP_LEVEL) <- frameworks/ (Trainer and
Lightning: their names, adapters, loops and argument mapping; torch and the frameworks only
inside functions)
values, frameworks <- trial/ (the trial process, torch)
values <- study/ (the driver, optuna) <- output/ (terminal, HTML, exports) <- cli
Nothing but the lazy public API in ``autotune/__init__.py`` names ``trial/``: the driver
starts trials by module name. Imports inside functions count like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "autotune"
LAYERS = ("frameworks", "trial", "study", "output")
# Every module at the top of the package, by layer. A new one is listed here (and in
# docs/architecture.md) on purpose: an unlisted module fails
# test_every_top_level_module_is_listed rather than counting as a value by default.
TOP_LEVEL = {
    # the public API: the lazy names of the package and the frameworks' public faces
    # (autotune.hf re-exports autotune.frameworks.hf)
    "autotune": "api",
    "autotune.hf": "api",
    "autotune.lightning": "api",
    # the command line
    "autotune.cli": "cli",
    "autotune.__main__": "cli",
    # values: neither torch nor optuna; they cross the process boundary
    "autotune.config": "values",
    "autotune.credentials": "values",
    "autotune.decisions": "values",
    "autotune.errors": "values",
    "autotune.host": "values",
    "autotune.knobs": "values",
    "autotune.measurement": "values",
    "autotune.mfu": "values",
    "autotune.planned": "values",
    "autotune.results": "values",
    "autotune.space": "values",
    "autotune.space_file": "values",
    "autotune.trial_spec": "values",
    "autotune.workload": "values",
}
UNLISTED = "unlisted"
# layer -> the layers it may import
ALLOWED = {
    "values": {"values"},
    "frameworks": {"values", "frameworks"},
    "trial": {"values", "frameworks", "trial"},
    "study": {"values", "study"},
    "output": {"values", "frameworks", "study", "output"},
    "cli": {"values", "frameworks", "study", "output", "cli"},
}
PUBLIC_API = tuple(m for m, where in TOP_LEVEL.items() if where == "api")
# The driver's layers never import torch, not even inside a function.
TORCH_FREE = ("study", "output", "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return TOP_LEVEL.get(module, UNLISTED)


def unlisted_top_level(modules) -> list[str]:
    """The top-level modules of ``modules`` that :data:`TOP_LEVEL` does not list."""
    return [m for m in modules if layer(m) == UNLISTED]


def imports(path: Path, name: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in ``path`` (the module
    ``name``, by default the one the path says)."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import runner` imports the module autotune.study.runner
            targets = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                for a in node.names
            ]
        else:
            continue
        out += [(t, node.lineno, id(node) in top) for t in targets]
    return out


def own_imports(path: Path, name: str | None = None) -> list[tuple[str, int, bool]]:
    """Imports of autotune modules (a name imported from a module counts as the module)."""
    name = name or module_name(path)
    out = []
    for target, line, top in imports(path, name):
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != "autotune" and target != name:
            out.append((target, line, top))
    return sorted(set(out))


def layer_violations(name: str, path: Path) -> list[str]:
    mine = layer(name)
    if mine in ("api", UNLISTED):  # an unlisted module fails its own test
        return []
    return [
        f"{name}:{line} ({mine}) imports {target}"
        for target, line, _ in own_imports(path, name)
        if layer(target) not in ALLOWED[mine]
    ]


def test_every_top_level_module_is_listed():
    unlisted = unlisted_top_level(MODULES)
    assert unlisted == [], (
        f"top-level modules not in TOP_LEVEL: {unlisted}: list each with its layer here "
        "and in docs/architecture.md"
    )
    gone = sorted(set(TOP_LEVEL) - set(MODULES))
    assert gone == [], f"TOP_LEVEL lists modules that do not exist: {gone}"


def test_an_unlisted_top_level_module_is_named():
    assert unlisted_top_level([*MODULES, "autotune.stray", "autotune.study.fine"]) == [
        "autotune.stray"
    ]


def test_each_layer_imports_only_the_layers_below_it():
    assert [v for name, path in MODULES.items() for v in layer_violations(name, path)] == []


def test_the_driver_layers_never_import_torch():
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in MODULES.items()
        if layer(name) in TORCH_FREE
        for target, line, top in imports(path)
        if target.split(".")[0] == "torch"
    ]
    assert wrong == []


def test_values_and_frameworks_import_no_heavy_package_at_module_level():
    """Both run in the driver too: torch, optuna and the frameworks load inside functions."""
    heavy = ("torch", "optuna", "transformers", "lightning", "pytorch_lightning")
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for name, path in MODULES.items()
        if layer(name) in ("values", "frameworks", "api")
        for target, line, top in imports(path)
        if top and target.split(".")[0] in heavy
    ]
    assert wrong == []


def test_no_import_cycles_even_through_function_level_imports():
    graph = {name: {t for t, _, _ in own_imports(path)} for name, path in MODULES.items()}
    cycles = []

    def visit(node: str, stack: list[str], done: set[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in stack:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in done:
                visit(nxt, [*stack, nxt], done)
        done.add(node)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name], done)
    assert cycles == []


def test_the_checks_see_a_function_level_import_of_a_sibling_layer(tmp_path):
    fake = tmp_path / "tuner.py"
    source = (PACKAGE / "study" / "tuner.py").read_text()
    fake.write_text(source + "\n\ndef _sneaky():\n    from ..output import console\n")
    assert layer_violations("autotune.study.tuner", fake) == [
        f"autotune.study.tuner:{len(source.splitlines()) + 4} (study) imports "
        "autotune.output.console"
    ]
    assert layer_violations("autotune.study.tuner", PACKAGE / "study" / "tuner.py") == []


@pytest.mark.parametrize("extra", ["", "import autotune.cli"])
def test_the_driver_side_never_loads_torch(extra):
    """In a fresh interpreter: the package, the driver and the output layer (every module
    of study/ and output/, and the public names that live there) leave torch unloaded."""
    driver = [n for n, _ in MODULES.items() if layer(n) in ("study", "output", "values")]
    code = "\n".join(
        [
            "import sys, importlib",
            "import autotune, autotune.study, autotune.output",
            extra,
            *(f"importlib.import_module({n!r})" for n in driver),
            "names = [n for n in autotune.__all__ if not autotune._WHERE.get(n, '')"
            ".startswith('trial.')]",
            "[getattr(autotune, n) for n in names]",
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])",
        ]
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
