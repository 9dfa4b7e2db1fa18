"""``packing: isolated``: samples packed into a row stay apart (positions restart, attention
never crosses samples), so a packed batch computes what its samples compute unpacked: on
examples/text_lm.py's model (rows, SDPA with a boolean mask on the CPU, FlexAttention on
CUDA) and on a random-init Hugging Face GPT-2 (one row, transformers' padding-free layout).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
from workloads import gpt2

from autotune import AutotuneError, Config, SpaceError
from autotune.knobs import Capabilities
from autotune.space_file import parse_space
from autotune.trial.apply import apply_workload
from autotune.trial.tokens import IsolatedCollate, TokenCollate
from autotune.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]


def _text_lm():
    workload = load_workload(
        "examples/text_lm.py:workload",
        {"n": 256, "median": 32, "longest": 160, "dim": 32, "layers": 2, "pack_length": 128},
        base_dir=ROOT,
    )
    return dataclasses.replace(workload, optimizer=lambda params: torch.optim.SGD(params, lr=1.0))


def test_isolated_rows_hold_whole_samples_with_restarting_positions():
    batch = IsolatedCollate(pad_id=0, pack_length=6)([[1, 2, 3], {"input_ids": [4, 5, 6, 7]}, [8]])
    # first fit: [1,2,3] and [8] share a row, [4,5,6,7] does not fit beside them
    assert batch["input_ids"].tolist() == [[1, 2, 3, 8, 0, 0], [4, 5, 6, 7, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1], [0, 1, 2, 3, 0, 1]]
    assert batch["seq_ids"].tolist() == [[0, 0, 0, 1, -1, -1], [0, 0, 0, 0, -1, -1]]
    assert batch["labels"].tolist() == [
        [-100, 2, 3, -100, -100, -100],
        [-100, 5, 6, 7] + [-100] * 2,
    ]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]]
    # a sample longer than pack_length widens every row, and the rows fill to that width
    wide = IsolatedCollate(pad_id=0, pack_length=4)([[1, 2, 3, 4, 5, 6], [7, 8], [9, 10, 11]])
    assert wide["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 0]]
    flat = IsolatedCollate(pad_id=0, pack_length=0, flat=True)([[1, 2], [3, 4, 5]])
    assert flat["input_ids"].tolist() == [[1, 2, 3, 4, 5]] and "seq_ids" not in flat
    assert flat["position_ids"].tolist() == [[0, 1, 0, 1, 2]]


def _samples(workload, count: int = 12) -> list:
    dataset = workload.dataset()
    return [dataset[i] for i in range(count)]


def _separate(loss_fn, model, samples) -> torch.Tensor:
    """The samples' own losses, each alone in a batch, weighted by their scored tokens."""
    losses, counts = [], []
    for sample in samples:
        losses.append(loss_fn(model, TokenCollate(pad_id=0)([sample])))
        counts.append(len(sample["input_ids"]) - 1)
    return sum(x * n for x, n in zip(losses, counts, strict=True)) / sum(counts)


@torch.no_grad()
def test_the_isolated_loss_of_text_lm_rows_is_the_samples_unpacked_loss():
    workload = _text_lm()
    torch.manual_seed(0)
    model = workload.model().eval()
    samples = _samples(workload)
    batch = IsolatedCollate(pad_id=0, pack_length=128)(samples)
    assert batch["input_ids"].shape[0] < len(samples)  # several samples share a row
    packed = workload.loss(model, batch)
    torch.testing.assert_close(packed, _separate(workload.loss, model, samples))


@torch.no_grad()
def test_the_isolated_loss_of_a_hugging_face_model_is_the_samples_unpacked_loss():
    """transformers (5.x here) honours packed position_ids with SDPA and eager attention
    on the CPU, given no attention mask and no cache (autotune.hf.model_loss)."""
    pytest.importorskip("transformers")
    workload = gpt2()
    assert workload.tokens.isolated == "flat"  # autotune.hf found the support
    torch.manual_seed(0)
    model = workload.model().eval()
    samples = _samples(workload, 8)
    batch = IsolatedCollate(pad_id=0, pack_length=0, flat=True)(samples)
    for attention in ("sdpa", "eager"):
        model.config._attn_implementation = attention
        packed = workload.loss(model, batch)
        torch.testing.assert_close(packed, _separate(workload.loss, model, samples))


def _step(workload, **knobs) -> torch.Tensor:
    """One optimizer step of 16 x 2 samples: the negative gradient, flat (SGD, lr=1)."""
    applied = apply_workload(
        Config(batch_size=16, accumulation_steps=2, **knobs), workload, device="cpu", endless=True
    )
    before = [p.detach().clone() for p in applied.model.parameters()]
    applied.train_step(iter(applied.loader))
    after = applied.model.parameters()
    return torch.cat([(b - a.detach()).flatten() for b, a in zip(before, after, strict=True)])


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """GPT-2's dropout draws other masks for another layout: off, the steps compare."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


@pytest.mark.parametrize("name", ["text_lm", "gpt2"])
def test_an_isolated_step_trains_like_the_padded_step_of_the_same_samples(name):
    """Isolated packing changes the layout, not the training: one step's gradient equals
    that of the padded batches (token-weighted accumulation, the same samples)."""
    if name == "gpt2":
        pytest.importorskip("transformers")
        base = gpt2()
        workload = dataclasses.replace(
            base,
            model=lambda: _without_dropout(base.model()),
            optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        )
    else:
        workload = _text_lm()
    padded = _step(workload)
    isolated = _step(workload, packing="isolated")
    assert padded.abs().sum() > 0
    torch.testing.assert_close(isolated, padded, rtol=1e-4, atol=1e-6)


def test_listing_isolated_for_a_model_that_does_not_keep_samples_apart_is_one_line():
    """A causal-LM workload that did not declare Tokens(isolated=...) (a model that
    ignores position_ids, or a transformers without packed masks): an error naming the
    knob and the field, before any trial."""
    workload = load_workload("examples/text_lm.py:workload", base_dir=ROOT)
    tokens = dataclasses.replace(workload.tokens, isolated=None)
    undeclared = dataclasses.replace(workload, tokens=tokens)
    caps = Capabilities(
        device="cpu",
        tokens=True,
        token_collate=True,
        packing_undeclared="",
        isolated_undeclared=undeclared.isolated_undeclared,
    )
    space = parse_space({"workload": "m:f", "knobs": {"packing": ["off", "packed", "isolated"]}})
    with pytest.raises(SpaceError) as raised:
        space.restrict(caps)
    assert str(raised.value).count("\n") == 0
    assert "knobs.packing: isolated cannot apply: packing: isolated needs Tokens(isolated=" in str(
        raised.value
    )
    declared = dataclasses.replace(caps, isolated_undeclared=workload.isolated_undeclared or "")
    assert dict(space.restrict(declared)[0].knobs)["packing"] == ("off", "packed", "isolated")


def test_isolated_for_an_undeclared_model_stops_the_run_in_one_line(write_space, tmp_path):
    """Through the probe: the CLI run ends with the one line, and no trial ran."""
    from conftest import run_cli

    space = write_space("""
        workload: {workloads}:texts
        workload_args: {causal_lm: true}
        knobs: {packing: ["off", isolated]}
        trial: {warmup_steps: 1, measured_steps: 2}
    """)
    r = run_cli("run", str(space), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().endswith(
        "knobs.packing: isolated cannot apply: packing: isolated needs "
        "Tokens(isolated='rows' or 'flat'): a per-token causal-LM loss and a model that keeps "
        "packed samples apart (autotune.hf: a transformers whose masks follow packed "
        "position_ids)"
    )
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "runs").glob("*/trial-*"))


@pytest.mark.cuda
def test_isolated_attention_on_cuda_is_flex_attention_with_the_same_result():
    """On CUDA sample_mask is a FlexAttention block mask; forward and backward agree with
    SDPA under the boolean mask the CPU uses."""
    from torch.nn.attention.flex_attention import BlockMask

    from autotune import isolated_attention, sample_mask

    seq = torch.tensor([[0] * 40 + [1] * 60 + [2] * 20 + [-1] * 8] * 2, device="cuda")
    seq[1, :100] = 0
    q, k, v = (torch.randn(2, 4, 128, 16, device="cuda", requires_grad=True) for _ in range(3))
    mask = sample_mask(seq)
    assert isinstance(mask, BlockMask)
    out = isolated_attention(q, k, v, mask)
    dense = sample_mask(seq.cpu()).cuda()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected = torch.autograd.grad(ref.sum(), (q, k, v))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def test_pack_length_is_a_knob_over_the_workloads_default_row():
    workload = _text_lm()  # Tokens(pack_length=128)

    def width(**knobs) -> int:
        config = Config(batch_size=16, **knobs)
        applied = apply_workload(config, workload, device="cpu", endless=True)
        return next(iter(applied.loader))["input_ids"].shape[1]

    assert width(packing="packed") == 128
    assert width(packing="packed", pack_length=64) == 64
    assert width(packing="isolated", pack_length=160) == 160
    with pytest.raises(AutotuneError, match="pack_length=64 needs packing other than off"):
        Config(pack_length=64)


def test_a_pack_length_above_the_models_context_is_one_line_before_any_trial():
    """The context comes from Tokens(context=...) (text_lm: its position embeddings) or a
    transformers config (GPT-2: n_positions)."""
    from autotune.trial.probe import model_context

    workload = _text_lm()
    assert model_context(workload.model(), workload) == 160
    if importlib.util.find_spec("transformers"):
        hf = gpt2()
        assert model_context(hf.model(), hf) == 128
    caps = Capabilities(device="cpu", tokens=True, token_collate=True, packing_undeclared="")
    knobs = {"packing": ["packed"], "pack_length": [128, 512]}
    space = parse_space({"workload": "m:f", "knobs": knobs})
    with pytest.raises(SpaceError) as raised:
        space.restrict(dataclasses.replace(caps, context=160))
    assert str(raised.value) == (
        "<space>: knobs.pack_length: 512 cannot apply: a row longer than the model's context "
        "of 160 positions (packed rows number positions across the row)"
    )
    assert {128, 512} <= set(space.restrict(caps)[0].knobs["pack_length"])  # context unknown


def test_a_pack_length_of_0_that_is_a_listed_length_runs_once():
    """pack_length 0 is the workload's Tokens.pack_length: listed with that length, the
    two are one config, dropped with a note; without it, or with none declared, kept."""
    from autotune.trial.probe import capabilities

    caps = Capabilities(device="cpu", tokens=True, token_collate=True, packing_undeclared="")
    knobs = {"packing": ["packed"], "pack_length": [0, 128, 512]}
    space = parse_space({"workload": "m:f", "knobs": knobs})
    restricted, notes = space.restrict(dataclasses.replace(caps, pack_length=128))
    assert restricted.knobs["pack_length"] == (128, 512)
    assert "pack_length=0 dropped: it is 128, also listed" in notes
    other = dataclasses.replace(caps, pack_length=256)
    assert space.restrict(other)[0].knobs["pack_length"] == (0, 128, 512)
    assert space.restrict(caps)[0].knobs["pack_length"] == (0, 128, 512)  # none declared
    workload = _text_lm()
    found = capabilities(torch.device("cpu"), workload, workload.dataset())
    assert found["pack_length"] == 128  # what the probe reads from the workload


@pytest.mark.cuda
def test_the_flash_attention_path_of_a_hugging_face_model_keeps_samples_apart():
    """transformers' flash-attention path reads one packed row's position_ids as
    cu_seqlens: each sample's logits in the isolated row are its logits alone (bf16:
    within 0.05, where attention across samples moves them by ~0.4 on the CPU's SDPA).
    Not run on the CPU machine this was written on."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("flash_attn")
    from autotune.hf import model_inputs

    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=40,
        max_position_embeddings=128,
        attn_implementation="flash_attention_2",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    lengths = (9, 30, 17)
    samples = [
        {"input_ids": [(i * 7 + k) % 38 + 1 for k in range(n)]} for i, n in enumerate(lengths)
    ]
    batch = IsolatedCollate(pad_id=0, pack_length=0, flat=True)(samples)
    with torch.no_grad():
        packed = model(**model_inputs({k: v.cuda() for k, v in batch.items()})).logits
        alone = [
            model(input_ids=torch.tensor([s["input_ids"]], device="cuda")).logits for s in samples
        ]
    torch.testing.assert_close(packed.float(), torch.cat(alone, 1).float(), rtol=0, atol=0.05)
