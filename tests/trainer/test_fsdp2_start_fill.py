"""A fresh fsdp2 × 2 start from a local HF folder of safetensors: every process reads its own shards from
the files (`FSDP2.prepare(from_files=...)`, trainer.distributed.shard_load) and ends with the very model the
rank-0 broadcast gives (`prepare(from_rank0=True)`) and a plain from_pretrained load: every parameter's full
tensor and the logits bit for bit, in float32 and bfloat16 (the files are float32: the conversion is
from_pretrained's). The model is bench/make_config_model.py's, with an odd intermediate size, so that a
shard of the MLP's rows is uneven (126 and 125 of 251). Launches tests/trainer/start_fill_worker.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("start_fill_worker.py")
SHAPE = ["--layers", "2", "--hidden", "64", "--intermediate", "251", "--heads", "4", "--kv-heads", "2"]
TIMEOUT_S = 300 * float(os.environ.get("STARE_TEST_TIMEOUT_SCALE", "1"))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("start-fill-model") / "model"
    made = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "make_config_model.py"), str(folder), *SHAPE],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-4000:]
    return folder


@pytest.fixture(scope="module")
def reports(model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("start-fill")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*launcher, str(WORKER), str(model), str(tmp)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return [torch.load(tmp / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_rank_reading_its_shards_gives_the_rank0_broadcast_model_bit_for_bit(reports, dtype):
    plain = reports[0][f"plain-{dtype}"]
    for report in reports:
        old, new = report[f"rank0-{dtype}"], report[f"files-{dtype}"]
        assert set(new["state"]) == set(old["state"]) and len(new["state"]) > 10
        for name, tensor in old["state"].items():
            assert new["state"][name].dtype == getattr(torch, dtype), name
            assert torch.equal(new["state"][name], tensor), name
            assert torch.equal(tensor, plain["state"][name]), name
        assert set(new["buffers"]) == set(old["buffers"]) and new["buffers"]  # rotary inv_freq
        for name, buffer in old["buffers"].items():
            assert torch.equal(new["buffers"][name], buffer), name
        assert torch.equal(new["logits"], old["logits"])
    # tied: the LM head is the embeddings (given once by full_state), as from_pretrained ties them
    assert "lm_head.weight" not in reports[0][f"files-{dtype}"]["state"]
    assert torch.equal(plain["state"]["lm_head.weight"], plain["state"]["model.embed_tokens.weight"])


@pytest.mark.slow
def test_each_rank_reads_only_its_own_slices(reports):
    """The files path read, per rank, exactly the elements of its shards (load_shards_from_files' count),
    and the two ranks' counts add up to the whole model once: no process read the whole model."""
    total = sum(t.numel() for t in reports[0]["files-float32"]["state"].values())
    per_rank = [report["read_elements"] for report in reports]
    for report, counts in zip(reports, per_rank, strict=True):
        assert counts == [report[f"files-{d}"]["local_elements"] for d in ("float32", "bfloat16")]
    assert per_rank[0][0] + per_rank[1][0] == total
    assert max(per_rank[0][0], per_rank[1][0]) < 0.51 * total


@pytest.mark.slow
def test_an_engine_run_from_the_folder_fills_from_the_files_and_agrees_with_ddp(model, tmp_path):
    """`python -m trainer run` under torchrun from the folder (placement.start_fill: each fsdp2 process reads
    its shards from the files; ddp processes load the whole model): one step, the same metrics (the step's
    entropy and log-probabilities are the initial weights'), within test_fsdp2_engine's TOL."""
    import json

    from tests.trainer.launch import run_trainer
    from tests.trainer.test_engine import small_spec
    from tests.trainer.test_fsdp2_engine import COMPARED, TOL

    steps = {}
    for strategy in ("ddp", "fsdp2"):
        spec = small_spec(
            model={"name": str(model)},
            distributed={"strategy": strategy, "processes_per_node": 2},
            optim={"steps": 1},
        )
        out = run_trainer(tmp_path, strategy, spec, timeout=TIMEOUT_S)
        events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        steps[strategy] = [e["metrics"] for e in events if e["type"] == "step"]
    assert len(steps["ddp"]) == len(steps["fsdp2"]) == 1
    for key in COMPARED:
        assert abs(steps["ddp"][0][key] - steps["fsdp2"][0][key]) <= TOL, key
