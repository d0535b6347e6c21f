"""grpo_ds with a KL reference, LoRA after an SFT warm-start (with clip_cov), and bf16 compute, under
distributed.strategy fsdp2 in the real engine: `python -m trainer run` under torchrun, 2 processes, gloo.

Five launches, shared through module-scoped fixtures (each costs 10–20 s here):
- grpo_ds + KL (optim.kl_beta > 0, so π_ref is built, under fsdp2 from the gathered full weights) as ddp × 2
  and as fsdp2 × 2;
- LoRA + SFT warm-start + clip_cov + KL as ddp × 2 and as fsdp2 × 2 (π_ref is then the merged policy after
  SFT; clip_cov's window is widened so that it zeroes tokens on this model, whose covariances are < 1);
- the grpo_ds + KL spec as fsdp2 × 2 with mixed_precision.param_dtype bfloat16 (reduce float32), against
  the first pair's fsdp2 run.
Every job is micro-batched with uneven shares (3 prompts × 4 samples over 2 processes: 8 and 4 rows in
micro-batches of 3, a padding micro-batch on one process), 2 steps.

The seed is one whose step 1 has mixed rewards in every group. With an all-equal-reward step 1 (seed 3
here), the only gradient is the KL term's at π = π_ref: float noise of ~1e-8 from the reference's and the
policy's passes differing in the last bits, which AdamW normalises into full-size lr steps in noise-given
directions, so ddp and fsdp2 then differ at step 2 by far more than rounding (measured: kl/ref_k3 3.7e-4
against 1.3e-5). A real gradient dominates that noise.

Tolerances.
- ddp against fsdp2 (float32): TOL = 1e-4 absolute on every step metric, as tests/trainer/test_fsdp2_engine.py
  derives it (the same sums in another order: a few 1e-6 per update; step 2 samples from weights that differ
  by that order). Measured here: ≤ 2.4e-7 (gradient norm), every other metric ≤ 3e-9.
- bf16 against float32: bf16 keeps 8 significant bits, so one rounding is off by at most u = 2⁻⁸ relative.
  Under the mixed-precision policy each matmul's operands (the gathered weights and the activations) are
  rounded to bf16 and its products summed in float32; the sharded master weights, the gradients' reduction
  and AdamW stay float32. A metric (a mean over ~100 tokens of per-token quantities, or a gradient norm) is
  then off by a few roundings' worth: we allow BF16_REL = 4u = 1.6 % relative, plus TOL absolute for the
  metrics near 0. Measured: ≤ 0.8u (kl/ref_k3 3.1e-3 relative, gradient norm 1.4e-3, entropy 3e-5). The
  rollouts must be the same samples (a sampled token that flips is another trajectory, not rounding):
  rewards and lengths equal. That bf16 really computed is seen in the gradient norm: it moves off float32's
  by more than 10 × TOL (measured 3.5e-3), which float32's reordering never does (2.4e-7).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.launch import run_trainer
from tests.trainer.test_engine import read_events, small_spec, step_metrics

SEED = 9  # step 1: mixed rewards in all three groups (see the module docstring)
TOL = 1e-4
BF16_REL = 4 * 2**-8
EXPORT_ATOL = 1e-5  # merged (W + s·BA)x against Wx + s·B(Ax), float32, |logits| ≈ 1: measured 3.3e-7
KL_BETA = 0.1
# merge_on_save: the checkpoints get the merged model/ beside adapter/
LORA: dict[str, Any] = {"r": 8, "alpha": 16, "merge_on_save": True}
# cov_t = (Â_t − mean Â)(ℓ_t − mean ℓ) stays below 1 on this model: the default window (1, 5) holds no token.
CLIP_COV = {"clip_cov_ratio": 0.2, "cov_lower": 0.0, "cov_upper": 5.0}
SFT = {"steps": 4, "batch_size": 16}
IDS = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])


def _spec(strategy: str, *, lora_sft: bool = False, bf16: bool = False) -> dict[str, Any]:
    distributed: dict[str, Any] = {"strategy": strategy, "processes_per_node": 2}
    if bf16:
        distributed["mixed_precision"] = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    spec = small_spec(
        seed=SEED,
        distributed=distributed,
        optim={"steps": 2, "micro_batch_size": 3, "grad_clip": 1.0, "kl_beta": KL_BETA},
        checkpoint={"interval": 2, "keep_last": 5},
    )
    spec["algorithm"] = {"name": "grpo_ds"}
    if lora_sft:
        spec["algorithm"] = {"name": "clip_cov", "params": CLIP_COV}
        spec["model"] = {"name": "tiny-arith", "lora": LORA}
        spec["sft"] = SFT
    return spec


def _launch(tmp: Path, name: str, spec: dict[str, Any]) -> Path:
    return run_trainer(tmp, name, spec)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return Path(tmp_path_factory.mktemp("fsdp2_algorithms"))


@pytest.fixture(scope="module")
def grpo_kl(tmp) -> tuple[Path, Path]:
    return _launch(tmp, "grpo-ddp", _spec("ddp")), _launch(tmp, "grpo-fsdp2", _spec("fsdp2"))


@pytest.fixture(scope="module")
def lora_sft(tmp) -> tuple[Path, Path]:
    ddp = _launch(tmp, "lora-ddp", _spec("ddp", lora_sft=True))
    return ddp, _launch(tmp, "lora-fsdp2", _spec("fsdp2", lora_sft=True))


@pytest.fixture(scope="module")
def bf16(tmp) -> Path:
    return _launch(tmp, "grpo-fsdp2-bf16", _spec("fsdp2", bf16=True))


def _steps(out: Path) -> dict[int, dict[str, float]]:
    steps = step_metrics(read_events(out))
    assert sorted(steps) == [1, 2]
    return steps


def _compared(metrics: dict[str, float]) -> dict[str, float]:
    """Every step metric but memory/, which differs between strategies by design (step_metrics has left
    out perf/, the timings)."""
    return {k: v for k, v in metrics.items() if not k.startswith("memory/")}


def _assert_same_steps(ddp: Path, fsdp: Path) -> dict[int, dict[str, float]]:
    a, b = _steps(ddp), _steps(fsdp)
    for step in (1, 2):
        assert _compared(a[step]).keys() == _compared(b[step]).keys()
        for key, value in _compared(a[step]).items():
            assert abs(b[step][key] - value) <= TOL, (step, key, value, b[step][key])
    return a


def _assert_sharded(ddp: Path, fsdp: Path) -> None:
    """Each fsdp2 process holds half the parameter + gradient + AdamW bytes of a ddp process."""
    ddp_steps, fsdp_steps = _steps(ddp), _steps(fsdp)
    for step in (1, 2):
        ddp_mine = ddp_steps[step]["memory/model_state_bytes"]
        assert fsdp_steps[step]["memory/model_state_bytes_all"] == ddp_mine
        assert abs(fsdp_steps[step]["memory/model_state_bytes"] - ddp_mine / 2) <= 0.01 * ddp_mine


def _logits(model_or_folder: Any) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = model_or_folder
    if isinstance(model, Path):
        model = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def _checkpoint(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:06d}"


def _assert_reference_is_step_0(out: Path) -> None:
    """π_ref on disk is the policy as RL starts (after SFT, LoRA merged): the step-0 model/, bit for bit."""
    from safetensors.torch import load_file

    reference = load_file(str(out / "reference" / "model.safetensors"))
    start = load_file(str(_checkpoint(out, 0) / "model" / "model.safetensors"))
    tied = {"lm_head.weight": "model.embed_tokens.weight"}  # one of the two names is saved
    assert not [name for name in reference if "lora" in name]
    for name, tensor in reference.items():
        torch.testing.assert_close(tensor, start[name if name in start else tied[name]], rtol=0, atol=0)


@pytest.mark.slow
def test_grpo_ds_with_kl_reference_matches_ddp_and_shards(grpo_kl):
    ddp, fsdp = grpo_kl
    steps = _assert_same_steps(ddp, fsdp)
    assert steps[1]["kl/ref_k3"] <= TOL  # π = π_ref at the first step
    assert steps[2]["kl/ref_k3"] > 100 * TOL  # step 1 moved π off π_ref: the KL term is live at step 2
    assert steps[1]["actor/grad_norm"] > 0.1 and steps[2]["actor/grad_norm"] > 0.1
    assert abs(steps[2]["entropy/mean"] - steps[1]["entropy/mean"]) > 10 * TOL  # TOL is not vacuous
    _assert_sharded(ddp, fsdp)
    _assert_reference_is_step_0(fsdp)
    torch.testing.assert_close(
        _logits(_checkpoint(fsdp, 2) / "model"), _logits(_checkpoint(ddp, 2) / "model"), rtol=0, atol=TOL
    )


def _sft_losses(out: Path) -> list[float]:
    return [e["loss"] for e in read_events(out) if e["type"] == "sft"]


@pytest.mark.slow
def test_lora_after_sft_with_clip_cov_matches_ddp(lora_sft):
    ddp, fsdp = lora_sft
    ddp_sft, fsdp_sft = _sft_losses(ddp), _sft_losses(fsdp)
    assert len(ddp_sft) == len(fsdp_sft) == 1 and math.isfinite(ddp_sft[0])
    assert abs(ddp_sft[0] - fsdp_sft[0]) <= TOL
    steps = _assert_same_steps(ddp, fsdp)
    for step in (1, 2):
        assert steps[step]["clip_cov/zeroed_fraction"] > 0  # clip_cov's pick acted
    assert steps[2]["kl/ref_k3"] > TOL  # π_ref (the merged policy after SFT) is not the live policy
    _assert_sharded(ddp, fsdp)
    _assert_reference_is_step_0(fsdp)
    torch.testing.assert_close(
        _logits(_checkpoint(fsdp, 2) / "model"), _logits(_checkpoint(ddp, 2) / "model"), rtol=0, atol=TOL
    )


def _from_shards(checkpoint: Path) -> Any:
    """The peft model the trainer held at `checkpoint` (adapters unmerged): the spec's base model (the shards
    hold the adapters only) with the adapters read from the DCP shards."""
    import torch.distributed.checkpoint as dcp

    from trainer.distributed.checkpoint import SHARDS_DIR
    from trainer.models import apply_lora, build_tiny_arith

    model = apply_lora(
        build_tiny_arith(SEED)[0], r=LORA["r"], alpha=LORA["alpha"], dropout=0.0, target_modules=None
    )
    adapters = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    state = {"model": adapters}
    dcp.load(state, storage_reader=dcp.FileSystemReader(checkpoint / SHARDS_DIR), no_dist=True)
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    assert not unexpected and all("lora_" not in k for k in missing), (missing, unexpected)
    return model


def _split(model: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(adapter weights, frozen base weights) by name."""
    named = {name: p.detach() for name, p in model.named_parameters()}
    adapters = {n: t for n, t in named.items() if "lora_" in n}
    return adapters, {n: t for n, t in named.items() if n not in adapters}


@pytest.mark.slow
def test_lora_under_fsdp2_shards_adapters_keeps_the_base_and_exports_merged(lora_sft):
    import torch.distributed.checkpoint as dcp
    from peft import PeftModel

    from trainer.distributed.checkpoint import SHARDS_DIR
    from trainer.models import apply_lora, build_tiny_arith

    ddp, fsdp = lora_sft
    last = _checkpoint(fsdp, 2)
    # Sharded, and the adapters only: every adapter tensor was written as two dim-0 halves, one per
    # process; the frozen base (the spec's model) is in no checkpoint, under either strategy.
    metadata = dcp.FileSystemReader(last / SHARDS_DIR).read_metadata().state_dict_metadata
    model_keys = [k for k in metadata if k.startswith("model.")]
    assert len(model_keys) == 8 and all("lora_" in k for k in model_keys), model_keys  # q, v; A, B; 2 layers
    for key in model_keys:
        entry: Any = metadata[key]
        rows = entry.size[0]
        halves = sorted((c.offsets[0], c.sizes[0]) for c in entry.chunks)
        assert halves == [(0, rows // 2), (rows // 2, rows // 2)], key
    ddp_saved = dcp.FileSystemReader(_checkpoint(ddp, 2) / SHARDS_DIR).read_metadata().state_dict_metadata
    assert sorted(k for k in ddp_saved if k.startswith("model.")) == sorted(model_keys)

    initial = apply_lora(
        build_tiny_arith(SEED)[0], r=LORA["r"], alpha=LORA["alpha"], dropout=0.0, target_modules=None
    )
    start_adapters, _ = _split(_from_shards(_checkpoint(fsdp, 0)))
    trained = _from_shards(last)
    adapters, _ = _split(trained)
    assert all(float(t.abs().max()) > 0 for n, t in start_adapters.items() if "lora_B" in n)  # SFT trained B
    moved = max(float((adapters[n] - start_adapters[n]).abs().max()) for n in adapters)
    assert moved > 10 * TOL  # RL trained the adapters

    # model/ loads with from_pretrained, LoRA merged, and gives the trainer's (unmerged adapters on the
    # spec's base) logits: the base stayed frozen through SFT and RL.
    from safetensors.torch import load_file

    merged = last / "model"
    assert not (merged / "adapter_config.json").exists()
    assert not [name for name in load_file(str(merged / "model.safetensors")) if "lora" in name]
    torch.testing.assert_close(_logits(merged), _logits(trained), rtol=0, atol=EXPORT_ATOL)
    assert float((_logits(merged) - _logits(initial)).abs().max()) > 100 * EXPORT_ATOL  # not the base model

    # adapter/, gathered from the shards, as peft saves it: on the base model it is the trained policy.
    with_adapter = PeftModel.from_pretrained(build_tiny_arith(SEED)[0], str(last / "adapter"))
    torch.testing.assert_close(_logits(with_adapter), _logits(trained), rtol=0, atol=0)


@pytest.mark.slow
def test_bf16_compute_follows_float32_within_the_bf16_bound(grpo_kl, bf16):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from trainer.distributed.checkpoint import SHARDS_DIR

    fp32, low = _steps(grpo_kl[1]), _steps(bf16)
    for step in (1, 2):
        assert all(math.isfinite(v) for v in low[step].values()), step
        for key in ("reward/mean", "response/length_mean", "response/truncated_fraction"):
            assert low[step][key] == fp32[step][key], (step, key, "the rollouts differ: not a rounding error")
        for key, value in _compared(fp32[step]).items():
            bound = BF16_REL * max(abs(value), abs(low[step][key])) + TOL
            assert abs(low[step][key] - value) <= bound, (step, key, value, low[step][key])
        # the master copy, gradients and AdamW stay float32: the same bytes as the float32 run
        assert low[step]["memory/model_state_bytes"] == fp32[step]["memory/model_state_bytes"]
    # bf16 really computed: the gradient norm moves off float32's by more than float32's reordering can.
    assert max(abs(low[s]["actor/grad_norm"] - fp32[s]["actor/grad_norm"]) for s in (1, 2)) > 10 * TOL
    metadata = dcp.FileSystemReader(_checkpoint(bf16, 2) / SHARDS_DIR).read_metadata().state_dict_metadata
    model = [
        m for k, m in metadata.items() if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    ]
    assert model and {m.properties.dtype for m in model} == {torch.float32}  # the sharded master weights
