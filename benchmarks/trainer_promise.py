"""Does the user's own trainer deliver the speedup a study promised?

    autotune run search_spaces/hf_trainer.yaml --storage sqlite:///hf.db --out hf-runs
    python benchmarks/trainer_promise.py search_spaces/hf_trainer.yaml \
        hf-runs/hf_trainer/best_config.yaml --rounds 3

Issue 39: the study of a Trainer or a Lightning pair must predict what the user's own
``Trainer.train()`` / ``Trainer.fit()`` delivers with the exported arguments, within 5%.
This script is that user: it builds the workload's trainer with the function the space
names, writes the recommendation into it the documented way (``autotune.hf.apply`` for a
Trainer; the ``lightning`` export's ``Trainer`` and ``DataLoader`` arguments and
``torch.compile(model)`` for a pair), and trains ``--warmup`` + ``--steps`` optimizer
steps. It times the steps after the warm-up with its own callback and counts what the
framework counts: a Trainer's ``num_input_tokens_seen`` (``non_padding``), a pair's
samples. It uses none of autotune's trial code.

Each round runs the baseline and the recommendation in fresh processes, in an order
rotated every round; the speedup is the median of the rounds' ratios, the error its
distance from the study's ``speedup`` in best_config.yaml. ``--versus
batch_size=32,length_grouping=grouped`` adds a third config to every round (the baseline
with those values: a practitioner's heuristic) and reports the recommendation over it.
``--warmup`` sets the untimed steps before the timed ones: a compiled config on text of
varied length recompiles for new shapes for some tens of steps, which a trial counts as
one-off compile time and a short timed run does not (docs/trainers.md). A trial rates its
window as the mean step of an epoch of the sampler's order (``autotune.trial.epoch``),
so the timed steps are best whole epochs (the script prints how many they are: with
``group_by_length`` a part of an epoch sits in one part of the sort). Run it on an idle
machine; figures and their reading are in docs/trainers.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _user_function(ref: str, base: Path):
    path, _, name = ref.rpartition(":")
    path = (base / path).resolve()
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


def _train_hf(trainer, config: dict, warmup: int, steps: int) -> dict:
    import torch
    import transformers

    import autotune

    own = trainer.args  # a user on a machine without a GPU trains with use_cpu=True
    own = own if torch.cuda.is_available() else dataclasses.replace(own, use_cpu=True)
    args = autotune.hf.apply(own, config, warn=False)  # as docs/trainers.md says
    args = dataclasses.replace(
        args,
        max_steps=warmup + steps,
        save_strategy="no",
        report_to="none",
        include_num_input_tokens_seen="non_padding",
    )
    marks: list[tuple[float, int]] = []

    class Timer(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= warmup:
                marks.append((time.perf_counter(), int(state.num_input_tokens_seen)))

    user = [  # the user's own callbacks; transformers adds its own again
        c
        for c in trainer.callback_handler.callbacks
        if not type(c).__module__.startswith("transformers.")
    ]
    transformers.Trainer(
        model=trainer.model,
        args=args,
        train_dataset=trainer.train_dataset,
        data_collator=trainer.data_collator,
        processing_class=trainer.processing_class,
        callbacks=[*user, Timer()],
    ).train()
    (t0, n0), (t1, n1) = marks[0], marks[-1]
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    return {
        "rate": (n1 - n0) / (t1 - t0),
        "unit": "tokens/s",
        "epochs": steps * per_step / len(trainer.train_dataset),
    }


def _train_lightning(pair, config: dict, warmup: int, steps: int) -> dict:
    import lightning.pytorch as pl
    import torch

    import autotune

    module, data = pair
    mapped = autotune.lightning_kwargs(config).kwargs
    data.setup("fit")
    loader = data.train_dataloader()
    shuffle = isinstance(loader.sampler, torch.utils.data.RandomSampler)
    mine = torch.utils.data.DataLoader(  # the user's train_dataloader() with the export's
        loader.dataset, shuffle=shuffle, collate_fn=loader.collate_fn, **mapped["DataLoader"]
    )
    data.train_dataloader = lambda: mine
    model = module
    if config.get("compile_mode", "off") != "off":  # the export: compile before fit()
        mode = config["compile_mode"]
        model = torch.compile(module, **({} if mode == "default" else {"mode": mode}))
    marks: list[tuple[float, int]] = []
    seen = [0]

    class Timer(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, i):
            seen[0] += len(batch[0]) if isinstance(batch, (list, tuple)) else len(batch)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, i):
            step = trainer.global_step
            if step >= warmup and (not marks or marks[-1][2] != step):
                marks.append((time.perf_counter(), seen[0], step))

    trainer = pl.Trainer(
        **mapped["Trainer"],
        max_steps=warmup + steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Timer()],
    )
    trainer.fit(model, datamodule=data)
    (t0, n0, _), (t1, n1, _) = marks[0], marks[-1]
    # the first mark closes the warm-up's last step: its batches are before the window
    per_step = mapped["DataLoader"]["batch_size"] * mapped["Trainer"]["accumulate_grad_batches"]
    return {
        "rate": (n1 - n0) / (t1 - t0),
        "unit": "samples/s",
        "epochs": steps * per_step / len(loader.dataset),
    }


def child(which: str, warmup: int, steps: int, out: Path) -> None:
    """One training run of the baseline or the recommendation, in this fresh process."""
    info = json.loads(out.with_suffix(".in.json").read_text())
    config = info["configs"][which]
    made = _user_function(info["workload"], Path(info["base_dir"]))(**info["workload_args"])
    train = _train_lightning if isinstance(made, tuple) else _train_hf
    out.write_text(json.dumps(train(made, config, warmup, steps)))


def _study_facts(space_file: Path, best: Path) -> dict:
    from autotune import load_space

    space = load_space(space_file)
    rec = yaml.safe_load(best.read_text())
    study = optuna.load_study(study_name=rec["study"]["name"], storage=rec["study"]["storage"])
    trial = study.trials[rec["measured"]["baseline_trial"]]
    return {
        "configs": {"baseline": trial.user_attrs["config"], "best": rec["config"]},
        "predicted": rec["measured"]["speedup"],
        "workload": space.workload,
        "workload_args": space.workload_args or {},
        "base_dir": str(space.base_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path, help="the study's space file")
    parser.add_argument("best", type=Path, help="the study's best_config.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--versus", default="", help="KNOB=VALUE,... over the baseline")
    parser.add_argument("--doc", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("WHICH", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.warmup, args.steps, Path(args.child[1]))
        return
    facts = _study_facts(args.space, args.best)
    names = ["baseline", "best"]
    if args.versus:
        values = dict(pair.split("=", 1) for pair in args.versus.split(","))
        baseline = facts["configs"]["baseline"]
        versus = {k: type(baseline[k])(yaml.safe_load(v)) for k, v in values.items()}
        global_batch = baseline["batch_size"] * baseline["accumulation_steps"]
        versus["accumulation_steps"] = global_batch // versus.get("batch_size", 1)
        facts["configs"]["versus"] = {**baseline, **versus}
        names.append("versus")
    print(f"study: {args.best}; predicted speedup {facts['predicted']:.3f}x")
    for name in names:
        changed = {
            k: v
            for k, v in facts["configs"][name].items()
            if name == "baseline" or v != facts["configs"]["baseline"].get(k)
        }
        print(f"  {name}: {changed if name != 'baseline' else 'as the study ran it'}")
    ratios, over = [], []
    with tempfile.TemporaryDirectory() as folder:
        rates = {}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for which in order:
                out = Path(folder) / f"{r}-{which}.json"
                out.with_suffix(".in.json").write_text(json.dumps(facts))
                cmd = [sys.executable, __file__, str(args.space), str(args.best)]
                cmd += ["--child", which, str(out)]
                cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
                subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
                rates[which] = json.loads(out.read_text())
            ratios.append(rates["best"]["rate"] / rates["baseline"]["rate"])
            unit = rates["best"]["unit"]
            line = ", ".join(f"{n} {rates[n]['rate']:,.0f}" for n in names)
            if "versus" in rates:
                over.append(rates["best"]["rate"] / rates["versus"]["rate"])
                line += f"; recommended/versus {over[-1]:.3f}x"
            print(f"  round {r + 1} ({' then '.join(order)}): {line} {unit}: {ratios[-1]:.3f}x")
    epochs = rates["best"]["epochs"]
    print(
        f"timed window: {args.steps} optimizer steps after {args.warmup} = {epochs:.2f} "
        f"epochs{'' if epochs == int(epochs) else ' (not whole: the study rates an epoch)'}"
    )
    median = statistics.median(ratios)
    error = median / facts["predicted"] - 1
    print(
        f"delivered {median:.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f}) against "
        f"{facts['predicted']:.3f}x predicted: error {error:+.1%}"
    )
    if over:
        print(
            f"recommended over versus ({args.versus}): {statistics.median(over):.3f}x "
            f"(rounds {min(over):.3f}-{max(over):.3f})"
        )


if __name__ == "__main__":
    if "--doc" in sys.argv and "--child" not in sys.argv:
        sys.path.insert(0, str(Path(__file__).parent))
        import docblock  # in this script's folder, first on sys.path

        sys.exit(docblock.run(main, "trainer_promise.py"))
    main()
