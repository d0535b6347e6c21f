"""Run by test_fsdp2.py, alone (one process) or under torchrun: trains the tiny model on fixed batches and
writes what each process saw as JSON (and tensors) under OUT, for the test to compare across launches.

    python fsdp2_worker.py plain OUT                  one plain process (strategy ddp at world 1): memory
                                                      first, then the base run, permuted runs, LoRA
    python fsdp2_worker.py plain OUT RESUME_FROM      one process resuming a checkpoint folder
    torchrun ... fsdp2_worker.py sharded OUT RESUME_FROM  fsdp2 (and ddp) over the launched processes
    torchrun ... fsdp2_worker.py base-only OUT        memory, then the fsdp2 base run (the two-node launch)

Every launch uses the same data: step k's global batch is drawn from seed 1000 + k; process r of N takes
rows r, r+N, ... The loss of a step is the token mean over the whole global batch, so one process and N
processes compute the same number (up to float reduction order).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from contract.distributed import DistributedSpec
from contract.fleet import estimate_memory
from trainer.distributed import (
    Runtime,
    export_hf_folder,
    load_sharded,
    make_strategy,
    model_state_bytes,
    save_sharded,
)
from trainer.distributed.memory import model_shape, peak_rss_bytes, reset_peak_rss, rss_bytes
from trainer.models import apply_lora, build_tiny_arith, build_tiny_arith_tokenizer, hf_model

STEPS = 6
SAVE_AFTER = 3  # the checkpoint holds the state after this many updates
ROWS, LENGTH = 8, 20
LR = 3e-3
DEVICE = torch.device("cpu")
PROMPTS = ["12+34=", "7*8=", "5-9="]
VOCAB = len(build_tiny_arith_tokenizer())
GROUP: Runtime  # this process's handle on the group the launch made (set by the mode that runs)


def global_batch(step: int, vocab: int, rows: int = ROWS, length: int = LENGTH) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(4, vocab, (rows, length), generator=g)  # (B, T)
    attention_mask = torch.ones(rows, length, dtype=torch.long)
    attention_mask[: rows // 2, :3] = 0  # left padding on half the rows
    ids[attention_mask == 0] = 0
    labels = ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": ids, "attention_mask": attention_mask, "labels": labels}


def step_loss(
    model: Any, batch: dict[str, torch.Tensor], rows: torch.Tensor, world: int
) -> tuple[torch.Tensor, float]:
    """(what this process back-propagates, the global batch's mean token loss). FSDP2 and DDP average
    gradients over processes, so the local sum is scaled by the world size."""
    global_tokens = (batch["labels"][:, 1:] != -100).sum()
    logits = model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows]).logits
    targets = batch["labels"][rows][:, 1:]
    local_sum = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), reduction="sum")
    local_mean = local_sum / global_tokens
    reported = float(GROUP.reduce([float(local_mean.detach())], "sum", torch.float64)[0])
    return local_mean * world, reported


def train(
    model: Any, optimizer: Any, scheduler: Any, steps: range, *, permutation: torch.Tensor | None = None
) -> list[float]:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    losses = []
    for step in steps:
        batch = global_batch(step, VOCAB)
        order = permutation if permutation is not None else torch.arange(ROWS)
        loss, reported = step_loss(model, batch, order[rank::world], world)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(reported)
    return losses


def fresh(spec: DistributedSpec, *, lora: bool = False) -> tuple[Any, torch.optim.Optimizer, Any]:
    """The tiny model wrapped under `spec`, AdamW on its trainable parameters and a decaying learning rate
    (steep, so that a scheduler restored at the wrong step shows in the losses)."""
    model, _ = build_tiny_arith(seed=0)
    model.train()
    if lora:
        # peft draws LoRA's initial A from the global RNG: seeded per rank on purpose, so that the adapters
        # start alike only if the strategy hands every process rank 0's weights (as the plain run has them).
        torch.manual_seed(200 + torch.distributed.get_rank())
        model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=None)
    model = make_strategy(spec, DEVICE, spec.world_size).prepare(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR)
    return (
        model,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.5 * step)),
    )


def write(out: Path, name: str, value: Any) -> None:
    (out / name).write_text(json.dumps(value, indent=1, sort_keys=True))


def base_run(spec: DistributedSpec, out: Path, tag: str) -> tuple[Any, torch.optim.Optimizer, list[float]]:
    model, optimizer, scheduler = fresh(spec)
    losses = train(model, optimizer, scheduler, range(SAVE_AFTER))
    folder = out / f"ckpt-{tag}" / "step-000003"
    torch.manual_seed(
        100 + torch.distributed.get_rank()
    )  # a distinct RNG stream per rank, to see it restored
    save_sharded(
        folder,
        model,
        optimizer,
        {"step": SAVE_AFTER, "note": tag},
        runtime=Runtime(spec, DEVICE),
        scheduler=scheduler,
    )
    write(out, f"rng-{tag}-rank{torch.distributed.get_rank()}.json", rng_draws())
    save_logits(model, out / f"logits-{tag}-at-checkpoint.pt")
    losses += train(model, optimizer, scheduler, range(SAVE_AFTER, STEPS))
    return model, optimizer, losses


def resumed(spec: DistributedSpec, folder: Path) -> dict[str, Any]:
    model, optimizer, scheduler = fresh(spec)
    extra = load_sharded(folder, model, optimizer, runtime=Runtime(spec, DEVICE), scheduler=scheduler)
    report = {"extra": extra, "rng": rng_draws(), "lr": scheduler.get_last_lr()}
    report["losses"] = train(model, optimizer, scheduler, range(int(extra["step"]), STEPS))
    return report


def rng_draws() -> list[float]:
    """Draws from the current torch RNG stream without advancing it (compares saved and restored states)."""
    with torch.random.fork_rng(devices=[]):
        return torch.rand(3).tolist()


def save_logits(model: Any, path: Path) -> None:
    """The model's logits on step 0's batch, from rank 0 (every process runs the forward: it all-gathers)."""
    batch = global_batch(0, VOCAB)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    if rank0():
        torch.save(logits, path)


def FSDP2_SPEC() -> DistributedSpec:
    world = torch.distributed.get_world_size()
    nodes = int(os.environ.get("STARE_TEST_NODES", "1"))
    return DistributedSpec(strategy="fsdp2", nodes=nodes, processes_per_node=world // nodes)


def full_state_check(out: Path) -> None:
    """full_state of one LoRA model (trained-looking adapters: B ≠ 0) under fsdp2 and under ddp at this
    world size, and peft's own merge of a plain copy: rank 0 writes the three, the test compares them."""
    states = {}
    for name, spec in [
        ("fsdp2", FSDP2_SPEC()),
        ("ddp", DistributedSpec(processes_per_node=FSDP2_SPEC().world_size)),
    ]:
        model, _ = build_tiny_arith(seed=0)
        states["base"] = {n: t.detach().clone() for n, t in model.state_dict().items()}
        torch.manual_seed(5)
        model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
        g = torch.Generator().manual_seed(6)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        if name == "ddp" and rank0():
            import copy

            states["peft_merge"] = {
                n: t.detach().clone() for n, t in copy.deepcopy(model).merge_and_unload().state_dict().items()
            }
        strategy = make_strategy(spec, DEVICE, spec.world_size)
        prepared = strategy.prepare(model)
        states[name] = {n: t.clone() for n, t in strategy.full_state(prepared)}
    if rank0():
        torch.save(states, out / "full-state.pt")


def rank0_fill_check(out: Path) -> None:
    """Rank 0 loads the tiny model (and LoRA), the other rank only builds its skeleton on the meta device;
    the strategy fills every shard from rank 0's weights. Each rank writes its full_state afterwards (and
    rank 0 the weights it loaded), so the test can compare them."""
    from trainer.models import skeleton_of

    if rank0():
        model, _ = build_tiny_arith(seed=0)
    else:
        built = skeleton_of("tiny-arith")
        assert built is not None
        model = built[0]
    torch.manual_seed(200 + torch.distributed.get_rank())  # LoRA's A drawn differently per rank
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    meta = [p.is_meta for p in model.parameters()]
    loaded = {n: t.detach().clone() for n, t in model.state_dict().items()} if rank0() else {}
    strategy = Runtime(FSDP2_SPEC(), DEVICE).strategy
    prepared = strategy.prepare(model, from_rank0=True)
    report = {
        "all_meta_before": all(meta),
        "any_meta_before": any(meta),
        "state": {n: t.clone() for n, t in strategy.full_state(prepared)},
        "loaded_merged": {n: t for n, t in full_state_of_loaded(loaded)} if rank0() else {},
    }
    torch.save(report, out / f"rank0-fill-rank{torch.distributed.get_rank()}.pt")


def full_state_of_loaded(loaded: dict[str, torch.Tensor]) -> Any:
    """full_state of a plain LoRA model holding `loaded` (rank 0's weights before sharding)."""
    model, _ = build_tiny_arith(seed=1)
    lora = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    lora.load_state_dict(loaded)
    return make_strategy(DistributedSpec(processes_per_node=1), DEVICE, 1).full_state(lora)


def rank0() -> bool:
    return torch.distributed.get_rank() == 0


# --- modes ------------------------------------------------------------------------------------------------


def plain(out: Path, resume_from: str | None) -> None:
    global GROUP
    spec = DistributedSpec()
    GROUP = Runtime(spec, DEVICE)
    if resume_from:
        write(out, "plain-resumed.json", resumed(spec, Path(resume_from)))
        return
    measure_memory(spec, out)  # first: a fresh process's heap
    _, _, losses = base_run(spec, out, "plain")
    generator = torch.Generator().manual_seed(7)
    permuted = []
    for _ in range(
        3
    ):  # the same batches with their rows in another order: only float reduction order changes
        model, optimizer, scheduler = fresh(spec)
        permuted.append(
            train(
                model,
                optimizer,
                scheduler,
                range(STEPS),
                permutation=torch.randperm(ROWS, generator=generator),
            )
        )
    model, optimizer, scheduler = fresh(spec, lora=True)
    write(
        out,
        "plain.json",
        {"losses": losses, "permuted": permuted, "lora": train(model, optimizer, scheduler, range(3))},
    )


def sharded(out: Path, resume_from: str, *, base_only: bool) -> None:
    world = int(os.environ["WORLD_SIZE"])
    nodes = int(os.environ.get("STARE_TEST_NODES", "1"))
    spec = DistributedSpec(strategy="fsdp2", nodes=nodes, processes_per_node=world // nodes)
    global GROUP
    GROUP = Runtime(spec, DEVICE)
    rank = GROUP.rank
    if base_only:
        measure_memory(spec, out)
        model, optimizer, scheduler = fresh(spec)
        write(out, f"base-only-rank{rank}.json", {"losses": train(model, optimizer, scheduler, range(STEPS))})
        return
    model, optimizer, losses = base_run(spec, out, "fsdp2")
    report: dict[str, Any] = {
        "losses": losses,
        "layout": layout(model),
        "memory": memory_after_backward(model, optimizer),
    }
    report["generation"] = generation_check(model)
    report["failed_save"] = failed_save(model, optimizer, out)
    save_logits(model, out / "logits-fsdp2-final.pt")
    export_hf_folder(model, out / "export-fsdp2", runtime=GROUP)
    report["resumed_from_plain"] = resumed(spec, Path(resume_from))
    # DDP at the same world size, and its checkpoint resumed by fsdp2 (a change of strategy).
    _, _, ddp_losses = base_run(DistributedSpec(processes_per_node=world), out, "ddp")
    report["ddp"] = {
        "losses": ddp_losses,
        "resumed_as_fsdp2": resumed(spec, out / "ckpt-ddp" / "step-000003"),
    }
    report.update(variants(spec, out))
    full_state_check(out)
    rank0_fill_check(out)
    write(out, f"sharded-rank{rank}.json", report)


def variants(spec: DistributedSpec, out: Path) -> dict[str, Any]:
    """bf16 compute, CPU offload, activation checkpointing and LoRA (alone and with checkpointing): three
    steps each from the same start. Records what shows each option really acted: the dtype and the number
    of forward calls seen by a projection of the first layer (checkpointing runs it again in backward)
    and the offload policy fully_shard keeps."""
    report: dict[str, Any] = {}
    for name, change, lora in [
        ("bf16", {"mixed_precision": {"param_dtype": "bfloat16"}}, False),
        ("offload", {"offload_optimizer": True}, False),
        ("checkpointing", {"activation_checkpointing": True}, False),
        ("lora", {}, True),
        ("lora_checkpointing", {"activation_checkpointing": True}, True),
    ]:
        variant = DistributedSpec.model_validate({**spec.model_dump(), **change})
        model, optimizer, scheduler = fresh(variant, lora=lora)
        inner = hf_model(model)
        seen: list[str] = []
        layer = inner.model.layers[0].self_attn.q_proj
        hook = layer.register_forward_hook(lambda m, args, output, seen=seen: seen.append(str(output.dtype)))
        frozen_before = {n: p.to_local().clone() for n, p in model.named_parameters() if not p.requires_grad}
        report[name] = {"losses": train(model, optimizer, scheduler, range(3))}
        hook.remove()
        report[name].update(
            compute_dtypes=sorted(set(seen)),
            forward_calls=len(seen),
            placements=sorted({",".join(map(str, p.placements)) for p in model.parameters()}),
            local_devices=sorted({str(p.to_local().device) for p in model.parameters()}),
            # torch has no public getter for it; the test only reads it.
            offload_policy=type(inner._get_fsdp_state()._fsdp_param_group.offload_policy).__name__,
            trainable=layout(model, trainable_only=True) if lora else None,
            frozen_changed=[
                n
                for n, p in model.named_parameters()
                if n in frozen_before and not torch.equal(p.to_local(), frozen_before[n])
            ],
        )
        if name == "lora":
            save_logits(model, out / "logits-lora.pt")
            export_hf_folder(model, out / "export-lora", runtime=GROUP)
    return report


def failed_save(model: Any, optimizer: torch.optim.Optimizer, out: Path) -> dict[str, Any]:
    """A save where the last rank's disk is full: every rank must raise, and nothing may be left behind."""
    import trainer.distributed.checkpoint as checkpoint_module

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    original = checkpoint_module.rng_state

    def full_disk() -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", "rng")

    if rank == world - 1:
        checkpoint_module.rng_state = full_disk
    try:
        save_sharded(out / "ckpt-fsdp2" / "step-000004", model, optimizer, {"step": 4}, runtime=GROUP)
        raised = None
    except Exception as err:
        raised = {"type": type(err).__name__, "code": getattr(err, "code", None), "message": str(err)}
    finally:
        checkpoint_module.rng_state = original
    return {"raised": raised, "left": sorted(p.name for p in (out / "ckpt-fsdp2").iterdir())}


def layout(model: Any, trainable_only: bool = False) -> dict[str, Any]:
    return {
        name: {
            "placements": [str(x) for x in p.placements] if isinstance(p, DTensor) else None,
            "global_shape": list(p.shape),
            "local_shape": list(p.to_local().shape) if isinstance(p, DTensor) else list(p.shape),
        }
        for name, p in model.named_parameters()
        if p.requires_grad or not trainable_only
    }


def memory_after_backward(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    loss, _ = step_loss(
        model,
        global_batch(0, VOCAB),
        torch.arange(ROWS)[torch.distributed.get_rank() :: torch.distributed.get_world_size()],
        torch.distributed.get_world_size(),
    )
    loss.backward()
    held = model_state_bytes(model, optimizer)
    optimizer.zero_grad(set_to_none=True)
    return held


def generation_check(model: Any) -> dict[str, Any]:
    """Greedy generation inside the strategy's full_weights against a plain copy built from the gathered weights."""
    tokenizer = build_tiny_arith_tokenizer()
    prompt = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    reference, _ = build_tiny_arith(seed=1)  # other initial weights: all of them must come from `full`
    reference.load_state_dict(full)
    reference.eval()
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    with torch.no_grad():
        expected = reference.generate(**prompt, **kwargs)
    model.eval()
    with torch.no_grad(), GROUP.strategy.full_weights(model) as generator:
        inside_full = all(not isinstance(p, DTensor) for p in generator.parameters())
        got = generator.generate(**prompt, **kwargs)
    model.train()
    after_sharded = all(isinstance(p, DTensor) for p in model.parameters())
    return {
        "expected": expected.tolist(),
        "got": got.tolist(),
        "full_inside": inside_full,
        "sharded_after": after_sharded,
    }


def measure_memory(spec: DistributedSpec, out: Path) -> None:
    """Peak RSS of two training steps at a large micro-batch, against contract.fleet.estimate_memory.
    Run first in a process: memory freed earlier and kept by the allocator would hide the step's peak."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    warm, _ = build_tiny_arith(
        seed=3
    )  # first forward/backward loads kernels and thread pools: not the model's
    warm(input_ids=torch.randint(4, VOCAB, (2, 8)), labels=torch.randint(4, VOCAB, (2, 8))).loss.backward()
    del warm
    rows, length = 32, 256
    reset_peak_rss()
    baseline = rss_bytes()
    model, _ = build_tiny_arith(seed=0)
    shape = model_shape(model)
    model.train()
    model = make_strategy(spec, DEVICE, spec.world_size).prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(2):
        batch = global_batch(step, VOCAB, rows * world, length)
        batch["attention_mask"][:] = (
            1  # no padding: SDPA's fused causal kernel, as long generations mostly run
        )
        batch["labels"] = batch["input_ids"]
        loss, _ = step_loss(model, batch, torch.arange(rows * world)[rank::world], world)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = peak_rss_bytes() - baseline
    estimate = estimate_memory(
        shape, strategy=spec.strategy, processes=world, micro_batch_tokens=rows * length
    )
    record = {
        "peak_minus_baseline_bytes": peak,
        "estimate_bytes": estimate.total_bytes,
        "estimate": estimate.__dict__,
    }
    write(out, f"memory-{spec.strategy}-rank{rank}.json", record)


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    if mode == "plain":
        plain(out_dir, sys.argv[3] if len(sys.argv) > 3 else None)
    elif mode in ("sharded", "base-only"):
        sharded(out_dir, sys.argv[3] if len(sys.argv) > 3 else "", base_only=mode == "base-only")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    torch.distributed.destroy_process_group()
