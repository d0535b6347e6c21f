"""Run by tests/trainer/test_process_count.py, plainly or under torchrun: `python ... SPEC OUT [--resume]`
runs the job as `python -m trainer run SPEC --out OUT [--resume]` does (Engine.run: events, checkpoints,
report), and records what each process did at each step, which the events (written by process 0, with
some metrics of its own share only) do not hold:
- OUT/samples/step-K-rank-R.json: each group (global prompt index) → its responses' token ids;
- OUT/metrics/step-K-rank-R.json: the process's step metrics (loss/policy is its share of the step loss)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from contract.spec import load_spec
from trainer.engine import Engine
from trainer.rollout.batch import Rollout


def responses_by_group(batch: Rollout) -> dict[str, list[list[int]]]:
    lengths = batch.response_mask.sum(-1).long()
    out: dict[str, list[list[int]]] = {}
    for row, group in enumerate(batch.group_ids.tolist()):
        ids = batch.input_ids[row, batch.prompt_length : batch.prompt_length + int(lengths[row])]
        out.setdefault(str(group), []).append(ids.tolist())
    return out


def main(spec_path: str, out: str, resume: bool) -> int:
    engine = Engine(load_spec(spec_path), out, resume=resume, progress=False)
    collect, train_step = engine.collect, engine.train_step
    samples, metrics = Path(out) / "samples", Path(out) / "metrics"

    def recording(step: int | None = None) -> tuple[Rollout, int]:
        batch, batches = collect(step)
        number = engine.step + 1 if step is None else step
        samples.mkdir(parents=True, exist_ok=True)
        path = samples / f"step-{number}-rank-{engine.rank}.json"
        path.write_text(json.dumps(responses_by_group(batch)))
        return batch, batches

    def recorded_step() -> dict[str, float]:
        values = train_step()
        metrics.mkdir(parents=True, exist_ok=True)
        (metrics / f"step-{engine.step}-rank-{engine.rank}.json").write_text(json.dumps(values))
        return values

    engine.collect = recording  # type: ignore[method-assign]
    engine.train_step = recorded_step  # type: ignore[method-assign]
    return int(engine.run())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], "--resume" in sys.argv[3:]))
