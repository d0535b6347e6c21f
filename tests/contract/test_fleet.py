"""contract.catalog: the built-in models' shapes from their configs (equal to what the trainer builds);
contract.fleet: LoRA's
adapter count, and placement's order (the field it names, the class it picks)."""

from __future__ import annotations

import pytest

from contract.catalog import BUILTIN_CONFIGS, SMOLLM2_135M_INSTRUCT, TINY_ARITH, builtin_model_shape
from contract.fleet import CapacityError, JobNeeds, Offer, WorkerClass, lora_parameters, place
from tests.contract.test_distributed import SMOLLM2


def test_builtin_shapes_from_config_equal_the_models_the_trainer_builds():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.distributed.memory import model_shape
    from trainer.models import build_tiny_arith

    tiny, _ = build_tiny_arith(seed=0)
    assert builtin_model_shape(TINY_ARITH) == model_shape(tiny)
    with torch.device("meta"):  # SmolLM2's config, no weights (the GGUF conversion gives this config)
        smol = LlamaForCausalLM(LlamaConfig(**BUILTIN_CONFIGS[SMOLLM2_135M_INSTRUCT]))
    assert builtin_model_shape(SMOLLM2_135M_INSTRUCT) == model_shape(smol) == SMOLLM2
    assert builtin_model_shape("someone/else") is None


def test_lora_adapters_are_counted_per_targeted_projection():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.models import apply_lora

    shape = builtin_model_shape(SMOLLM2_135M_INSTRUCT)
    assert shape is not None
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**BUILTIN_CONFIGS[SMOLLM2_135M_INSTRUCT]))
    for targets in (None, ["q_proj", "k_proj", "gate_proj", "down_proj"]):
        wrapped = apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules=targets)
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        assert lora_parameters(shape, 8, targets) == trainable, targets
        model = wrapped.unload()


def _offer(name: str, live: bool = False, **fields: object) -> Offer:
    return Offer(f"class {name!r}", WorkerClass.model_validate({"queue": name, **fields}), live)


def _needs(**fields: object) -> JobNeeds:
    values: dict[str, object] = {
        "strategy": "ddp",
        "nodes": 1,
        "processes_per_node": 1,
        "rollout_engine": "hf",
        "memory_per_device_bytes": 1000,
    }
    values.update(fields)
    return JobNeeds(**values)  # type: ignore[arg-type]


def test_placement_prefers_the_default_queue_then_live_then_the_smallest_fit():
    big = _offer("big", processes_per_node=8)
    small = _offer("small", processes_per_node=2)
    live_big = _offer("live-big", live=True, processes_per_node=8)
    assert place(_needs(), [big, small]) is small
    assert place(_needs(), [big, small, live_big]) is live_big
    assert place(_needs(), [big, small, live_big], prefer_queue="big") is big
    assert place(_needs(processes_per_node=4), [small, big]) is big
    roomy = _offer("roomy", memory_per_device_bytes=10**6)
    unstated = _offer("unstated")
    tight = _offer("tight", memory_per_device_bytes=999)
    assert (
        place(_needs(), [unstated, roomy, tight]) is roomy
    )  # a stated size that fits before an unstated one
    assert place(_needs(memory_per_device_bytes=None), [tight]) is tight  # unknown need: never refused


@pytest.mark.parametrize(
    "needs,param,named",
    [
        (_needs(strategy="fsdp2"), "spec.distributed.strategy", "strategies offered: ddp"),
        (_needs(nodes=3), "spec.distributed.nodes", "spans 2 nodes"),
        (_needs(processes_per_node=9), "spec.distributed.processes_per_node", "has 8 processes per node"),
        (_needs(rollout_engine="vllm"), "spec.rollout.engine", "rollout.engine is 'vllm'"),
        (_needs(memory_per_device_bytes=10**12), "spec.optim.micro_batch_size", "class 'big'"),
    ],
)
def test_refusals_name_the_first_field_no_class_meets(needs: JobNeeds, param: str, named: str):
    offers = [
        _offer("big", strategies=["ddp"], processes_per_node=8, memory_per_device_bytes=10**9),
        _offer("ray", strategies=["ddp"], nodes=2, processes_per_node=2, memory_per_device_bytes=10**8),
    ]
    with pytest.raises(CapacityError) as info:
        place(needs, offers)
    assert info.value.param == param
    assert named in info.value.message, info.value.message
    with pytest.raises(CapacityError) as nothing:
        place(needs, [])
    assert nothing.value.param == "spec.distributed"


def test_a_vllm_job_on_a_cpu_class_counts_the_engines_copy_and_cache():
    """On a CPU vLLM's copy of the weights and its KV cache stay beside the training state (no sleep mode):
    a vllm job that fits a CPU class on its training step alone is refused there, naming the engine; the
    same class on a GPU (the engine sleeps while the policy trains) and an hf job are placed."""
    from contract.fleet import GIB, VLLM_CPU_KV_CACHE_GIB, vllm_cpu_resident_bytes
    from contract.spec import TrainSpec

    shape = builtin_model_shape(SMOLLM2_135M_INSTRUCT)
    assert shape is not None
    vllm = TrainSpec.model_validate({"model": {"name": SMOLLM2_135M_INSTRUCT}, "rollout": {"engine": "vllm"}})
    resident = vllm_cpu_resident_bytes(vllm, shape)
    assert resident == shape.parameters * 4 + VLLM_CPU_KV_CACHE_GIB * GIB  # float32 weights, 1 GiB cache
    low = vllm.model_copy(update={"model": vllm.model.model_copy(update={"dtype": "bfloat16"})})
    assert vllm_cpu_resident_bytes(low, shape) == shape.parameters * 2 + VLLM_CPU_KV_CACHE_GIB * GIB
    assert vllm_cpu_resident_bytes(TrainSpec(), shape) == 0  # HF generate: nothing beside

    step = 3 * GIB
    needs = _needs(rollout_engine="vllm", memory_per_device_bytes=step, cpu_resident_bytes=resident)
    engines = {"rollout_engines": ["hf", "vllm"], "memory_per_device_bytes": step + resident - 1}
    with pytest.raises(CapacityError) as caught:
        place(needs, [_offer("cpu", **engines)])
    assert caught.value.param == "spec.rollout.engine"
    assert (
        "3.00 GiB for training + " in caught.value.message
        and "for vLLM's copy and cache" in caught.value.message
    )
    assert place(needs, [_offer("gpu", device="cuda", **engines)]).worker_class.queue == "gpu"
    fitting = {**engines, "memory_per_device_bytes": step + resident}
    assert place(needs, [_offer("cpu", **fitting)]).worker_class.queue == "cpu"
    hf = _needs(memory_per_device_bytes=step)
    assert place(hf, [_offer("cpu", **engines)]).worker_class.queue == "cpu"
    # Too small for the training step itself: the field that drives the step is named, not the engine.
    small = {**engines, "memory_per_device_bytes": step - 1}
    with pytest.raises(CapacityError) as caught:
        place(needs, [_offer("cpu", **small)])
    assert caught.value.param == needs.memory_param
