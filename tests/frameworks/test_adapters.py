"""A transformers.Trainer and a (LightningModule, LightningDataModule) pair as workloads:
what each adapter takes from the framework, and the baseline it gives (real frameworks,
random-init models, nothing downloaded)."""

from __future__ import annotations

import itertools
import sys
import warnings

import pytest
import torch
from conftest import ROOT

from autotune import Config, Measurement, SpaceError, WorkloadError, tune
from autotune.frameworks.adapters import load as load_workload
from autotune.space_file import parse_space, with_workload_baseline
from autotune.study.replay import ReplayBackend
from autotune.trial.apply import apply_workload

sys.path.insert(0, str(ROOT / "examples"))
EXAMPLES = ROOT / "examples"


def test_a_trainer_is_the_workload_with_its_loss_optimizer_collator_and_baseline():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    workload = load_workload(f"{EXAMPLES}/hf_trainer.py:make_trainer", {"n": 64, "hidden": 32})
    assert workload.name == "Trainer(BertForSequenceClassification)"
    base = workload.baseline
    assert (base["batch_size"], base["accumulation_steps"]) == (16, 2)  # TrainingArguments
    assert workload.tokens is not None  # input_ids, and the collator makes an attention_mask
    # a label per sample: the Trainer's loss is a mean per sample, micro-batches weigh alike
    assert workload.tokens.loss == "sample_mean"
    model = workload.model()
    opt = workload.optimizer(model.parameters())
    # the Trainer's optimizer: AdamW at its learning rate, no decay on biases and norms
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert opt.defaults["lr"] == 1e-3
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(
        "bias" in names[id(p)] or "LayerNorm" in names[id(p)] for p in opt.param_groups[1]["params"]
    )
    applied = apply_workload(Config(batch_size=8, accumulation_steps=2), workload, device="cpu")
    batch = next(iter(applied.loader))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}  # the text column is gone
    assert batch["labels"].shape == (8,)  # one label per sample: not a causal LM
    batches = iter(applied.loader)
    losses = [float(applied.train_step(batches)) for _ in range(3)]
    assert all(0 < loss < 5 for loss in losses)
    assert 0 < applied.real_tokens < applied.positions  # from the attention mask
    # the loss is the Trainer's compute_loss: the model's cross-entropy over the labels
    trainer = transformers.Trainer(
        model=model, args=transformers.TrainingArguments("/tmp/x", report_to="none")
    )
    model.eval()  # no dropout: the same value twice
    with torch.no_grad():
        assert float(workload.loss(model, batch)) == pytest.approx(
            float(trainer.compute_loss(model, batch))
        )


def test_training_arguments_map_to_the_baseline_knobs(tmp_path):
    transformers = pytest.importorskip("transformers")
    from autotune.hf import trainer_baseline

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=8,
        bf16=True,
        use_cpu=True,
        tf32=False,
        dataloader_num_workers=2,
        dataloader_prefetch_factor=4,
        dataloader_persistent_workers=True,
        torch_compile=True,
        torch_compile_mode="max-autotune",
        gradient_checkpointing=True,
        train_sampling_strategy="group_by_length",
    )
    values = trainer_baseline(args)
    assert values == {
        "batch_size": 4,
        "accumulation_steps": 8,
        "amp_dtype": "bf16",
        "num_workers": 2,
        "pin_memory": bool(args.dataloader_pin_memory),
        "compile_mode": "max-autotune",
        "gradient_checkpointing": True,
        "length_grouping": "grouped",
        "matmul_precision": "highest",
        "persistent_workers": True,
        "prefetch_factor": 4,
    }
    Config.from_dict(values)  # a valid config


def test_apply_writes_a_config_into_new_training_arguments(tmp_path):
    transformers = pytest.importorskip("transformers")
    import autotune.hf

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=16,
        dataloader_num_workers=2,
        dataloader_prefetch_factor=4,
        torch_compile=True,
        torch_compile_mode="max-autotune",
        train_sampling_strategy="group_by_length",
    )
    config = Config(batch_size=8, accumulation_steps=4, amp_dtype="bf16", compile_mode="default")
    with pytest.warns(UserWarning, match=r"set by hand: channels_last=True: "):
        new = autotune.hf.apply(args, config.replace(channels_last=True))
    assert new is not args and args.per_device_train_batch_size == 16  # not mutated
    assert (new.per_device_train_batch_size, new.gradient_accumulation_steps) == (8, 4)
    assert new.bf16 and new.torch_compile and new.torch_compile_mode is None  # the default
    # back at the defaults: no workers (and so no prefetch), random order
    assert new.dataloader_num_workers == 0 and new.dataloader_prefetch_factor is None
    assert new.train_sampling_strategy == "random"
    assert new.output_dir == args.output_dir and new.use_cpu
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        autotune.hf.apply(args, config)  # everything expressible: no warning
        # transformers 5 reads its deprecated gradient_checkpointing only while the new
        # activation_checkpointing is unset: set on built arguments, it did nothing
        checkpointed = autotune.hf.apply(args, config.replace(gradient_checkpointing=True))
    assert _checkpointing(checkpointed) == dict.fromkeys(_checkpointing(args), True)
    assert _checkpointing(autotune.hf.apply(checkpointed, config)) == dict.fromkeys(
        _checkpointing(args), False
    )  # and off again


def _checkpointing(args) -> dict[str, bool]:
    """The TrainingArguments' checkpointing fields: gradient_checkpointing, and under
    transformers 5 activation_checkpointing (which the Trainer reads) beside it."""
    import transformers

    names = ["gradient_checkpointing"]
    if int(transformers.__version__.split(".")[0]) >= 5:
        names.append("activation_checkpointing")  # required there: not a getattr default
    return {name: getattr(args, name) for name in names}


@pytest.mark.parametrize("field", ["gradient_checkpointing", "activation_checkpointing"])
def test_apply_turns_checkpointing_off_and_on_in_every_field(tmp_path, field):
    """Arguments built with checkpointing on, under either name: a config without it
    turns every field off, one with it turns every field on again."""
    transformers = pytest.importorskip("transformers")
    import autotune.hf

    if field == "activation_checkpointing" and not hasattr(
        transformers.TrainingArguments, "activation_checkpointing"
    ):
        pytest.skip("transformers 4 has only gradient_checkpointing")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", **{field: True}
    )
    assert set(_checkpointing(args).values()) == {True}
    off = autotune.hf.apply(args, Config())
    assert set(_checkpointing(off).values()) == {False}, _checkpointing(off)
    on = autotune.hf.apply(off, Config(gradient_checkpointing=True))
    assert set(_checkpointing(on).values()) == {True}, _checkpointing(on)


def test_the_workloads_baseline_is_under_the_space_files():
    data = {
        "workload": "x.py:make_trainer",
        "knobs": {"batch_size": [8, 16, 32, 64], "amp_dtype": ["fp32", "bf16"]},
    }
    space = parse_space(data)
    assert space.baseline.batch_size == 32 and space.global_batch == 32
    trainer = {"batch_size": 16, "accumulation_steps": 2, "amp_dtype": "bf16"}
    rebased = with_workload_baseline(space, trainer, "Trainer(M)")
    assert (rebased.baseline.batch_size, rebased.baseline.accumulation_steps) == (16, 2)
    assert rebased.baseline.amp_dtype == "bf16" and rebased.global_batch == 32
    assert rebased.knobs["batch_size"] == (8, 16, 32)  # 64 does not divide 32
    assert "baseline from the workload Trainer(M): batch_size=16" in rebased.notes[-1]
    # a baseline the file writes wins, and is said to
    mine = with_workload_baseline(
        parse_space({**data, "baseline": {"batch_size": 8}}), trainer, "T"
    )
    assert mine.baseline.batch_size == 8 and mine.global_batch == 8 * 2
    assert any(
        "baseline.batch_size=8 (the space file) replaces the workload's 16" in n for n in mine.notes
    )
    # settings that do not fit the file: one line naming where they come from
    with pytest.raises(SpaceError) as err:
        with_workload_baseline(parse_space({**data, "global_batch": 64}), {"batch_size": 48}, "T")
    assert str(err.value) == (
        "<space>: baseline.batch_size: 48 does not divide global_batch 64 "
        "(the baseline comes from the workload T: batch_size=48)"
    )


def _lightning_pair(optimizers=None):
    pl = pytest.importorskip("lightning.pytorch")
    import lightning_module

    module, data = lightning_module.make_trainer(n=256, width=32)
    if optimizers is not None:
        module.configure_optimizers = optimizers.__get__(module)
    return pl, module, data


def test_a_lightning_pair_is_the_workload_of_its_training_step_and_loader(tmp_path):
    pl, module, data = _lightning_pair()
    workload = load_workload(
        f"{EXAMPLES}/lightning_module.py:make_trainer", {"n": 256, "width": 32}
    )
    assert workload.name == "LightningModule(Classifier)"
    assert workload.baseline == {"batch_size": 64, "num_workers": 0, "pin_memory": False}
    applied = apply_workload(
        Config(batch_size=16, accumulation_steps=4), workload, device="cpu", endless=True
    )
    assert isinstance(applied.optimizer, torch.optim.AdamW)  # configure_optimizers' (a dict)
    batches = iter(applied.loader)
    losses = [float(applied.train_step(batches)) for _ in range(8)]
    assert losses[-1] < losses[0]  # training_step's cross-entropy, optimised
    # the loss is training_step's: same batch, same model, same value
    x, y = next(iter(applied.loader))
    step = applied.model
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        assert float(step((x, y))) == pytest.approx(float(step.module.training_step((x, y), 0)))


def test_a_lightning_pair_the_adapter_cannot_tune_is_one_line():
    from autotune.lightning import from_trainer

    def two(self):
        return [
            torch.optim.SGD(self.parameters(), lr=0.1),
            torch.optim.SGD(self.parameters(), lr=0.1),
        ]

    _, module, data = _lightning_pair(optimizers=two)
    workload = from_trainer((module, data))
    with pytest.raises(WorkloadError, match="configure_optimizers\\(\\) returned 2 optimizers"):
        workload.optimizer(workload.model().parameters())
    module.automatic_optimization = False
    with pytest.raises(WorkloadError, match="manual optimization"):
        from_trainer((module, data))
    with pytest.raises(
        WorkloadError, match="must return \\(LightningModule, LightningDataModule\\)"
    ):
        from_trainer((module,))


class _TrainerReplay(ReplayBackend):
    """A replayed study whose probe reports a Trainer's own settings, as the trial
    process's probe does for a ``make_trainer`` workload (its measurements are looked
    up; the driver's handling of the probe is the real one)."""

    def __init__(self, table: dict, settings: dict) -> None:
        super().__init__(table)
        self.settings = settings

    def probe(self, space, folder):
        workload = {"name": "Trainer(M)", "baseline": self.settings}
        return {**super().probe(space, folder), "workload": workload}


def _replay_table() -> dict:
    rows = []
    for batch_size, accumulation in ((8, 1), (8, 2), (16, 1)):
        m = Measurement(
            status="ok",
            samples_per_s=100.0 + batch_size,
            samples_per_step=batch_size * accumulation,
            measured_steps=5,
            losses=[1.0, 0.9, 0.8],
            step_time_cv=0.01,
            wall_s=1.0,
        )
        config = Config(batch_size=batch_size, accumulation_steps=accumulation)
        rows.append({"config": config.to_dict(), "measurement": m.to_dict()})
    caps = {"device": "cpu", "cpu_count": 2, "workload_blocks": 2}
    return {"environment": {"device": "cpu"}, "capabilities": caps, "measurements": rows}


def test_a_stored_study_refuses_a_trainer_whose_arguments_changed(tmp_path):
    """The fingerprint covers the space file, not the Trainer's arguments: a resumed study
    would keep its old baseline trial, so a change is one line, not a silent mix."""
    import optuna

    space = parse_space(
        {
            "workload": "x.py:make_trainer",
            "knobs": {"batch_size": [8, 16]},
            "search": {"sampler": "random", "confirm_top": 0, "screening": False},
        }
    )
    storage = f"sqlite:///{tmp_path}/study.db"
    settings = {"batch_size": 16, "amp_dtype": "fp32"}
    first = tune(
        space, storage=storage, out_dir=tmp_path, backend=_TrainerReplay(_replay_table(), settings)
    )
    assert first.baseline.config.batch_size == 16  # the Trainer's, not the file's
    again = _TrainerReplay(_replay_table(), dict(settings))
    tune(space, storage=storage, out_dir=tmp_path, backend=again)  # the same settings resume
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    stored = len(study.get_trials(deepcopy=False))
    changed = _TrainerReplay(_replay_table(), {**settings, "batch_size": 8})
    with pytest.raises(SpaceError, match=r"settings changed since study .*\(batch_size 16 -> 8\)"):
        tune(space, storage=storage, out_dir=tmp_path, backend=changed)
    assert changed.calls == []  # refused before any trial
    assert len(study.get_trials(deepcopy=False)) == stored


def _causal_lm_trainer(tmp_path, n: int = 64):
    """A Trainer as a user writes one for a causal LM: a random-init GPT-2 (no dropout),
    tokenized texts of 4 to 64 words (``hf_trainer``'s word-level tokenizer, nothing
    downloaded), ``DataCollatorForLanguageModeling(mlm=False)`` padding each batch and
    labelling every token; SGD at lr=1, so a step's parameter change is its gradient."""
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    import hf_trainer

    tok = hf_trainer.tokenizer()
    texts, _ = hf_trainer.sentences(n)
    ds = datasets.Dataset.from_dict({"text": texts}).map(
        lambda batch: tok(batch["text"]), batched=True, remove_columns=["text"]
    )
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.vocab_size,
        n_layer=1,
        n_embd=32,
        n_head=2,
        n_positions=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=tok.pad_token_id,
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        optim="sgd",
        learning_rate=1.0,
        weight_decay=0.0,
        use_cpu=True,
        report_to="none",
    )
    return transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=ds,
        data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False),
        processing_class=tok,
    )


def test_a_causal_lm_trainer_weighs_its_micro_batches_by_their_tokens(tmp_path):
    """A causal LM's labels are one per token (2-d): the Trainer divides the step's loss
    by its tokens (num_items_in_batch), so autotune's step does, and one optimizer step
    gives the same gradient whether the step is 8 x 1, 4 x 2 or 2 x 4 micro-batches of
    different lengths. Weighed per sample, the splits would differ."""
    import autotune.hf

    grads = []
    for batch_size, accumulation in ((8, 1), (4, 2), (2, 4)):
        workload = autotune.hf.from_trainer(_causal_lm_trainer(tmp_path))
        assert workload.tokens is not None and workload.tokens.loss == "token_mean"
        config = Config(batch_size=batch_size, accumulation_steps=accumulation)
        applied = apply_workload(config, workload, device="cpu", endless=True)
        before = [p.detach().clone() for p in applied.model.parameters()]
        applied.train_step(iter(applied.loader))
        after = applied.model.parameters()
        grads.append(torch.cat([(b - a).flatten() for b, a in zip(before, after, strict=True)]))
    assert grads[0].abs().sum() > 0
    for other in grads[1:]:
        torch.testing.assert_close(other, grads[0], rtol=1e-4, atol=1e-6)


def _token_lightning_pair(batch_size: int = 4):
    """A Lightning pair over token samples, as a user writes one for a language model:
    dict batches of ``input_ids``, ``attention_mask`` and ``labels`` (-100 on padding),
    ``training_step`` the mean over the micro-batch's tokens, SGD at lr=1 (a step's
    parameter change is its gradient). Samples are 3 to 24 tokens long."""
    pl = pytest.importorskip("lightning.pytorch")
    from torch.nn import functional as F

    class TinyLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 16)
            self.head = torch.nn.Linear(16, 32)

        def training_step(self, batch, batch_idx):
            logits = self.head(self.embed(batch["input_ids"]))[:, :-1]
            return F.cross_entropy(logits.transpose(1, 2), batch["labels"][:, 1:])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1.0)

    def collate(samples):
        ids = torch.nn.utils.rnn.pad_sequence([s["input_ids"] for s in samples], True)
        mask = torch.nn.utils.rnn.pad_sequence([s["attention_mask"] for s in samples], True)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": ids.masked_fill(mask == 0, -100),
        }

    class Texts(pl.LightningDataModule):
        def setup(self, stage=None):
            g = torch.Generator().manual_seed(0)
            lengths = torch.randint(3, 25, (64,), generator=g).tolist()
            self.samples = [
                {
                    "input_ids": torch.randint(1, 32, (n,), generator=g),
                    "attention_mask": torch.ones(n, dtype=torch.long),
                }
                for n in lengths
            ]

        def train_dataloader(self):
            return torch.utils.data.DataLoader(
                self.samples, batch_size=batch_size, shuffle=True, collate_fn=collate
            )

    torch.manual_seed(0)
    return pl, TinyLM(), Texts()


def test_a_lightning_pair_with_token_batches_steps_as_lightnings_accumulation(tmp_path):
    """Lightning divides each micro-batch's loss by accumulate_grad_batches: a token
    pair's micro-batches weigh the same (sample_mean), not by their tokens. One autotune
    step over two micro-batches changes the parameters as a real Lightning Trainer's
    step (accumulate_grad_batches=2) over the same two batches."""
    from autotune.lightning import from_trainer

    _, module, data = _token_lightning_pair()
    workload = from_trainer((module, data))
    assert workload.tokens is not None and workload.tokens.loss == "sample_mean"
    applied = apply_workload(Config(batch_size=4, accumulation_steps=2), workload, device="cpu")
    batches = list(itertools.islice(iter(applied.loader), 2))
    lengths = [int(b["attention_mask"].sum()) for b in batches]
    assert lengths[0] != lengths[1]  # token weights would differ from equal ones
    before = [p.detach().clone() for p in module.parameters()]
    applied.train_step(iter(batches))
    ours = [b - a.detach() for b, a in zip(before, module.parameters(), strict=True)]

    pl, theirs_module, _ = _token_lightning_pair()
    start = [p.detach().clone() for p in theirs_module.parameters()]
    for mine, theirs in zip(before, start, strict=True):
        torch.testing.assert_close(mine, theirs)  # the same initial model
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=1,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(theirs_module, train_dataloaders=loader)
    theirs = [b - a.detach() for b, a in zip(start, theirs_module.parameters(), strict=True)]
    assert torch.cat([t.flatten() for t in theirs]).abs().sum() > 0
    for mine, lightning in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, lightning, rtol=1e-4, atol=1e-6)
