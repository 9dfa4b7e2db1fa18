"""Variable-length token data: padding and masks, lengths, length-grouped order, counting.

Used by :func:`autotune.apply` for a workload that declares ``tokens``
(:class:`autotune.Tokens`): autotune's collate pads each batch, real (non-padding)
tokens are counted for tokens/s, and the ``length_grouping`` knob orders the stream.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import WorkloadError
from ..workload import Tokens

IGNORE_INDEX = -100  # labels on padding: cross_entropy (and HF models) skip them
# A mega-batch of this many optimizer steps is sorted by length (HF: 50 batches).
GROUP_STEPS = 50


def sample_ids(sample: Any, key: str = "input_ids") -> Any:
    """The token ids of one sample: the sample itself, or ``sample[key]`` for a dict."""
    return sample[key] if isinstance(sample, Mapping) else sample


class TokenCollate:
    """Pads a list of token sequences into ``{"input_ids", "attention_mask", "labels"}``.

    The batch is as long as its longest sample, rounded up to a multiple of
    ``pad_to_multiple_of``; labels are the ids with ``-100`` on padding.
    """

    def __init__(self, pad_id: int, pad_to_multiple_of: int = 1, key: str = "input_ids") -> None:
        self.pad_id = pad_id
        self.multiple = pad_to_multiple_of
        self.key = key

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        seqs = [torch.as_tensor(sample_ids(s, self.key), dtype=torch.long) for s in samples]
        longest = max(len(x) for x in seqs)
        width = math.ceil(longest / self.multiple) * self.multiple
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, x in enumerate(seqs):
            ids[i, : len(x)] = x
            mask[i, : len(x)] = 1
        labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class PackCollate:
    """Concatenates a micro-batch's samples, each followed by ``eos_id``, into rows of
    ``pack_length`` tokens; only the last row is padded. The step holds the same samples
    as unpacked, with a small fraction of the padding."""

    def __init__(self, pad_id: int, eos_id: int, pack_length: int, key: str = "input_ids"):
        self.pad_id, self.eos_id, self.length, self.key = pad_id, eos_id, pack_length, key

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        eos = torch.tensor([self.eos_id], dtype=torch.long)
        parts = []
        for s in samples:
            parts += [torch.as_tensor(sample_ids(s, self.key), dtype=torch.long), eos]
        flat = torch.cat(parts)
        rows = math.ceil(len(flat) / self.length)
        ids = torch.full((rows * self.length,), self.pad_id, dtype=torch.long)
        mask = torch.zeros(rows * self.length, dtype=torch.long)
        ids[: len(flat)] = flat
        mask[: len(flat)] = 1
        ids, mask = ids.view(rows, self.length), mask.view(rows, self.length)
        labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class IsolatedCollate:
    """``packing: isolated``: whole samples packed into rows, kept apart.

    ``rows``: each sample goes into the first row of ``pack_length`` tokens with room for
    it (rows are as wide as the micro-batch's longest sample if that is longer), padded
    at its end. ``flat``: the whole micro-batch in one row, no padding (transformers'
    ``DataCollatorWithFlattening``). ``position_ids`` restart at 0 with each sample (and
    with a row's padding, a segment of its own); ``labels`` are the ids with ``-100`` on
    each sample's first token (nothing predicts it from the sample before) and on padding,
    so a next-token loss scores exactly the tokens it scores unpacked. ``rows`` adds
    ``seq_ids``: each token's sample in its row, ``-1`` on padding.
    """

    def __init__(self, pad_id: int, pack_length: int, key: str = "input_ids", flat: bool = False):
        self.pad_id, self.length, self.key, self.flat = pad_id, pack_length, key, flat

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        seqs = [torch.as_tensor(sample_ids(s, self.key), dtype=torch.long) for s in samples]
        lengths = [len(x) for x in seqs]
        if self.flat:
            rows, width = [list(range(len(seqs)))], sum(lengths)
        else:
            width = max([self.length, *lengths])
            rows = first_fit(lengths, width)
        shape = (len(rows), width)
        ids = torch.full(shape, self.pad_id, dtype=torch.long)
        labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros(shape, dtype=torch.long)
        seq_ids = torch.full(shape, -1, dtype=torch.long)
        for r, members in enumerate(rows):
            at = 0
            for j, i in enumerate(members):
                x, n = seqs[i], lengths[i]
                ids[r, at : at + n] = x
                labels[r, at + 1 : at + n] = x[1:]
                positions[r, at : at + n] = torch.arange(n)
                seq_ids[r, at : at + n] = j
                at += n
            positions[r, at:] = torch.arange(width - at)
        batch = {
            "input_ids": ids,
            "attention_mask": (seq_ids >= 0).long(),
            "labels": labels,
            "position_ids": positions,
        }
        if not self.flat:
            batch["seq_ids"] = seq_ids
        return batch


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` in rows of ``capacity``: each into the first row with room
    (a longer one alone in a row of its own), in order."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        r = next((r for r, free in enumerate(room) if n <= free), None)
        if r is None:
            rows.append([])
            room.append(capacity)
            r = len(rows) - 1
        rows[r].append(i)
        room[r] -= n
    return rows


def sample_mask(seq_ids: torch.Tensor) -> Any:
    """The attention mask of ``packing: isolated`` rows, built once per forward from the
    batch's ``seq_ids``: a query attends to the keys of its own sample at or before it.

    On CUDA a FlexAttention ``BlockMask`` (blocks of other samples are skipped); elsewhere
    a boolean ``(batch, 1, length, length)`` mask for ``scaled_dot_product_attention``
    (torch 2.13 has no FlexAttention backward on the CPU). Pass it to
    :func:`isolated_attention`.
    """
    if seq_ids.is_cuda:
        from torch.nn.attention.flex_attention import create_block_mask

        def same_sample(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return (seq_ids[b, q] == seq_ids[b, kv]) & (q >= kv)

        batch, length = seq_ids.shape
        return create_block_mask(same_sample, batch, None, length, length, device=seq_ids.device)
    length = seq_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=seq_ids.device).tril()
    return ((seq_ids[:, :, None] == seq_ids[:, None, :]) & causal)[:, None]


def isolated_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> Any:
    """Causal attention within each packed sample: ``q, k, v`` are ``(batch, heads,
    length, head_dim)``, ``mask`` is :func:`sample_mask`'s (FlexAttention on CUDA,
    compiled once per process; SDPA with the boolean mask elsewhere)."""
    if isinstance(mask, torch.Tensor):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return _flex_attention()(q, k, v, block_mask=mask)


@functools.cache
def _flex_attention() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)  # eager FlexAttention materialises the scores


class CountWithout:
    """Counts a batch's real tokens without the separators packing inserted (``eos_id``)."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = eos_id

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> int:
        mask = batch["attention_mask"]
        return int(mask.sum()) - int(((batch["input_ids"] == self.eos_id) & (mask == 1)).sum())


def scored_tokens(batch: Any) -> int:
    """The tokens a next-token loss scores in a batch: its ``labels`` other than ``-100``
    after each row's first position (the loss shifts the labels by one), as the Hugging
    Face Trainer counts ``num_items_in_batch``.

    Raises:
        WorkloadError: the batch holds no ``labels`` to count.
    """
    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    if not isinstance(labels, torch.Tensor):
        raise WorkloadError(
            "token-weighted accumulation counts the labels a loss scores, but the batch has "
            "no 'labels' tensor: give Tokens(loss_tokens=...) (a batch's scored tokens), or "
            "Tokens(loss='sample_mean') for a loss that is a mean per sample"
        )
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def dataset_lengths(dataset: Any, tokens: Tokens) -> list[int]:
    """Every sample's length: from ``tokens.lengths()``, checked against the dataset at a
    few samples, else by one pass over the dataset.

    Raises:
        WorkloadError: ``tokens.lengths()`` disagrees with the dataset.
    """
    n = len(dataset)
    if tokens.lengths is None:
        return [len(sample_ids(dataset[i], tokens.key)) for i in range(n)]
    lengths = [int(x) for x in tokens.lengths()]
    if len(lengths) != n:
        raise WorkloadError(
            f"tokens.lengths gave {len(lengths)} lengths but the dataset has {n} samples"
        )
    for i in sorted({0, n // 2, n - 1}) if n else []:
        actual = len(sample_ids(dataset[i], tokens.key))
        if lengths[i] != actual:
            raise WorkloadError(
                f"tokens.lengths disagrees with the dataset: length {lengths[i]} for sample "
                f"{i}, which has {actual} tokens"
            )
    return lengths


def grouped(
    order: Iterator[int], lengths: Sequence[int], mega: int, step: int | None = None
) -> Iterator[int]:
    """``order`` regrouped: each run of ``mega`` indices sorted by length, longest first,
    then cut into optimizer steps of ``step`` samples, the steps in spread order
    (:func:`spread_order`).

    Consecutive batches then hold samples of similar length (little padding), and a
    mega-batch holds the same samples as without grouping, so the data seen over a
    mega-batch does not change; deterministic given ``order``. The steps' spread order
    makes any run of consecutive steps (a trial's window) range over the mega-batch's
    lengths: in sorted order a window of 15 of 50 steps held the longest third only, and
    measured a rate the epoch does not run at. ``step=None``: the sorted order.
    """

    def regrouped(chunk: list[int]) -> list[int]:
        ordered = sorted(chunk, key=lambda i: -lengths[i])
        if not step or len(ordered) < 2 * step:
            return ordered
        steps = [ordered[i : i + step] for i in range(0, len(ordered), step)]
        tail = steps.pop() if len(steps[-1]) < step else []  # a partial step stays last
        return [i for k in spread_order(len(steps)) for i in steps[k]] + tail

    chunk: list[int] = []
    for index in order:
        chunk.append(index)
        if len(chunk) == mega:
            yield from regrouped(chunk)
            chunk = []
    yield from regrouped(chunk)


def spread_order(n: int) -> list[int]:
    """``range(n)`` in van der Corput order (by each index's bit-reversed value): every
    prefix, and a run of consecutive positions anywhere, ranges over the whole of
    ``range(n)`` (``spread_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]``)."""
    bits = max(1, (n - 1).bit_length())
    return sorted(range(n), key=lambda i: int(f"{i:0{bits}b}"[::-1], 2))


def longest_indices(lengths: Sequence[int], count: int) -> list[int]:
    """The indices of the ``count`` longest samples (the worst case for memory)."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:count]


def count_batch(batch: Any) -> tuple[int, int] | None:
    """``(real tokens, positions)`` of a batch with an ``attention_mask``; else ``None``."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if not isinstance(mask, torch.Tensor):
        return None
    return int(mask.sum()), mask.numel()
