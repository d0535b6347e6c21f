"""The strategy object (trainer.distributed.strategy): the one place the trainer reads the spec's
`distributed.strategy`, wraps a model, gathers full weights or merges LoRA (the views inside the wrappers
are trainer/models.py's, the one other module that names DDP's wrapper); its ddp precision policy;
and a resume from DCP shards that reads the weights once, into a model built on the meta device.
(full_state under fsdp2 × 2 against ddp × 2 is in test_fsdp2.py, which launches the processes.)
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from contract.distributed import DistributedSpec
from contract.protocol import ExitCode
from contract.spec import TrainSpec
from tests.trainer.test_engine import _StopAfter, read_events, small_spec, step_metrics
from trainer.distributed.strategy import full_state, make_strategy
from trainer.models import apply_lora, build_tiny_arith

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
STRATEGY_MODULE = TRAINER / "distributed" / "strategy.py"
# The views inside the wrappers (hf_model and its kin): they name DDP's wrapper to look inside it, no more.
VIEWS_MODULE = TRAINER / "models.py"
VIEW_NAMES = {"DistributedDataParallel", "hf_model"}
# What only the strategy module may name: the wrappers it puts on a model, and the ways to undo them.
WRAPPER_NAMES = {"DistributedDataParallel", "FSDPModule", "fully_shard", "full_tensor", "merge_and_unload"}
WRAPPER_NAMES |= {"get_delta_weight", "get_base_model", "get_model_state_dict", "unshard"}
UNWRAP_HELPERS = {"is_sharded", "unsharded", "unwrap_model", "base_model", "generation_context", "wrap_model"}
SPEC_HOLDERS = {"spec", "dist", "distributed", "distributed_spec"}


def _trainer_modules() -> list[Path]:
    return sorted(p for p in TRAINER.rglob("*.py") if p != STRATEGY_MODULE)


def _holder(node: ast.AST) -> str | None:
    """The name an attribute is read off: `spec` in `spec.strategy`, `distributed` in `x.distributed.strategy`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def test_the_strategy_is_read_unwrapped_and_gathered_in_one_trainer_module():
    found = []
    for path in _trainer_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if path == VIEWS_MODULE and _named(node) in VIEW_NAMES:
                continue
            where = f"{path.relative_to(TRAINER.parent)}:{getattr(node, 'lineno', '?')}"
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "strategy"
                and _holder(node.value) in SPEC_HOLDERS
            ):
                found.append(f"{where} reads the spec's strategy")
            if isinstance(node, ast.Attribute | ast.Name) and (
                (node.attr if isinstance(node, ast.Attribute) else node.id) in WRAPPER_NAMES
            ):
                found.append(f"{where} names {getattr(node, 'attr', getattr(node, 'id', ''))}")
            if isinstance(node, ast.alias) and node.name.split(".")[-1] in WRAPPER_NAMES | UNWRAP_HELPERS:
                found.append(f"{where} imports {node.name}")
            if isinstance(node, ast.FunctionDef) and node.name in UNWRAP_HELPERS | {"hf_model"}:
                found.append(f"{where} defines {node.name}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in {"module", "sleep", "push_weights", "wake", "full_tensor"}
            ):
                found.append(f"{where} duck-types {node.args[1].value!r}")
    assert found == []
    # ... and the strategy module does read it; the views module defines hf_model.
    assert "spec.strategy" in STRATEGY_MODULE.read_text()
    assert "def hf_model(" in VIEWS_MODULE.read_text()


def _named(node: ast.AST) -> str | None:
    """The name a node names, defines or imports (for the views module's allowance)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.alias):
        return node.name.split(".")[-1]
    if isinstance(node, ast.FunctionDef):
        return node.name
    return None


def _lora_model(seed: int = 0):
    model, _ = build_tiny_arith(seed=seed)
    torch.manual_seed(5)
    lora = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.1)
    return lora


def test_full_state_merges_lora_once_in_transformers_names():
    lora = _lora_model()
    merged = copy.deepcopy(lora).merge_and_unload()
    state = dict(full_state(lora))
    assert not any("lora_" in name or "base_layer" in name for name in state)
    expected = merged.state_dict()
    assert set(expected) - set(state) == {"lm_head.weight"}  # tied to the embeddings: given once
    for name, tensor in state.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-6)


def test_ddp_bf16_is_a_forward_hook_policy_not_a_patched_forward():
    """ddp with param_dtype bfloat16: the forward computes in bfloat16 (autocast entered and left by forward
    hooks), the weights stay float32, and the model's `forward` is its class's own (a copy of the model, the
    KL reference, then computes with its own weights, not the policy's)."""
    model, _ = build_tiny_arith(seed=0)
    spec = DistributedSpec(mixed_precision={"param_dtype": "bfloat16"})
    strategy = make_strategy(spec, torch.device("cpu"), 1)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() != 1:
        pytest.skip("needs a lone process")
    prepared = strategy.prepare(model)
    assert "forward" not in vars(prepared)  # no instance attribute shadowing the class's forward
    ids = torch.tensor([[1, 5, 6, 7]])
    seen = []
    hook = prepared.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda m, a, out: seen.append(out.dtype)
    )
    logits = prepared(input_ids=ids).logits
    hook.remove()
    assert seen == [torch.bfloat16] and all(p.dtype == torch.float32 for p in prepared.parameters())
    assert not torch.is_autocast_enabled("cpu")  # left after the forward
    reference = strategy.prepare(strategy.full_copy(prepared), trainable=False)
    with torch.no_grad():
        for p in prepared.parameters():
            p.add_(0.5)
    with torch.no_grad():
        moved = prepared(input_ids=ids).logits
        kept = reference(input_ids=ids).logits
    assert torch.equal(kept, logits.detach())  # the copy kept its own weights
    assert not torch.allclose(moved, kept)


def test_an_fsdp2_resume_reads_the_weights_once_into_a_meta_built_model(tmp_path, monkeypatch):
    """A resume from DCP shards builds the model on the meta device from the checkpoint's config (no
    weights read or initialised), the strategy allocates the shards, and the shards are read once; the
    resumed run then repeats the uninterrupted one's steps."""
    from trainer.engine import Engine
    from trainer.policy import placement

    data = small_spec(distributed={"strategy": "fsdp2"}, checkpoint={"interval": 1, "keep_last": 5})
    data["optim"]["steps"] = 3
    spec = TrainSpec.model_validate(data)
    full = tmp_path / "full"
    assert Engine(spec, full).run() == ExitCode.OK
    part = tmp_path / "part"
    crash = _StopAfter(2, True)  # a crash after step 2's event: the step-1 checkpoint is the latest
    engine = Engine(spec, part, callbacks=[crash])
    crash.engine = engine
    with pytest.raises(KeyboardInterrupt):
        engine.run()

    calls: dict[str, int] = {"load_model_and_tokenizer": 0, "model_skeleton": 0, "load_sharded": 0}
    on_meta: list[bool] = []

    def counted(name):
        original = getattr(placement, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            out = original(*args, **kwargs)
            if name == "model_skeleton":
                on_meta.append(all(p.is_meta for p in out[0].parameters()))
            return out

        monkeypatch.setattr(placement, name, wrapper)

    for name in calls:
        counted(name)
    assert Engine(spec, part, resume=True).run() == ExitCode.OK
    assert calls == {"load_model_and_tokenizer": 0, "model_skeleton": 1, "load_sharded": 1}
    assert on_meta == [True]
    a, b = step_metrics(read_events(full)), step_metrics(read_events(part))
    assert a[2] == b[2] and a[3] == b[3]


def test_a_fresh_fsdp2_run_above_one_process_is_loaded_by_rank_0_alone_or_from_each_ranks_slices(tmp_path):
    """The decision (placement.start_fill) and the other ranks' model: a skeleton on the meta device,
    LoRA applied, with the tokenizer ready for batched generation. A model built in code (tiny-arith) or a
    LoRA run is filled from rank 0; a local folder of safetensors without LoRA by each rank from the files
    (every rank a skeleton). The fills themselves run in test_fsdp2.py and test_fsdp2_start_fill.py."""
    from types import SimpleNamespace

    from trainer.policy import placement

    def runtime(strategy: str, processes: int) -> SimpleNamespace:
        spec = DistributedSpec(strategy=strategy, processes_per_node=processes)
        return SimpleNamespace(strategy=make_strategy(spec, torch.device("cpu"), processes))

    data = small_spec(model={"name": "tiny-arith", "lora": {"r": 4, "alpha": 8}})
    spec = TrainSpec.model_validate(data)
    rank0 = placement.StartFill(from_rank0=True)
    assert placement.start_fill(runtime("fsdp2", 2), spec, None) == rank0
    assert rank0.skeleton(1) and not rank0.skeleton(0)
    assert placement.start_fill(runtime("fsdp2", 1), spec, None) == placement.StartFill()
    assert placement.start_fill(runtime("ddp", 2), spec, None) == placement.StartFill()
    resume = placement.start_fill(runtime("fsdp2", 2), spec, Path("step-000001"))  # a resume: the shards
    assert resume == placement.StartFill() and not resume.skeleton(1)
    folder = tmp_path / "model"
    for part in build_tiny_arith():
        part.save_pretrained(folder)
    plain = TrainSpec.model_validate(small_spec(model={"name": str(folder)}))
    fill = placement.start_fill(runtime("fsdp2", 2), plain, None)
    assert fill == placement.StartFill(files=(folder / "model.safetensors",))
    assert fill.skeleton(0) and fill.skeleton(1)
    assert placement.start_fill(runtime("fsdp2", 1), plain, None) == placement.StartFill()
    with_lora = TrainSpec.model_validate(
        small_spec(model={"name": str(folder), "lora": {"r": 4, "alpha": 8}})
    )
    assert placement.start_fill(runtime("fsdp2", 2), with_lora, None) == rank0
    model, tokenizer = placement.load_policy(spec, None, skeleton=True)
    assert all(p.is_meta for p in model.parameters())
    assert any("lora_A" in name for name, _ in model.named_parameters())
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    with pytest.raises(ValueError, match=r"model\.name"):
        placement.load_policy(
            TrainSpec.model_validate(small_spec(model={"name": "/nowhere/model.gguf"})), None, skeleton=True
        )
