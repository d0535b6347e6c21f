"""The noise floor of a job's batch entropy: H̄ of one fixed policy over N fresh step batches.

A controller reads H̄ (the token-mean entropy of π_old over the step batch) once a step; even a policy that
does not change gives a different H̄ each step, because each step draws other prompts and other samples.
This measures that spread for a job spec at its batch size (optim.prompts_per_step × sampling.group_size):
it sets up the job's model (a checkpoint's weights with --checkpoint; the spec's SFT warm start first where
it has one), then draws N step batches exactly as training would, without any update, and reports
`contract.stability.noise_floor` of their H̄ (docs/ALGORITHMS.md §11.8).

Usage: python -m experiments.noise_floor SPEC.yaml [--samples 16] [--checkpoint DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from contract.spec import load_spec
from contract.stability import noise_floor
from trainer.engine import Engine, seed_everything, step_seed
from trainer.policy.update import no_grad_pass

# Seeds of the re-samples: far from any training step's (seed, step) so they repeat none of them.
RESAMPLE_STEP_BASE = 10_000_000


def resampled_entropies(engine: Engine, samples: int) -> list[float]:
    """H̄ of the engine's current policy over `samples` fresh step batches (no update between them)."""
    spec = engine.spec
    out = []
    for i in range(samples):
        seed_everything(step_seed(spec.seed, RESAMPLE_STEP_BASE + i))
        batch, _ = engine.collect(step=RESAMPLE_STEP_BASE + i)  # the re-sample's own sampling streams
        batch = batch.to(engine.device)
        old = no_grad_pass(engine.model, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
        mask = batch.response_mask.float()
        assert old.entropy is not None  # no_grad_pass measures it
        out.append(float((old.entropy * mask).sum() / mask.sum().clamp_min(1.0)))
    return out


def measure(spec_path: Path, samples: int, checkpoint: Path | None, out: Path) -> dict[str, float]:
    spec = load_spec(spec_path)
    engine = Engine(spec, out)
    seed_everything(spec.seed)
    engine.setup(checkpoint)
    if checkpoint is None and spec.sft is not None and spec.sft.steps > 0:
        engine._sft()
    with torch.no_grad():
        values = resampled_entropies(engine, samples)
    return {**noise_floor(values), "batch": float(spec.responses_per_step)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.noise_floor", description=__doc__.split("\n")[0]
    )
    parser.add_argument("spec", type=Path)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint folder (its model/)")
    parser.add_argument(
        "--out", type=Path, default=None, help="the engine's folder (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    if args.samples < 2:
        parser.error("--samples must be ≥ 2")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args.spec, args.samples, args.checkpoint, args.out or Path(tmp))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
