"""Apply a :class:`~autotune.config.Config` to a model, optimizer and dataset.

This is the one code path both for trials and for users adopting a found config
(:func:`apply`), so what was measured is what gets applied.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config import Config
from ..errors import ArgumentError, AutotuneError, first_line
from ..workload import Tokens
from .compile import compile_model
from .tokens import (
    GROUP_STEPS,
    CountWithout,
    IsolatedCollate,
    PackCollate,
    TokenCollate,
    count_batch,
    dataset_lengths,
    grouped,
    scored_tokens,
)

_AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when available, else the CPU.

    Raises:
        AutotuneError: ``"cuda"`` was asked for where torch sees no CUDA device.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise AutotuneError(
            f"device: cuda, but torch {torch.__version__} ({build}) sees no CUDA device "
            "here; use device: auto or cpu, or run where a GPU is visible"
        )
    return torch.device(device)


class StreamSampler(Sampler[int]):
    """An endless stream of seeded permutations of ``range(n)``.

    Batching one stream (instead of restarting epochs) gives every batch size the same
    sample order, so loss trajectories of trials with equal global batch compare.

    With ``lengths`` and ``group`` (samples per mega-batch), each mega-batch of the
    stream is sorted by length (``length_grouping``), the same for every micro-batch size.
    """

    def __init__(
        self,
        n: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        lengths: Sequence[int] | None = None,
        group: int = 0,
    ) -> None:
        self.n = n
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.lengths = lengths
        self.group = group

    def _stream(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed)
        while True:
            yield from torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        # Under DDP each rank takes every world_size-th sample of the one stream: the ranks
        # together see exactly what a single process with their summed batch would.
        stream = self._stream()
        if self.lengths is not None and self.group:
            stream = grouped(stream, self.lengths, self.group, self.group // GROUP_STEPS)
        for position, index in enumerate(stream):
            if position % self.world_size == self.rank:
                yield index


def collate_for(
    config: Config, tokens: Tokens | None, collate_fn: Callable | None
) -> Callable | None:
    """The collate a loader uses: a workload's own, else autotune's for token samples
    (packing, isolated packing, or padding to ``pad_to_multiple_of``), else the
    DataLoader's default."""
    if config.packing == "isolated":
        if tokens is None or collate_fn is not None or tokens.isolated is None:
            raise ArgumentError(
                "packing=isolated needs token samples with Tokens(isolated='rows' or 'flat')"
            )
        length = config.pack_length or tokens.pack_length
        if tokens.isolated == "rows" and length is None:
            raise ArgumentError("packing=isolated needs Tokens(pack_length) for its rows")
        flat = tokens.isolated == "flat"
        return IsolatedCollate(tokens.pad_id, length or 0, tokens.key, flat)
    if config.packing != "off":
        length = (config.pack_length or tokens.pack_length) if tokens is not None else None
        if tokens is None or collate_fn is not None or None in (tokens.eos_id, length):
            raise ArgumentError("packing needs token samples with Tokens(eos_id, pack_length)")
        return PackCollate(tokens.pad_id, tokens.eos_id, length, tokens.key)
    if tokens is not None and collate_fn is None:
        return TokenCollate(tokens.pad_id, config.pad_to_multiple_of, tokens.key)
    return collate_fn


def make_loader(
    dataset: Dataset,
    config: Config,
    *,
    seed: int = 0,
    collate_fn: Callable | None = None,
    endless: bool = False,
    tokens: Tokens | None = None,
    lengths: Sequence[int] | None = None,
) -> DataLoader:
    """The DataLoader that ``config`` asks for (batch size, workers, pinning, prefetch).

    ``endless=True`` (trials) streams seeded permutations without epoch restarts;
    otherwise a normal shuffled, epoch-based loader with a seeded generator. With
    ``tokens`` and no ``collate_fn``, autotune pads the batches (``pad_to_multiple_of``);
    ``length_grouping`` needs the samples' ``lengths`` (computed when not given).
    """
    collate_fn = collate_for(config, tokens, collate_fn)
    kwargs: dict[str, Any] = dict(
        batch_size=config.batch_size,
        num_workers=config.num_workers,
        collate_fn=collate_fn,
        drop_last=True,
        pin_memory=config.pin_memory,
    )
    if config.num_workers > 0:  # DataLoader rejects these without workers
        kwargs.update(
            persistent_workers=config.persistent_workers, prefetch_factor=config.prefetch_factor
        )
    group = 0
    if config.length_grouping == "grouped":
        if tokens is None:
            raise ArgumentError("length_grouping needs token samples (Workload.tokens)")
        lengths = lengths if lengths is not None else dataset_lengths(dataset, tokens)
        group = GROUP_STEPS * config.global_batch
    if endless:
        rank, world = _rank_and_world()
        sampler = StreamSampler(len(dataset), seed, rank, world, lengths, group)
        return DataLoader(dataset, sampler=sampler, **kwargs)
    g = torch.Generator().manual_seed(seed)
    if group:  # one epoch: a seeded permutation, grouped by length
        permutation = torch.randperm(len(dataset), generator=g).tolist()
        order = list(grouped(iter(permutation), lengths, group, group // GROUP_STEPS))
        return DataLoader(dataset, sampler=order, **kwargs)
    return DataLoader(dataset, shuffle=True, generator=g, **kwargs)


def _summed_over_ranks(count: int, device: torch.device) -> tuple[Any, int]:
    """``(count summed over the ranks, world size)``; at least 1, so that a step with no
    scored token divides nothing by zero. NCCL sums on the device (a tensor, no host
    sync), gloo on the host."""
    import torch.distributed as dist

    _, world = _rank_and_world()
    if world == 1:
        return max(count, 1), 1
    on_device = dist.get_backend() == "nccl"
    total = torch.tensor(count, device=device if on_device else "cpu", dtype=torch.float32)
    dist.all_reduce(total)
    return (total.clamp(min=1) if on_device else max(int(total.item()), 1)), world


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap_ddp(model: torch.nn.Module, config: Config, device: torch.device) -> torch.nn.Module:
    """``DistributedDataParallel`` with the config's bucket and graph options.

    Needs an initialised process group (``torch.distributed.run`` starts one per trial).
    """
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=config.ddp_bucket_cap_mb,
        gradient_as_bucket_view=config.ddp_gradient_as_bucket_view,
        static_graph=config.ddp_static_graph,
    )


_FSDP_DTYPES = {None: None, "fp32": torch.float32, "bf16": torch.bfloat16}


def shard_fsdp(
    model: torch.nn.Module,
    config: Config,
    device: torch.device,
    blocks: Sequence[torch.nn.Module] | None,
) -> torch.nn.Module:
    """FSDP2 (``fully_shard``) over all the trial's processes, as ``config.fsdp`` says.

    ``blocks``: each block is sharded (its own all-gather group, resharded after forward
    when ``fsdp_reshard_after_forward``), then the root takes the rest and keeps FSDP's
    default for a root (no reshard: backward needs it at once). ``root``: one group, the
    whole model. Needs an initialised process group; the mesh is made on ``device``'s type,
    so gloo on the CPU works. The optimizer must be built after this: sharding replaces
    the parameters with DTensor shards.

    Raises:
        ArgumentError: ``fsdp=blocks`` without blocks.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    if config.fsdp == "blocks" and not blocks:
        raise ArgumentError("fsdp=blocks needs the model's blocks (Workload.blocks / blocks=...)")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    param, reduce = config.fsdp_policy()
    policy = MixedPrecisionPolicy(
        param_dtype=_FSDP_DTYPES[param], reduce_dtype=_FSDP_DTYPES[reduce]
    )
    options: dict[str, Any] = dict(
        mesh=mesh,
        mp_policy=policy,
        offload_policy=CPUOffloadPolicy() if config.fsdp_cpu_offload else OffloadPolicy(),
    )
    reshard = config.fsdp_reshard_after_forward
    if config.fsdp == "blocks":
        for block in blocks:
            fully_shard(block, reshard_after_forward=reshard, **options)
        fully_shard(model, **options)
    else:
        fully_shard(model, reshard_after_forward=reshard, **options)
    return model


PHASE_PREFIX = "autotune."
_NO_RANGE = contextlib.nullcontext()


def phase(name: str) -> contextlib.AbstractContextManager:
    """A ``torch.profiler`` range ``autotune.<name>`` around one part of a training step.

    The ranges let the bottleneck analysis split a step into data, to_device, forward,
    backward and optimizer. They are opened only while a profiler runs: a
    ``record_function`` costs ~10 µs even without one, too much inside a timed step.
    """
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(PHASE_PREFIX + name)
    return _NO_RANGE


def to_device(
    batch: Any, device: torch.device, non_blocking: bool = False, channels_last: bool = False
) -> Any:
    """Move every tensor in a (nested) batch to ``device``.

    ``channels_last`` also puts 4-d floating-point tensors (images) in NHWC layout.
    """
    if isinstance(batch, torch.Tensor):
        if channels_last and batch.dim() == 4 and batch.is_floating_point():
            return batch.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking, channels_last) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, non_blocking, channels_last) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def checkpoint_blocks(blocks: Iterable[torch.nn.Module]) -> int:
    """Make each block recompute its activations in backward; return how many were wrapped."""
    from torch.utils.checkpoint import checkpoint

    count = 0
    for block in blocks:
        forward = block.forward

        def wrapped(*args: Any, _forward: Callable = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = wrapped
        block._autotune_checkpointed = True
        count += 1
    return count


@dataclass
class Applied:
    """A model, optimizer and loader set up for one config, with a training step.

    Attributes:
        model: the model on the device, compiled if the config says so.
        optimizer: built over the model's parameters.
        loader: a DataLoader with the config's batch size and workers.
        scaler: a ``torch.amp.GradScaler`` for fp16, else ``None``.
        count_tokens: ``count_tokens(batch) -> int`` for the real tokens of a batch, or
            ``None`` (then a batch with an ``attention_mask`` is counted from it).
        real_tokens, positions, padding: tokens, token positions and padded positions of
            the batches :meth:`train_step` has taken so far, when they can be counted.
    """

    config: Config
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: DataLoader
    loss_fn: Callable[[Any, Any], torch.Tensor]
    scaler: Any = None
    skipped_steps: int = 0
    count_tokens: Callable[[Any], int] | None = None
    real_tokens: int = 0
    positions: int = 0
    padding: int = 0  # positions the attention mask marks as padding
    # Host seconds :meth:`train_step` spent waiting for the next batch (the loader's
    # iterator: a worker's queue, or the main process loading and collating).
    data_wait_s: float = 0.0
    # How micro-batches weigh in a step (Tokens.loss; sample_mean without tokens) and
    # what counts a batch's scored tokens (Tokens.loss_tokens, else its labels).
    loss_kind: str = "sample_mean"
    loss_tokens: Callable[[Any], int] = scored_tokens

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of the config (a no-op for fp32)."""
        if self.config.amp_dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=_AMP[self.config.amp_dtype])

    def forward_context(self) -> contextlib.ExitStack:
        """What the forward and loss run under: autocast and the SDPA backend."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.autocast())
        if self.config.sdpa_backend != "auto":
            from torch.nn.attention import sdpa_kernel

            stack.enter_context(sdpa_kernel([sdpa_backend(self.config.sdpa_backend)]))
        return stack

    def to_device(self, batch: Any) -> Any:
        """``batch`` on the device, copied and laid out as the config says."""
        return to_device(batch, self.device, self.config.non_blocking, self.config.channels_last)

    def _count(self, batch: Any) -> None:
        """Add a batch's real tokens and positions (on the host, before the copy)."""
        counted = count_batch(batch)
        if counted is not None:
            self.positions += counted[1]
            self.padding += counted[1] - counted[0]
        if self.count_tokens is not None:
            self.real_tokens += int(self.count_tokens(batch))
        elif counted is not None:
            self.real_tokens += counted[0]

    def forward_backward(self, batch: Any) -> None:
        """One forward and backward of ``batch`` with no optimizer step (gradients are
        zeroed after): what a step of that batch needs in memory, without training on it."""
        batch = self.to_device(batch)
        with self.forward_context():
            loss = self.loss_fn(self.model, batch)
        scaled = loss.float()
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, batches: Iterator[Any]) -> torch.Tensor:
        """One optimizer step over ``accumulation_steps`` micro-batches from ``batches``.

        For a token workload the step is the per-token mean over all its micro-batches
        and ranks, whatever the split: the micro-batches are taken first (they are on the
        host) and their scored tokens counted, summed over the ranks, before the first
        backward; each micro-batch's loss is then weighted by its share (see
        :class:`autotune.Tokens`). Otherwise every micro-batch weighs the same.

        Returns the step's loss as a detached tensor (no host sync): the per-token mean
        for a token workload (under DDP/FSDP, the mean over the ranks of what each
        returns), else the mean micro-batch loss.
        """
        micro = []
        for _ in range(self.config.accumulation_steps):
            with phase("data"):
                waited = time.perf_counter()
                batch = next(batches)
                self.data_wait_s += time.perf_counter() - waited
                self._count(batch)
            micro.append(batch)
        weights = self._weights(micro)
        total = torch.zeros((), device=self.device)
        last = len(micro) - 1
        for i, weight in enumerate(weights):
            with phase("to_device"):
                batch, micro[i] = self.to_device(micro[i]), None
            # Under DDP only the last micro-batch all-reduces gradients. FSDP (no no_sync)
            # reduce-scatters every micro-batch: its gradients stay sharded. So does DDP
            # with a static graph: its no_sync fails in torch's reducer (an internal assert
            # on the first backward; pytorch/pytorch#143580, fix proposed in #187732).
            sync = i == last or not _can_skip_sync(self.model)
            with contextlib.nullcontext() if sync else self.model.no_sync():
                with phase("forward"), self.forward_context():
                    loss = self.loss_fn(self.model, batch)
                with phase("backward"):
                    scaled = loss.float() * weight
                    (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            total += scaled.detach()
        with phase("optimizer"):
            if self.scaler is not None:
                # get_scale() syncs with the device; only fp16 pays that, once per step.
                before = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.skipped_steps += int(self.scaler.get_scale() < before)
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=self.config.zero_grad_set_to_none)
        return total

    def _weights(self, micro: Sequence[Any]) -> list[Any]:
        """What each micro-batch's loss is multiplied by before its backward.

        ``sample_mean`` (and any workload without tokens): ``1 / accumulation_steps``.
        ``token_mean``: its scored tokens over the step's, ``token_sum``: one over the
        step's; the step's are summed over the ranks, and both are multiplied by the
        number of ranks, whose gradients DDP and FSDP average.
        """
        if self.loss_kind == "sample_mean":
            return [1.0 / len(micro)] * len(micro)
        counts = [int(self.loss_tokens(batch)) for batch in micro]
        step, world = _summed_over_ranks(sum(counts), self.device)
        step = max(step, 1)  # a step that scores no token (every label -100) adds nothing
        if self.loss_kind == "token_sum":
            counts = [1] * len(micro)
        return [count * world / step for count in counts]


def _can_skip_sync(model: torch.nn.Module) -> bool:
    """Whether a micro-batch that is not a step's last can skip the gradient all-reduce
    (DDP's ``no_sync``): not under FSDP (no ``no_sync``), nor under DDP's static graph."""
    return hasattr(model, "no_sync") and not getattr(model, "static_graph", False)


def _build_optimizer(optimizer: Any, model: torch.nn.Module) -> torch.optim.Optimizer:
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if optimizer is None:
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    return optimizer(model.parameters())


_IMPL_FLAGS = {
    "foreach": {"foreach": True, "fused": False},
    "fused": {"fused": True, "foreach": False},
    "for-loop": {"foreach": False, "fused": False},
}


def rebuild_optimizer(opt: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """The same optimizer (class, parameter groups, hyper-parameters) with implementation
    ``impl`` (``default`` returns ``opt`` itself).

    Raises:
        ArgumentError: the class takes no ``foreach``/``fused`` argument for ``impl``, the
            optimizer already has state, or torch rejects the implementation here.
    """
    if impl == "default":
        return opt
    cls = type(opt)
    accepted = inspect.signature(cls.__init__).parameters
    flags = {k: v for k, v in _IMPL_FLAGS[impl].items() if k in accepted}
    missing = [k for k, v in _IMPL_FLAGS[impl].items() if v and k not in accepted]
    if missing or not flags:
        arg = missing[0] if missing else "foreach or fused"
        raise ArgumentError(f"optimizer_impl={impl}: {cls.__name__} takes no {arg} argument")
    if opt.state:
        raise ArgumentError(f"optimizer_impl={impl}: the {cls.__name__} already has state")
    defaults = {k: v for k, v in opt.defaults.items() if k in accepted}
    groups = [{**group, **flags} for group in opt.param_groups]
    try:
        return cls(groups, **{**defaults, **flags})
    except (RuntimeError, ValueError, TypeError) as e:
        raise ArgumentError(f"optimizer_impl={impl}: {cls.__name__} rejects it here: {e}") from e


def sdpa_backend(name: str) -> Any:
    """The ``torch.nn.attention.SDPBackend`` of an ``sdpa_backend`` value other than auto."""
    from torch.nn.attention import SDPBackend

    return {
        "math": SDPBackend.MATH,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[name]


def set_threads(config: Config) -> None:
    """Apply ``num_threads`` and ``interop_threads`` (0 leaves torch's default).

    The inter-op pool can be sized only once, before any parallel work: call this first.

    Raises:
        ArgumentError: ``interop_threads`` cannot be changed any more in this process.
    """
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    n = config.interop_threads
    if n and torch.get_num_interop_threads() != n:
        try:
            torch.set_num_interop_threads(n)
        except RuntimeError as e:
            raise ArgumentError(
                f"interop_threads={n}: torch allows setting it only once, before any "
                f"parallel work in the process ({first_line(e)})"
            ) from e


def apply(
    config: Config | dict[str, Any],
    *,
    model: torch.nn.Module,
    dataset: Dataset,
    loss: Callable[[Any, Any], torch.Tensor],
    optimizer: torch.optim.Optimizer | Callable[[Any], torch.optim.Optimizer] | None = None,
    blocks: Sequence[torch.nn.Module] | None = None,
    collate_fn: Callable | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    endless: bool = False,
    tokens: Tokens | None = None,
    lengths: Sequence[int] | None = None,
    count_tokens: Callable[[Any], int] | None = None,
    checkpointing: Callable[[torch.nn.Module], None] | None = None,
) -> Applied:
    """Set up a plain PyTorch training loop the way ``config`` says.

    This is the code every trial runs (``python -m autotune.trial`` calls it with the workload's
    factories), so a config applied here trains as it was measured. Typical use, with a
    ``best_config.yaml`` written by ``autotune run``::

        cfg = autotune.load_config("autotune-runs/cpu/best_config.yaml")
        run = autotune.apply(cfg, model=model, dataset=ds, loss=loss_fn, optimizer=make_opt)
        batches = iter(run.loader)  # one epoch; make a new iterator per epoch
        for step in range(len(run.loader) // cfg.accumulation_steps):
            loss = run.train_step(batches)

    Args:
        config: a :class:`Config` or a mapping of knob values (e.g. a loaded best_config).
        model: the model in fp32; it is moved to ``device``.
        dataset: a map-style dataset.
        loss: ``loss(model, batch) -> scalar tensor``.
        optimizer: an optimizer, or a factory ``optimizer(params)``; AdamW(lr=1e-3) if omitted.
        blocks: modules to checkpoint when ``config.gradient_checkpointing`` is on (every
            ``checkpoint_every``-th one, starting with the first), and to shard one by one
            with ``fsdp=blocks``.
        collate_fn: passed to the DataLoader.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        seed: seed of the data order.
        endless: stream batches without epoch boundaries (what trials do).
        tokens: the samples are token sequences (:class:`autotune.Tokens`): without a
            ``collate_fn``, batches are padded by autotune (``pad_to_multiple_of``), and
            a step weighs its micro-batches by their scored tokens (``Tokens.loss``).
        lengths: every sample's length, for ``length_grouping`` (else one pass over the
            dataset computes them).
        count_tokens: counts a batch's real tokens (default: its ``attention_mask``).
        checkpointing: turns on the model's own activation checkpointing, for
            ``gradient_checkpointing`` without ``blocks`` (a Hugging Face model's
            ``gradient_checkpointing_enable``).

    Returns:
        An :class:`Applied`; call ``applied.train_step(iter(applied.loader))`` in your loop,
        or use its ``model``, ``loader``, ``autocast()`` and ``scaler`` directly.

    Note:
        Process-wide settings: ``cudnn_benchmark`` (``torch.backends.cudnn.benchmark``),
        ``matmul_precision`` (``torch.set_float32_matmul_precision``), ``num_threads`` and
        ``interop_threads`` (the latter only once per process, before parallel work).
    """
    if not isinstance(config, Config):
        config = Config.from_dict(dict(config))
    device = _process_settings(config, device)
    model, opt = _training_model(config, model, device, optimizer, blocks, checkpointing)
    loader = make_loader(
        dataset,
        config,
        seed=seed,
        collate_fn=collate_fn,
        endless=endless,
        tokens=tokens,
        lengths=lengths,
    )
    return _applied(config, device, model, opt, loader, loss, tokens, count_tokens)


def _process_settings(config: Config, device: str | torch.device) -> torch.device:
    """The process-wide knobs (threads, cuDNN's autotuner, the fp32 matmul precision);
    the device ``device`` names."""
    set_threads(config)
    device = resolve_device(device) if isinstance(device, str) else device
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
    torch.set_float32_matmul_precision(config.matmul_precision)
    return device


def _training_model(
    config: Config,
    model: torch.nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | Callable[[Any], torch.optim.Optimizer] | None,
    blocks: Sequence[torch.nn.Module] | None,
    checkpointing: Callable[[torch.nn.Module], None] | None,
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model as ``config`` trains it (on the device, its memory format, checkpointed,
    sharded or wrapped for DDP, compiled) and its optimizer, built after sharding."""
    model = model.to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    if config.gradient_checkpointing:
        if blocks:
            checkpoint_blocks(list(blocks)[:: config.checkpoint_every])
        elif checkpointing is not None:
            checkpointing(model)
        else:
            raise ArgumentError(
                "gradient_checkpointing needs the model's blocks (blocks=...) or a "
                "checkpointing(model) function"
            )
    if config.fsdp != "off":
        if isinstance(optimizer, torch.optim.Optimizer):
            raise ArgumentError(
                "fsdp needs the optimizer as a factory (optimizer=lambda params: ...): "
                "sharding replaces the parameters an optimizer built before holds"
            )
        model = shard_fsdp(model, config, device, blocks)
    opt = rebuild_optimizer(_build_optimizer(optimizer, model), config.optimizer_impl)
    if config.world_size > 1 and config.fsdp == "off":
        model = wrap_ddp(model, config, device)
    return compile_model(model, config), opt


def _applied(
    config: Config,
    device: torch.device,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loader: DataLoader,
    loss: Callable[[Any, Any], torch.Tensor],
    tokens: Tokens | None,
    count_tokens: Callable[[Any], int] | None,
) -> Applied:
    """The set-up loop: the fp16 grad scaler, how real tokens are counted, how the step
    weighs its micro-batches' losses."""
    scaler = torch.amp.GradScaler(device.type) if config.amp_dtype == "fp16" else None
    if count_tokens is None and config.packing == "packed":  # the EOS separators are not data
        count_tokens = CountWithout(tokens.eos_id)
    return Applied(
        config,
        device,
        model,
        opt,
        loader,
        loss,
        scaler,
        count_tokens=count_tokens,
        loss_kind=tokens.loss if tokens is not None else "sample_mean",
        loss_tokens=(tokens.loss_tokens if tokens is not None else None) or scored_tokens,
    )


def apply_workload(
    config: Config | dict[str, Any],
    workload: Any,
    *,
    device: str | torch.device = "auto",
    seed: int = 0,
    endless: bool = False,
    lengths: Sequence[int] | None = None,
) -> Applied:
    """:func:`apply` to an :class:`autotune.Workload`: seed, build its model and data, apply.

    This is exactly what a trial does with the workload (``endless=True`` there), so a
    loop built on it trains the way the trial that measured the config did.
    """
    torch.manual_seed(seed)
    model = workload.model()
    return apply(
        config,
        model=model,
        dataset=workload.dataset(),
        loss=workload.loss,
        optimizer=workload.optimizer,
        blocks=list(workload.blocks(model)) if workload.blocks else None,
        collate_fn=workload.collate_fn,
        device=device,
        seed=seed,
        endless=endless,
        tokens=workload.tokens,
        lengths=lengths,
        count_tokens=workload.count_tokens,
        checkpointing=workload.checkpointing,
    )
