"""Run folders written before both strategies wrote DCP shards still resume (read only).

That older layout (model/ or adapter/, trainer_state.pt with the positional optimizer, scheduler and RNG
states, state.json) is built here from a checkpoint of today's layout, holding the same state: the engine
restores the shards into a model, and its optimizer's and scheduler's state dicts and the saved RNG states
are written as that writer wrote them; the DCP parts are removed. A run resumed from it under ddp must be
the uninterrupted run, step for step and weight for weight, and write today's layout from then on; under
fsdp2 it is refused, naming why (its optimizer state is positional).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from contract.spec import TrainSpec
from tests.trainer.test_engine import crash_after, final_weights, read_events, small_spec, step_metrics
from trainer.checkpoints import load_state
from trainer.distributed.checkpoint import CONFIG_DIR, LAYOUT_FILE, RNG_DIR, SHARDS_DIR, rng_file
from trainer.engine import Engine, ExitCode


def _to_older_layout(folder: Path, spec: TrainSpec, probe: Path) -> None:
    engine = Engine(spec, probe)
    engine.setup(None)
    engine._restore(folder)  # the shards' weights, optimizer and scheduler, as a resume reads them
    rng = torch.load(folder / RNG_DIR / rng_file(0), weights_only=False)
    state = {
        "optimizer": engine.optimizer.state_dict(),
        "scheduler": engine.scheduler.state_dict(),
        "rng": rng,
    }
    torch.save(state, folder / "trainer_state.pt")
    for part in (SHARDS_DIR, RNG_DIR, CONFIG_DIR):
        shutil.rmtree(folder / part)
    (folder / LAYOUT_FILE).unlink()


def test_an_older_run_folder_resumes_under_ddp_as_the_uninterrupted_run(tmp_path):
    spec = TrainSpec.model_validate(small_spec())
    full = tmp_path / "full"
    assert Engine(spec, full).run() == ExitCode.OK

    part = tmp_path / "part"
    crash_after(spec, part, 3)  # checkpoints at steps 0 and 2 (interval 2)
    for folder in sorted((part / "checkpoints").glob("step-*")):
        _to_older_layout(folder, spec, tmp_path / f"probe-{folder.name}")
    older = part / "checkpoints" / "step-000002"
    state, trainer_state = load_state(older)
    assert state["step"] == 2 and trainer_state["optimizer"]["state"], "a positional optimizer state"
    assert not (older / SHARDS_DIR).exists()

    assert Engine(spec, part, resume=True).run() == ExitCode.OK
    a, b = step_metrics(read_events(full)), step_metrics(read_events(part))
    assert sorted(b) == [1, 2, 3, 4] and a == b
    wa, wb = final_weights(full), final_weights(part)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    newest = part / "checkpoints" / "step-000004"
    assert (newest / SHARDS_DIR).is_dir() and not (newest / "trainer_state.pt").exists()
    assert json.loads((newest / LAYOUT_FILE).read_text())["strategy"] == "ddp"


def test_an_older_run_folder_is_refused_under_fsdp2_naming_why(tmp_path):
    spec = TrainSpec.model_validate(small_spec())
    part = tmp_path / "part"
    crash_after(spec, part, 3)
    for folder in sorted((part / "checkpoints").glob("step-*")):
        _to_older_layout(folder, spec, tmp_path / f"probe-{folder.name}")
    sharded = TrainSpec.model_validate(small_spec(distributed={"strategy": "fsdp2"}))
    with pytest.raises(ValueError, match=r"trainer_state\.pt.*fsdp2.*not keyed by parameter"):
        Engine(sharded, part, resume=True).run()
