"""Each process fills its own shards of a sharded model from the safetensors files of its weights, reading
only its slice of each tensor: how a fresh fsdp2 run above one process starts where the weights are such
files (trainer.models.weights_files; `FSDP2.prepare(model, from_files=...)`), so that no process ever holds
the whole model (docs/DISTRIBUTED.md, "Loading").
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from trainer.models import hf_model


def load_shards_from_files(model: Any, files: Sequence[Path]) -> int:
    """Copies every parameter and persistent buffer of `model` (the transformers model, under peft's wrapper
    if any) from the safetensors `files`: a DTensor's local shard reads only its own rows (one positioned
    read of their bytes, straight into the shard where the dtypes agree: no memory-mapping, whose pages
    would count in the process's RSS), a plain tensor the whole; each is converted to the model's dtype as
    it is copied, as from_pretrained converts. Tied weights are one parameter, filled once, from whichever
    of their names the files hold (the embeddings, or the LM head). Every other key of the model must be in
    the files (a clear error names those missing); keys of the files the model lacks are left, as
    from_pretrained leaves them. Returns the number of elements read."""
    inner = hf_model(model)
    targets: dict[str, Tensor] = dict(inner.named_parameters())  # tied parameters once
    for module_name, module in inner.named_modules():
        for leaf, buffer in module.named_buffers(recurse=False):
            if buffer is not None and leaf not in module._non_persistent_buffers_set:
                targets[f"{module_name}.{leaf}" if module_name else leaf] = buffer
    partners: dict[str, str] = {}
    for tied, source in dict(getattr(inner, "all_tied_weights_keys", None) or {}).items():
        partners[tied], partners[source] = source, tied
    entries: dict[str, _Entry] = {}
    for path in files:
        entries.update(_header(Path(path)))
    keys = {name: name if name in entries else partners.get(name) for name in targets}
    missing = sorted(name for name, key in keys.items() if key not in entries)
    if missing:
        raise ValueError(f"{Path(files[0]).parent}: the safetensors files lack {missing}")
    read = 0
    with contextlib.ExitStack() as stack, torch.no_grad():
        opened: dict[Path, io.FileIO] = {}
        for name, target in targets.items():
            key = keys[name]
            assert key is not None  # (checked above)
            entry = entries[key]
            if entry.path not in opened:
                opened[entry.path] = stack.enter_context(io.FileIO(entry.path, "rb"))
            read += _fill(target, entry, opened[entry.path], key)
    return read


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


@dataclass(frozen=True)
class _Entry:
    """Where a tensor's bytes are in a safetensors file: row-major, little-endian."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset of its first element


def _header(path: Path) -> dict[str, _Entry]:
    """The tensors of a safetensors file: an 8-byte little-endian header length, a JSON header naming each
    tensor's dtype, shape and byte range (relative to the header's end), then the data."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    entries = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: {key} is stored as {info['dtype']}, which is not read here")
        begin = 8 + size + int(info["data_offsets"][0])
        entries[key] = _Entry(path, _DTYPES[info["dtype"]], tuple(info["shape"]), begin)
    return entries


def _fill(target: Tensor, entry: _Entry, f: io.FileIO, key: str) -> int:
    """Copies this process's rows of the stored tensor `key` into `target`; returns the elements read."""
    if entry.shape != tuple(target.shape):
        raise ValueError(f"{key}: the file holds shape {list(entry.shape)}, the model {list(target.shape)}")
    local, first = target, 0
    if isinstance(target, DTensor):
        local = target.to_local()
        sizes, offsets = compute_local_shape_and_global_offset(
            target.shape, target.device_mesh, target.placements
        )
        if tuple(sizes) != tuple(local.shape):
            raise ValueError(f"{key}: a shard of shape {list(local.shape)} where {list(sizes)} was expected")
        if list(offsets[1:]) != [0] * (len(offsets) - 1) or tuple(sizes[1:]) != entry.shape[1:]:
            raise ValueError(f"{key}: only shards of whole rows (Shard(0)) are read from files")
        first = offsets[0] if offsets else 0
    if local.numel() == 0:
        return 0
    row_elements = math.prod(entry.shape[1:])
    itemsize = torch.empty((), dtype=entry.dtype).element_size()
    direct = local.dtype == entry.dtype and local.device.type == "cpu" and local.is_contiguous()
    into = local if direct else torch.empty(tuple(local.shape), dtype=entry.dtype)
    view = into.view(-1).view(torch.uint8).numpy().data  # the tensor's own bytes, written in place
    f.seek(entry.start + first * row_elements * itemsize)
    done = 0
    while done < len(view):  # one read returns at most ~2 GiB on Linux
        got = f.readinto(view[done:])
        if not got:
            raise ValueError(f"{entry.path}: {key} ends before its recorded size")
        done += got
    if not direct:
        local.copy_(into)
    return int(local.numel())
