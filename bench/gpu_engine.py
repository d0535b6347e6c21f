"""The `engine` section of bench_gpu.py (issue 3): whole optimiser steps of the engine on a Llama-shaped
model with random bf16 weights, with the update's model FLOP utilisation (bench_gpu.py's docstring, item 4)."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from gpu_tools import GIB, H200_DENSE_BF16_TFLOPS, log, release

from trainer.algos.kernels import BACKEND_ENV

LLAMA_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151_936,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
LLAMA_QUICK = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def build_random_llama(folder: Path, shape: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """A Llama-shaped model with random bf16 weights and a character tokenizer padded with filler tokens
    to the model's vocabulary (every sampled id decodes), saved as a local HF folder."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from trainer.models import build_tiny_arith_tokenizer

    tokenizer = build_tiny_arith_tokenizer(vocab_size=shape["vocab_size"])
    vocab = tokenizer.get_vocab()
    config = LlamaConfig(
        **shape,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<eos>"],
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Every response runs to the full budget (EOS is masked until then), so steps are comparable.
    model.generation_config = GenerationConfig(
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<eos>"],
        min_new_tokens=max_new_tokens,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    del model
    release()
    return {"parameters": params, "embedding_parameters": embedding, "layer_parameters": params - embedding}


def update_flops(shape: dict[str, Any], layer_params: int, events: dict[str, Any]) -> float:
    """Executed model FLOPs of one update (forward + backward), from the step's token counts."""
    d, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    rows = events["rows"]
    prompt = events["prompt_tokens_per_row"]
    response = events["response_tokens_per_row"]
    prompts = events["distinct_prompts"]
    run_tokens = prompts * prompt + rows * (response - 1)  # shared prompts once; last token not run
    # Attention scores and values: 2 matmuls × 2 FLOPs × d per (query, key) pair, causal.
    pairs = prompts * prompt * (prompt + 1) / 2 + rows * sum(prompt + t for t in range(1, response))
    forward = 2 * layer_params * run_tokens + 4 * layers * d * pairs + 2 * vocab * d * rows * response
    return 3.0 * forward


def section_engine(
    device: torch.device, quick: bool, algorithms: list[str], matmul_tflops: float | None
) -> dict[str, Any]:
    shape = LLAMA_QUICK if quick else LLAMA_05B
    prompts, group, new_tokens = (2, 4, 8) if quick else (16, 8, 256)
    steps = 3 if quick else 4
    result: dict[str, Any] = {
        "shape": shape,
        "prompts_per_step": prompts,
        "group_size": group,
        "max_new_tokens": new_tokens,
        "timed_steps": steps - 1,
        "runs": [],
    }
    previous_backend = os.environ.get(BACKEND_ENV)
    try:
        _engine_runs(result, shape, algorithms, device, matmul_tflops, prompts, group, new_tokens, steps)
    finally:  # each run sets the kernel backend through the environment; leave it as it was
        if previous_backend is None:
            os.environ.pop(BACKEND_ENV, None)
        else:
            os.environ[BACKEND_ENV] = previous_backend
    return result


def _engine_spec(name: str, folder: Path, prompts: int, group: int, new_tokens: int, steps: int) -> Any:
    """The run's TrainSpec: algorithm `name` on the random model in `folder`, responses forced to full length."""
    from contract.spec import TrainSpec

    params: dict[str, Any] = {}
    data: dict[str, Any] = {
        "seed": 0,
        "model": {"name": str(folder), "dtype": "bfloat16"},
        "task": {"source": "arithmetic", "train_size": 512, "eval_size": 0},
        "verifier": {"name": "exact"},
        "algorithm": {"name": name, "params": params},
        "sampling": {"group_size": group, "temperature": 1.0, "max_new_tokens": new_tokens},
        "optim": {
            "lr": 1e-6,
            "steps": steps,
            "prompts_per_step": prompts,
            "micro_batch_size": prompts * group,
            "grad_clip": 1.0,
            # Random weights earn all-zero rewards: with the skip every row would be scored without
            # autograd and the update (and its MFU) would measure no backward at all.
            "skip_zero_advantage": False,
        },
        "checkpoint": {"interval": 1000, "keep_last": 1},
        "evaluation": {"interval": 0},
    }
    if name == "stare":
        data["algorithm"]["gate"] = {"target_entropy": 100.0}  # gate on: tokens ranked every step
    return TrainSpec.model_validate(data)


def _engine_steps(engine: Any, steps: int, device: torch.device, algorithm: str) -> list[dict[str, Any]]:
    """`steps` optimiser steps of the engine, each step's times, tokens/s, entropy, loss (and peak memory)."""
    per_step = []
    for step in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        metrics = engine.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        record = {
            "step": step + 1,
            "step_seconds": metrics["perf/step_seconds"],
            "generation_seconds": metrics["perf/generation_seconds"],
            "update_seconds": metrics["perf/update_seconds"],
            "tokens_per_second": metrics["perf/tokens_per_second"],
            "response_length_mean": metrics["response/length_mean"],
            "entropy_mean": metrics["entropy/mean"],
            "loss": metrics.get("loss/policy"),
        }
        if device.type == "cuda":
            record["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        per_step.append(record)
        log(f"engine {algorithm} step {step + 1}: {json.dumps(record)}")
    return per_step


def _engine_runs(
    result: dict[str, Any],
    shape: dict[str, Any],
    algorithms: list[str],
    device: torch.device,
    matmul_tflops: float | None,
    prompts: int,
    group: int,
    new_tokens: int,
    steps: int,
) -> None:
    from trainer.engine import Engine
    from trainer.tasks.sources import render_prompt

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        t0 = time.perf_counter()
        result["model"] = build_random_llama(folder, shape, new_tokens)
        result["build_seconds"] = time.perf_counter() - t0
        log(f"engine: model built ({result['model']['parameters'] / 1e6:.1f} M parameters)")
        for algorithm in algorithms:
            name, _, backend = algorithm.partition(":")
            os.environ[BACKEND_ENV] = backend or "auto"
            spec = _engine_spec(name, folder, prompts, group, new_tokens, steps)
            out = Path(tmp) / f"run-{name}"
            engine = Engine(spec, out, progress=False)
            engine.setup()
            per_step = _engine_steps(engine, steps, device, algorithm)
            timed = per_step[1:]
            rows = prompts * group
            response = new_tokens
            # Left padding makes every row as wide as the batch's longest prompt, and the padded positions
            # are computed too: the longest prompt of the task is the width counted.
            rendered = [
                render_prompt(e, spec.task.prompt_template, engine.tokenizer) for e in engine.prompts.examples
            ]
            prompt_tokens = max(len(ids) for ids in engine.tokenizer(rendered)["input_ids"])
            counts = {
                "rows": rows,
                "distinct_prompts": prompts,
                "prompt_tokens_per_row": prompt_tokens,
                "response_tokens_per_row": response,
            }
            flops = update_flops(shape, result["model"]["layer_parameters"], counts)
            update_s = statistics.median(r["update_seconds"] for r in timed)
            run = {
                "algorithm": name,
                "kernel_backend": backend or "auto",
                "steps": per_step,
                "median_step_seconds": statistics.median(r["step_seconds"] for r in timed),
                "median_generation_seconds": statistics.median(r["generation_seconds"] for r in timed),
                "median_update_seconds": update_s,
                "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in timed),
                "response_tokens_per_step": rows * response,
                "update_flops": flops,
                "update_tflops": flops / update_s / 1e12,
                "mfu_vs_datasheet": flops / update_s / 1e12 / H200_DENSE_BF16_TFLOPS,
                "mfu_vs_measured_matmul": (flops / update_s / 1e12 / matmul_tflops)
                if matmul_tflops
                else None,
                "generation_tokens_per_second": rows
                * response
                / statistics.median(r["generation_seconds"] for r in timed),
            }
            result["runs"].append(run)
            del engine
            release()
