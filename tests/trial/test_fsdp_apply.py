"""``shard_fsdp`` in one process (a gloo world of one): what each FSDP knob sets, seen in
the sharded model itself rather than in memory figures that noise can hide."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from workloads import Deep

from autotune import Config
from autotune.trial.apply import shard_fsdp


@pytest.fixture
def gloo_world(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _sharded(config: Config) -> Deep:
    torch.manual_seed(0)
    model = Deep(dim=8, hidden=32, depth=2)
    return shard_fsdp(model, config, torch.device("cpu"), list(model.blocks))


@pytest.mark.parametrize("reshard", [True, False])
def test_reshard_after_forward_decides_whether_a_block_stays_gathered(gloo_world, reshard):
    """After the forward, a resharded block holds its DTensor shard again; a block told
    not to reshard keeps its gathered (plain) weights until its backward."""
    model = _sharded(
        Config(batch_size=4, world_size=2, fsdp="blocks", fsdp_reshard_after_forward=reshard)
    )
    assert isinstance(model.blocks[0][0].weight, DTensor)  # sharded before any forward
    model(torch.randn(4, 8)).sum()
    gathered = not isinstance(model.blocks[0][0].weight, DTensor)
    assert gathered is (not reshard)


@pytest.mark.parametrize("reduce", ["fp32", "bf16"])
def test_reduce_dtype_rounds_the_gradients_it_reduces(gloo_world, reduce):
    """``fsdp_reduce_dtype: bf16`` reduce-scatters the gradients in bf16: fp32 gradients
    that come back exactly representable in bf16 (their low 16 bits zero); fp32 keeps them."""
    model = _sharded(Config(batch_size=4, world_size=2, fsdp="blocks", fsdp_reduce_dtype=reduce))
    model(torch.randn(4, 8)).pow(2).sum().backward()
    grad = model.blocks[0][0].weight.grad.to_local()
    assert grad.dtype == torch.float32 and grad.abs().sum() > 0
    rounded = torch.equal(grad, grad.to(torch.bfloat16).to(torch.float32))
    assert rounded is (reduce == "bf16")
