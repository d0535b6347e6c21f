"""Writing full weights as a transformers folder while they are gathered, never all at once.

Both places that turn a (possibly sharded) policy into a folder other code loads use this: the checkpoint's
consolidated `model/` folder (trainer.distributed.checkpoint, rank 0 writes) and the folder vLLM is built
from (trainer.rollout.vllm_engine, every process its own). The tensors come from `strategy.full_state` one at a
time; each is moved to host memory and added to the current safetensors file, which is written and dropped
once the next tensor would take it past `file_bytes` (a larger tensor goes alone in its file). So a process
holds at most one file's tensors and the one just gathered beside its model: the export of a 642M-parameter
model held its full 2.57 GB on rank 0 before (docs/DISTRIBUTED.md, "Memory").

Layout as transformers writes it: one file is `model.safetensors`; more are
`model-00001-of-0000N.safetensors` with `model.safetensors.index.json` naming each tensor's file.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# At most this many bytes of tensors per file (a larger tensor alone in its file): what a writer holds in
# host memory beside the model at any time, besides the tensor being gathered.
FILE_BYTES = 256 * 2**20


def write_weights(
    weights: Iterable[tuple[str, Tensor]],
    folder: Path,
    *,
    tied_lm_head: bool = False,
    file_bytes: int = FILE_BYTES,
    write: bool = True,
) -> int:
    """Writes `weights` ((name, full tensor) in transformers' names) into safetensors files in `folder`;
    returns the bytes written. `tied_lm_head`: leave out `lm_head.weight` (tied to the embeddings: loading
    ties it again). With `write=False` the iterator is only drained: the other processes of a collective
    `full_state` that rank 0 alone writes."""
    from safetensors.torch import save_file

    if not write:
        for _ in weights:
            pass
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    files: list[list[str]] = []
    chunk: dict[str, Tensor] = {}
    held = total = 0

    def flush() -> None:
        nonlocal chunk, held
        if chunk:
            save_file(chunk, str(folder / f"part-{len(files)}.safetensors"), metadata={"format": "pt"})
            files.append(list(chunk))
            chunk, held = {}, 0

    for name, tensor in weights:
        if tied_lm_head and name == "lm_head.weight":
            continue
        value = tensor.to("cpu").contiguous()  # (full_state gives detached tensors)
        size = value.numel() * value.element_size()
        if held + size > file_bytes:
            flush()
        chunk[name] = value
        held, total = held + size, total + size
    flush()
    if len(files) == 1:
        os.replace(folder / "part-0.safetensors", folder / SINGLE_FILE)
        return total
    weight_map: dict[str, str] = {}
    for i, names in enumerate(files):  # transformers' names, now that the number of files is known
        final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        os.replace(folder / f"part-{i}.safetensors", folder / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=1))
    return total


def write_folder(
    weights: Iterable[tuple[str, Tensor]],
    folder: Path,
    *,
    config: Any,
    generation_config: Any = None,
    tokenizer: Any = None,
    file_bytes: int = FILE_BYTES,
) -> int:
    """A folder `AutoModelForCausalLM.from_pretrained` (and vLLM) loads: the weights as they come, then
    the config, the generation config and the tokenizer where given. Returns the weights' bytes."""
    tied = bool(getattr(config, "tie_word_embeddings", False))
    dtypes: list[torch.dtype] = []

    def noting_dtype() -> Iterator[tuple[str, Tensor]]:
        for name, tensor in weights:
            if not dtypes and tensor.is_floating_point():
                dtypes.append(tensor.dtype)
            yield name, tensor

    total = write_weights(noting_dtype(), folder, tied_lm_head=tied, file_bytes=file_bytes)
    config = copy.deepcopy(config)
    if dtypes:  # as save_pretrained does: the config names the dtype the weights were written in
        config.dtype = str(dtypes[0]).removeprefix("torch.")
    config.save_pretrained(folder)
    if generation_config is not None:
        generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return total
