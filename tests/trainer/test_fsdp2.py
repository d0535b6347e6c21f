"""FSDP2 sharding and sharded checkpoints across real processes (trainer.distributed), on the tiny model.

Launches tests/trainer/fsdp2_worker.py four times: one plain process, two fsdp2 processes under torchrun
(one node), one process resuming the two-process checkpoint, and a two-node launch (two torchrun agents on
this machine). Each launch batches many checks, since every torchrun start costs seconds on two cores.

Loss tolerance. One process and two processes run the same arithmetic in another order (each process sums
its rows, the gradients are reduce-scattered), so their losses differ by float rounding only. The bound
per step is the larger of
  - 10 × the spread measured in one process when only the order of the batch's rows changes (three random
    permutations: the same effect, sampled; 10× because three samples do not give the extreme), and
  - eps₃₂ · √n · |loss|, the standard deviation bound of a float32 sum of n terms (n = tokens in the step's
    global batch), for when the sampled spread happens to be 0.
It comes to a few 1e-6; the checks also require the losses to move between steps by far more than that.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.fleet import estimate_memory
from trainer.checkpoints import list_checkpoints

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fsdp2_worker.py")
TIMEOUT_S = 300
MMAP_THRESHOLD = "65536"  # bytes: see test_memory_estimate_within_25_percent_of_peak_rss

sys.path.insert(0, str(WORKER.parent))
import fsdp2_worker as worker  # noqa: E402  (the worker's data and sizes, to rebuild batches here)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun() -> str:
    return shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"


def _check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr[-4000:]


def _python(*args: str, **env: str) -> None:
    done = subprocess.run(
        [sys.executable, str(WORKER), *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _check(done)


def _two_processes(*args: str, **env: str) -> None:
    cmd = [_torchrun(), "--nnodes", "1", "--nproc-per-node", "2", "--master-port", str(_free_port())]
    done = subprocess.run(
        [*cmd, str(WORKER), *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _check(done)


def _two_nodes(*args: str) -> None:
    """Two torchrun agents (one process each) meeting at a c10d rendezvous, as two machines would."""
    endpoint = f"127.0.0.1:{_free_port()}"
    cmd = [_torchrun(), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    cmd += ["--rdzv-endpoint", endpoint, "--rdzv-id", f"fsdp2-test-{os.getpid()}", str(WORKER), *args]
    env = _env(STARE_TEST_NODES="2", MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD)
    agents = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for agent in agents:
        try:
            _, stderr = agent.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in agents:
                other.kill()
            raise
        assert agent.returncode == 0, stderr[-4000:]


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fsdp2")
    _python("plain", str(out), MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD)
    _two_processes("sharded", str(out), str(out / "ckpt-plain" / "step-000003"))
    _python("plain", str(out), str(out / "ckpt-fsdp2" / "step-000003"))
    return {
        "out": out,
        "plain": _read(out / "plain.json"),
        "plain_resumed": _read(out / "plain-resumed.json"),
        "ranks": [_read(out / f"sharded-rank{r}.json") for r in range(2)],
    }


def _tolerances(plain: dict[str, Any]) -> list[float]:
    bounds = []
    for step, loss in enumerate(plain["losses"]):
        spread = max(abs(run[step] - loss) for run in plain["permuted"])
        labels = worker.global_batch(step, worker.VOCAB)["labels"]
        n_terms = int((labels[:, 1:] != -100).sum())
        bounds.append(max(10 * spread, torch.finfo(torch.float32).eps * math.sqrt(n_terms) * abs(loss)))
    return bounds


def _assert_same_curve(got: list[float], expected: list[float], bounds: list[float]) -> None:
    assert len(got) == len(expected) == len(bounds)
    for step, (a, b, bound) in enumerate(zip(got, expected, bounds, strict=True)):
        assert abs(a - b) <= bound, f"step {step}: {a} vs {b}, bound {bound:.2e}"


@pytest.mark.slow
def test_tolerance_is_tight_against_the_losses_it_compares(runs):
    bounds = _tolerances(runs["plain"])
    losses = runs["plain"]["losses"]
    assert max(bounds) < 1e-4
    # Training moves the loss by orders of magnitude more than the bound: a wrong update cannot hide in it.
    assert min(abs(a - b) for a, b in itertools.pairwise(losses)) > 100 * max(bounds)


@pytest.mark.slow
def test_parameters_are_sharded_in_halves(runs):
    layouts = [rank["layout"] for rank in runs["ranks"]]
    assert layouts[0].keys() == layouts[1].keys()
    # Tied embeddings: one parameter, not two.
    assert "model.embed_tokens.weight" in layouts[0] and "lm_head.weight" not in layouts[0]
    total = local = 0
    for name, info in layouts[0].items():
        assert info["placements"] == ["S(0)"], name
        rows = info["global_shape"][0]
        assert info["local_shape"] == [math.ceil(rows / 2), *info["global_shape"][1:]], name
        other = layouts[1][name]["local_shape"]
        assert other == [rows - math.ceil(rows / 2), *info["global_shape"][1:]], name
        total += math.prod(info["global_shape"])
        local += math.prod(info["local_shape"])
    assert 0.49 < local / total <= 0.51


@pytest.mark.slow
def test_each_rank_holds_half_of_the_model_state(runs):
    from trainer.distributed.memory import model_shape
    from trainer.models import build_tiny_arith

    shape = model_shape(build_tiny_arith(seed=0)[0])
    full = estimate_memory(shape, strategy="ddp", processes=1, micro_batch_tokens=1)
    half = estimate_memory(shape, strategy="fsdp2", processes=2, micro_batch_tokens=1)
    assert full.parameters_bytes == shape.parameters * 4
    for rank in runs["ranks"]:
        held = rank["memory"]
        assert held["gradients_bytes"] == held["parameters_bytes"]
        assert held["optimizer_bytes"] == 2 * held["parameters_bytes"]  # AdamW's two moments
        assert held["parameters_bytes"] == pytest.approx(half.parameters_bytes, rel=0.01)
        assert held["parameters_bytes"] / full.parameters_bytes == pytest.approx(0.5, abs=0.01)


@pytest.mark.slow
def test_two_processes_match_one_process_step_by_step(runs):
    bounds = _tolerances(runs["plain"])
    for rank in runs["ranks"]:
        _assert_same_curve(rank["losses"], runs["plain"]["losses"], bounds)


@pytest.fixture(scope="module")
def two_nodes(runs: dict[str, Any]) -> Path:
    _two_nodes("base-only", str(runs["out"]))
    return Path(runs["out"])


@pytest.mark.slow
def test_two_nodes_match_one_process(runs, two_nodes):
    bounds = _tolerances(runs["plain"])
    for rank in range(2):
        got = _read(two_nodes / f"base-only-rank{rank}.json")["losses"]
        _assert_same_curve(got, runs["plain"]["losses"], bounds)


@pytest.mark.slow
def test_checkpoint_saved_at_two_resumes_at_one_and_back(runs):
    bounds = _tolerances(runs["plain"])[worker.SAVE_AFTER :]
    out = runs["out"]
    resumed = runs["plain_resumed"]  # 1 process from the 2-process checkpoint
    assert resumed["extra"] == {"step": 3, "note": "fsdp2"}
    _assert_same_curve(resumed["losses"], runs["ranks"][0]["losses"][worker.SAVE_AFTER :], bounds)
    assert resumed["rng"] == _read(out / "rng-fsdp2-rank0.json")
    # The scheduler resumes after its third step: lr = LR / (1 + 0.5 * 3).
    assert resumed["lr"] == [pytest.approx(worker.LR / 2.5, rel=1e-12)]
    for rank, report in enumerate(runs["ranks"]):  # 2 processes from the 1-process checkpoint
        back = report["resumed_from_plain"]
        assert back["extra"] == {"step": 3, "note": "plain"}
        assert back["lr"] == resumed["lr"]
        _assert_same_curve(back["losses"], runs["plain"]["losses"][worker.SAVE_AFTER :], bounds)
        # Rank 1 did not exist when the 1-process checkpoint was written: it takes rank 0's stream.
        assert back["rng"] == _read(out / "rng-plain-rank0.json"), rank
    assert _read(out / "rng-fsdp2-rank0.json") != _read(out / "rng-fsdp2-rank1.json")
    folder = out / "ckpt-fsdp2" / "step-000003"
    assert sorted(p.name for p in (folder / "rng").iterdir()) == ["rank-00000.pt", "rank-00001.pt"]
    assert _read(folder / "distributed.json") == {"strategy": "fsdp2", "world_size": 2}
    # The folder is a checkpoint the single-process helpers recognise (same naming, state.json last).
    assert [step for step, _ in list_checkpoints(out / "ckpt-fsdp2")] == [3]


@pytest.mark.slow
def test_ddp_at_two_processes_and_its_checkpoint_resumed_by_fsdp2(runs):
    bounds = _tolerances(runs["plain"])
    plain = runs["plain"]["losses"]
    for report in runs["ranks"]:
        _assert_same_curve(report["ddp"]["losses"], plain, bounds)
        resumed = report["ddp"]["resumed_as_fsdp2"]
        assert resumed["extra"] == {"step": 3, "note": "ddp"}
        _assert_same_curve(resumed["losses"], plain[worker.SAVE_AFTER :], bounds[worker.SAVE_AFTER :])
    folder = runs["out"] / "ckpt-ddp" / "step-000003"
    assert _read(folder / "distributed.json") == {"strategy": "ddp", "world_size": 2}
    assert sorted(p.name for p in (folder / "rng").iterdir()) == ["rank-00000.pt", "rank-00001.pt"]


@pytest.mark.slow
def test_a_failed_save_raises_everywhere_and_leaves_nothing(runs):
    for rank, report in enumerate(runs["ranks"]):
        failed = report["failed_save"]
        assert failed["raised"] is not None, rank
        # Only step-000003 (the earlier good one) is left: no step-000004, no temp folder.
        assert failed["left"] == ["step-000003"], rank
    assert runs["ranks"][1]["failed_save"]["raised"]["code"] == "storage_full"
    assert "other process" in runs["ranks"][0]["failed_save"]["raised"]["message"]


def _logits_of_folder(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    batch = worker.global_batch(0, worker.VOCAB)
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()


@pytest.mark.slow
def test_exported_folders_load_with_from_pretrained_and_give_the_trainers_logits(runs, tmp_path):
    from trainer.distributed import export_hf_folder

    out = runs["out"]
    live = _logits_of_folder(out / "export-fsdp2")
    torch.testing.assert_close(live, torch.load(out / "logits-fsdp2-final.pt"), rtol=1e-5, atol=1e-5)
    # From the checkpoint folder alone, in this process (no process group): the state at step 3.
    exported = export_hf_folder(out / "ckpt-fsdp2" / "step-000003", tmp_path / "from-checkpoint")
    assert exported is not None
    at_checkpoint = _logits_of_folder(exported)
    torch.testing.assert_close(
        at_checkpoint, torch.load(out / "logits-fsdp2-at-checkpoint.pt"), rtol=1e-5, atol=1e-5
    )
    assert (live - at_checkpoint).abs().max() > 1e-3  # three more steps apart: the two exports differ
    # LoRA: exported with the adapters merged into a plain model.
    lora = _logits_of_folder(out / "export-lora")
    torch.testing.assert_close(lora, torch.load(out / "logits-lora.pt"), rtol=1e-5, atol=1e-5)
    assert not any((out / "export-lora").glob("adapter_*"))


@pytest.mark.slow
def test_greedy_generation_in_the_context_equals_the_unsharded_model(runs):
    for rank in runs["ranks"]:
        generation = rank["generation"]
        assert generation["got"] == generation["expected"]
        assert generation["full_inside"] and generation["sharded_after"]


@pytest.mark.slow
def test_full_state_is_the_same_under_ddp_and_fsdp2_with_lora_merged(runs):
    """strategy.full_state of one LoRA model (adapters B ≠ 0) prepared under fsdp2 × 2 and ddp × 2: the same
    tensors, in transformers' names, equal to peft's own merge of a plain copy (float rounding of ΔW only)."""
    states = torch.load(runs["out"] / "full-state.pt")
    fsdp2, ddp, merged = states["fsdp2"], states["ddp"], states["peft_merge"]
    assert set(fsdp2) == set(ddp)
    assert not any("lora_" in name or "base_layer" in name for name in fsdp2)
    for name, tensor in ddp.items():
        assert torch.equal(fsdp2[name], tensor), name  # gathered shards are the very values
        torch.testing.assert_close(tensor, merged[name], rtol=1e-6, atol=1e-6)
    assert set(merged) - set(ddp) <= {"lm_head.weight"}  # tied to the embeddings: given once
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (fsdp2[q] - states["base"][q]).abs().max() > 1e-3  # ΔW is in


@pytest.mark.slow
def test_only_rank_0_loads_the_weights_and_every_shard_is_filled_from_them(runs):
    """fsdp2 × 2 with rank 0 alone holding the loaded model (LoRA's A drawn per rank on purpose) and rank 1 a
    meta-device skeleton: after prepare(from_rank0=True) both ranks' full_state is rank 0's loaded model."""
    reports = [torch.load(runs["out"] / f"rank0-fill-rank{r}.pt") for r in range(2)]
    assert not reports[0]["any_meta_before"] and reports[1]["all_meta_before"]
    expected = reports[0]["loaded_merged"]
    assert expected and set(reports[1]["state"]) == set(expected)
    for report in reports:
        for name, tensor in expected.items():
            assert torch.equal(report["state"][name], tensor), name


@pytest.mark.slow
def test_bf16_offload_checkpointing_and_lora_paths(runs):
    bounds = _tolerances(runs["plain"])[:3]
    fp32 = runs["plain"]["losses"][:3]
    for rank in runs["ranks"]:
        for name in ("bf16", "offload", "checkpointing", "lora", "lora_checkpointing"):
            assert rank[name]["placements"] == ["S(0)"], name
            assert rank[name]["local_devices"] == ["cpu"], name
            assert rank[name]["offload_policy"] == (
                "CPUOffloadPolicy" if name == "offload" else "OffloadPolicy"
            )
            # One forward per step, and one more in backward where the layer is recomputed.
            assert rank[name]["forward_calls"] == (6 if "checkpointing" in name else 3), name
        bf16 = rank["bf16"]
        assert bf16["compute_dtypes"] == ["torch.bfloat16"]
        # bf16 compute really ran (the losses move off fp32's) and still trains the same model.
        assert max(abs(a - b) for a, b in zip(bf16["losses"], fp32, strict=True)) > max(bounds)
        assert all(abs(a - b) < 0.02 * b for a, b in zip(bf16["losses"], fp32, strict=True))
        for name in ("offload", "checkpointing"):
            assert rank[name]["compute_dtypes"] == ["torch.float32"]
            _assert_same_curve(rank[name]["losses"], fp32, bounds)
        for name in ("lora", "lora_checkpointing"):
            lora = rank[name]
            _assert_same_curve(lora["losses"], runs["plain"]["lora"], bounds)
            assert lora["trainable"] and all(
                "lora_" in param and info["placements"] == ["S(0)"]
                for param, info in lora["trainable"].items()
            )
            assert lora["frozen_changed"] == []


@pytest.mark.slow
@pytest.mark.parametrize("strategy,processes", [("ddp", 1), ("fsdp2", 2)])
def test_memory_estimate_within_25_percent_of_peak_rss(runs, two_nodes, strategy, processes):
    """Measured first thing in the plain launch (ddp at 1 process) and in the two-node launch (fsdp2 at 2),
    under MALLOC_MMAP_THRESHOLD_=65536. The estimate counts live bytes; glibc's default adaptive mmap
    threshold keeps freed activation blocks in the heap, so peak RSS would also count that fragmentation
    (docs/DISTRIBUTED.md); a fixed threshold returns every freed large block, making peak RSS the live peak."""
    for rank in range(processes):
        measured = _read(two_nodes / f"memory-{strategy}-rank{rank}.json")
        ratio = measured["estimate_bytes"] / measured["peak_minus_baseline_bytes"]
        assert 0.75 <= ratio <= 1.25, measured


# --- in this process (no process group) -------------------------------------------------------------------


def test_decoder_layers_are_found_through_wrappers():
    from trainer.models import apply_lora, build_tiny_arith, decoder_layers

    model, _ = build_tiny_arith(seed=0)
    layers = decoder_layers(model)
    assert layers == list(model.model.layers)
    lora = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=None)
    assert decoder_layers(lora) == layers
    with pytest.raises(ValueError, match="decoder layers of Linear"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_the_strategy_refuses_a_world_size_the_launch_did_not_give():
    from contract.distributed import DistributedSpec
    from trainer.distributed import make_strategy
    from trainer.models import build_tiny_arith

    if torch.distributed.is_initialized() and torch.distributed.get_world_size() == 1:
        # An engine run in-process by an earlier test keeps its one-member group (trainer.distributed.runtime).
        torch.distributed.destroy_process_group()
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="process group has 1 processes, the spec 2"):
        make_strategy(DistributedSpec(processes_per_node=2), torch.device("cpu"), 1).prepare(
            build_tiny_arith(seed=0)[0]
        )
    # The runtime, which makes the strategy for the group it joined, refuses such a launch first.
    from trainer.distributed import Runtime

    with pytest.raises(ValueError, match="the launcher started 1 processes but the spec asks for"):
        Runtime(DistributedSpec(processes_per_node=2), torch.device("cpu"))


def test_reductions_in_a_group_of_one_return_their_input():
    from contract.distributed import DistributedSpec
    from trainer.distributed import Runtime

    runtime = Runtime(DistributedSpec(), torch.device("cpu"))
    assert runtime.reduce([3.0, 1.5], "sum", torch.float64).tolist() == [3.0, 1.5]
    assert runtime.reduce(2, "max", torch.int64).item() == 2
    assert runtime.broadcast_object({"x": 2}) == {"x": 2}
    with pytest.raises(ValueError, match="reduction must be one of sum, max"):
        runtime.reduce([1.0], "mean", torch.float64)  # type: ignore[arg-type]
