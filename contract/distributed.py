"""How a job spreads over processes and machines: the `distributed` part of a job spec, and what it costs.

Torch-free (the service validates specs and estimates memory with it). `DistributedSpec` is a job spec's
`distributed` section: which data parallel strategy runs (`ddp`: every process holds the whole model,
gradients are all-reduced; `fsdp2`: parameters, gradients and optimizer state are sharded over the
processes, each decoder layer gathered only while it runs) and over how many nodes and processes per node.
Unknown fields are refused, and a field that only `fsdp2` reads set under `ddp` is refused naming it: a spec
never asks for something the engine would ignore.

Migration from the one-node spec (docs/DISTRIBUTED.md): `num_processes: N` is still accepted and means
`nodes: 1, processes_per_node: N`; `mixed_precision: "bf16"` / `"no"` mean
`{param_dtype: bfloat16}` / the float32 default. `num_processes` stays readable as the world size.

What a job's processes hold in memory, and which worker class has room for it, is placement's
(contract.fleet).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Fields that only the fsdp2 strategy reads (ddp keeps full fp32 parameters and the optimizer on the device).
FSDP2_ONLY_FIELDS = ("reshard_after_forward", "offload_optimizer")
# The one-node spec's spellings of mixed_precision.
LEGACY_MIXED_PRECISION = {"no": {}, "bf16": {"param_dtype": "bfloat16"}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MixedPrecisionSpec(_Strict):
    """The dtype layers compute in (the master weights and the optimizer stay float32) and the dtype
    gradients are reduced in. fsdp2: its MixedPrecisionPolicy. ddp: bfloat16 autocast around the forward,
    gradients reduced in float32 (a bfloat16 reduce_dtype is refused there)."""

    param_dtype: Literal["float32", "bfloat16"] = "float32"
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"


class DistributedSpec(_Strict):
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    processes_per_node: Annotated[int, Field(ge=1, le=4096)] = 1
    # fsdp2: free each layer's gathered parameters after its forward (gathered again for backward): less
    # memory, one more all-gather per layer and step.
    reshard_after_forward: bool = True
    mixed_precision: MixedPrecisionSpec = Field(default_factory=MixedPrecisionSpec)
    # Recompute each decoder layer's activations in backward instead of keeping them.
    activation_checkpointing: bool = False
    # fsdp2: keep the sharded parameters, gradients and optimizer state in host memory (the step runs there).
    offload_optimizer: bool = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def num_processes(self) -> int:
        """The world size (the one-node spec's name for it)."""
        return self.world_size

    @model_validator(mode="before")
    @classmethod
    def _one_node_spellings(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "num_processes" in data:
            n = data.pop("num_processes")
            if "processes_per_node" in data or data.get("nodes", 1) != 1:
                raise ValueError(
                    "distributed.num_processes is the one-node spelling of processes_per_node: "
                    "give nodes and processes_per_node instead"
                )
            data["processes_per_node"] = n
        precision = data.get("mixed_precision")
        if isinstance(precision, str):
            if precision not in LEGACY_MIXED_PRECISION:
                raise ValueError(
                    f"distributed.mixed_precision must be 'no', 'bf16' or an object, got {precision!r}"
                )
            data["mixed_precision"] = LEGACY_MIXED_PRECISION[precision]
        return data

    @model_validator(mode="after")
    def _fsdp2_fields_need_fsdp2(self) -> DistributedSpec:
        if self.strategy == "ddp" and self.mixed_precision.reduce_dtype != "float32":
            raise ValueError(
                "distributed.mixed_precision.reduce_dtype: ddp reduces gradients in float32 "
                "(a bfloat16 reduce needs distributed.strategy 'fsdp2')"
            )
        if self.strategy != "fsdp2":
            for name in FSDP2_ONLY_FIELDS:  # plain defaults, read off the fields (no model built per check)
                if getattr(self, name) != DistributedSpec.model_fields[name].default:
                    raise ValueError(f"distributed.{name} applies only to distributed.strategy 'fsdp2'")
        if self.mixed_precision.reduce_dtype == "bfloat16" and self.mixed_precision.param_dtype == "float32":
            raise ValueError(
                "distributed.mixed_precision.reduce_dtype 'bfloat16' needs param_dtype 'bfloat16' "
                "(reducing float32 gradients in a lower precision than they were computed in only loses bits)"
            )
        return self
