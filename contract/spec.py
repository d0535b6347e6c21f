"""The job spec: one pydantic model shared by the engine, the worker and the HTTP service.

This module imports no torch (the service validates jobs with it). Unknown fields are rejected and every
out-of-range value fails with a message whose location names the field. Algorithm parameters are checked
with the same dataclasses the losses use (contract.hyperparams, registered per algorithm in
contract.algorithms), verifier parameters with contract.verifiers, so the service and the engine agree.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contract import algorithms, checkpointing, graders, safejson, verifiers
from contract import control as controllers
from contract.algorithms import CONTROLLED_PARAMS, SPEC_FREE_PARAMS, make_loss_params
from contract.catalog import BUILTIN_MODELS, TINY_ARITH
from contract.control import ControlSettings
from contract.control.base import MAX_ENTROPY_NATS
from contract.distributed import DistributedSpec
from contract.hyperparams import BAND_AROUND_TARGET, EntropyTarget
from contract.spec_migration import closed_loop_laws, migrate_control

# Numeric bounds: every number field of a spec has a finite range, stated here or in its annotation below.
# The API validates a job with this model (service/job_specs.py) and the trainer loads the stored spec with
# the same one (load_spec), and the store keeps the validated JSON as written (store/models.py, JSONText),
# so the two accept the same numbers: nothing the API accepted is refused by the trainer. Free-form maps
# (task.params, verifier.params, algorithm.params) are checked by their own validators (contract.hyperparams,
# contract.verifiers), which both sides also share.
MAX_STEPS = 10_000_000  # steps, warm-up steps and intervals counted in steps
MAX_GRAD_CLIP = 1e6  # a gradient-norm clip above this never clips: 1e6 says "off" as well as anything larger
MAX_TEMPERATURE = 10.0
MIN_TEMPERATURE = 1e-3
"""The lowest sampling temperature. Sampling divides float32 logits by the temperature, then softmaxes:
- below float32's smallest normal number (1.2e-38) the temperature itself rounds to 0 in float32, and
  logits / T is inf or NaN: torch.multinomial then refuses the probabilities (a crash, not a result);
- above it, logits / T may still overflow float32's 3.4e38 for a large logit (|logit| / T > 3.4e38);
- and once the softmax subtracts the largest logit, every token more than 104·T below it gets
  exp(-Δ/T) < exp(-104), which is 0 in float32: at T = 1e-3 any gap over 0.104 already samples the argmax.
So temperatures below 1e-3 buy nothing over greedy decoding (evaluation.greedy) and, far below, break the
arithmetic; 1e-3 keeps |logits / T| ≤ 1e3·|logit|, finite for every logit a model produces (float32 logits
of 3.4e35 or more do not occur in a model that trains)."""


class _Strict(BaseModel):
    # No NaN or infinity in any float field: a spec with one is refused naming the field, the same way over
    # HTTP (estimate and create) and from a file.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LoraSpec(_Strict):
    r: Annotated[int, Field(ge=1, le=1024)] = 8
    alpha: Annotated[int, Field(ge=1, le=1_000_000)] = 16
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    target_modules: list[str] | None = None
    merge_on_save: bool = False


class ModelSpec(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=512)] = TINY_ARITH
    dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoraSpec | None = None


class TaskSpec(_Strict):
    source: Literal["arithmetic", "reasoning_gym", "jsonl"] = "arithmetic"
    name: str | None = None  # reasoning-gym dataset name
    path: str | None = None  # JSONL file (the service fills it from an uploaded file id)
    params: dict[str, Any] = Field(default_factory=dict)
    train_size: Annotated[int, Field(ge=0, le=10_000_000)] = 2000  # JSONL: 0 = every line
    eval_size: Annotated[int, Field(ge=0, le=100_000)] = 64
    prompt_template: Annotated[str, Field(max_length=10_000)] = "{prompt}"
    use_chat_template: bool = False

    @field_validator("prompt_template")
    @classmethod
    def _template_has_prompt(cls, value: str) -> str:
        if "{prompt}" not in value:
            raise ValueError("prompt_template must contain '{prompt}'")
        return value

    @model_validator(mode="after")
    def _source_fields(self) -> TaskSpec:
        if self.source == "reasoning_gym" and not self.name:
            raise ValueError("task.name is required when task.source is 'reasoning_gym'")
        if self.source == "jsonl" and not self.path:
            raise ValueError("task.path is required when task.source is 'jsonl'")
        if self.train_size == 0 and self.source != "jsonl":
            raise ValueError(
                "task.train_size must be ≥ 1 for generated tasks (0 means 'every line' of a JSONL file)"
            )
        return self


class VerifierSpec(_Strict):
    name: str = "exact"
    params: dict[str, Any] = Field(default_factory=dict)


class OverlongSpec(_Strict):
    cache_length: Annotated[int, Field(ge=1, le=65_536)] = 4  # at most sampling.max_new_tokens


class RewardSpec(_Strict):
    style: Literal["binary", "pm1"] = "binary"
    overlong: OverlongSpec | None = None  # DAPO soft overlong penalty; on by default for dapo


class AlgorithmSpec(_Strict):
    name: str = "stare"
    advantage: str | None = None  # default: the estimator the method is defined with
    params: dict[str, Any] = Field(default_factory=dict)
    # The algorithm's controller's settings, keyed by `controller` (contract/control): filled in with the
    # controller's defaults for an algorithm that has one; None for one without.
    control: Annotated[SerializeAsAny[ControlSettings], BeforeValidator(controllers.settings_of)] | None = (
        None
    )

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        return migrate_control(data)

    @field_validator("name")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        algorithms.get(value)  # raises ValueError listing the valid names
        return value

    @field_validator("advantage")
    @classmethod
    def _known_estimator(cls, value: str | None) -> str | None:
        return None if value is None else algorithms.check_estimator(value)

    @model_validator(mode="after")
    def _params_valid(self) -> AlgorithmSpec:
        for name in sorted(CONTROLLED_PARAMS & set(self.params)):
            raise ValueError(
                f"algorithm.params.{name} is set at every step by its controller, not by the spec"
            )
        if "kl_beta" in self.params:
            raise ValueError("algorithm.params.kl_beta: set the KL penalty's weight with optim.kl_beta")
        make_loss_params(self.name, **self.params)  # raises ValueError naming the parameter
        law = algorithms.get(self.name).controller
        if self.control is not None and law is None:
            raise ValueError(
                f"algorithm.control: algorithm {self.name!r} has no controller; name a law "
                f"({', '.join(closed_loop_laws())}), or leave algorithm.name unset for the default ({controllers.DEFAULT_LAW})"
            )
        if self.control is not None and self.control.controller != law:
            raise ValueError(
                f"algorithm.control.controller: {self.name!r} is driven by {law!r}, not {self.control.controller!r}"
            )
        if self.control is not None and self.control.target.nats is not None:
            try:  # a relative target is checked with its value once known
                self.control.check_resolved()
            except ValueError as err:
                raise ValueError(f"algorithm.control: {err}") from None
        return self

    def target(self) -> EntropyTarget | None:
        """The target of the algorithm's controller as the user set it; None without a controller."""
        return None if self.control is None else self.control.target

    def controller_settings(self, target_entropy: float) -> ControlSettings | None:
        """The controller's settings with the target resolved (None without a controller)."""
        if self.control is None:
            return None
        try:
            return self.control.resolved(target_entropy).check_resolved()
        except ValueError as err:
            raise ValueError(f"algorithm.control: {err}") from None

    @property
    def estimator(self) -> str:
        return self.advantage or algorithms.get(self.name).advantage_estimator

    def resolved_params(self) -> dict[str, Any]:
        """Every loss parameter with its default; the gate's per-step state is not a parameter, and the KL
        weight is optim.kl_beta."""
        params = dataclasses.asdict(make_loss_params(self.name, **self.params))
        for name in SPEC_FREE_PARAMS:
            params.pop(name, None)
        return params


class SamplingSpec(_Strict):
    group_size: Annotated[int, Field(ge=1, le=512)] = 8
    temperature: Annotated[float, Field(ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    max_new_tokens: Annotated[int, Field(ge=1, le=65_536)] = 16


class DynamicSamplingSpec(_Strict):
    enabled: bool = False
    max_gen_batches: Annotated[int, Field(ge=1, le=100)] = 3


class OptimSpec(_Strict):
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 2e-4
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 100
    prompts_per_step: Annotated[int, Field(ge=1, le=100_000)] = 8
    micro_batch_size: Annotated[int, Field(ge=1, le=100_000)] = 64  # responses per forward/backward
    grad_clip: Annotated[float, Field(gt=0.0, le=MAX_GRAD_CLIP)] | None = 1.0
    ppo_epochs: Annotated[int, Field(ge=1, le=100)] = 1
    kl_beta: Annotated[float, Field(ge=0.0, le=100.0)] = 0.0
    # Rows with advantage exactly 0 are scored without autograd when the loss cannot send them a gradient
    # (same loss, metrics and update; see Engine._grad_rows). Off: every row runs forward and backward.
    skip_zero_advantage: bool = True
    dynamic_sampling: DynamicSamplingSpec = Field(default_factory=DynamicSamplingSpec)


class SftSpec(_Strict):
    steps: Annotated[int, Field(ge=0, le=1_000_000)] = 800
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 3e-3
    batch_size: Annotated[int, Field(ge=1, le=100_000)] = 128
    # Learning-rate schedule: linear warm-up over warmup_steps, then constant or cosine decay to
    # min_lr_ratio * lr at the last step.
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0
    min_lr_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    grad_clip: Annotated[float, Field(gt=0.0, le=MAX_GRAD_CLIP)] | None = None
    adam_beta2: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.999
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01
    # Cross-entropy against (1 − ε)·one-hot + ε/V: the warm-started policy keeps some probability off its
    # answer, so sampled accuracy and entropy leave RL room to sharpen.
    label_smoothing: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0


class RolloutSpec(_Strict):
    """Which engine samples the rollouts (docs/ROLLOUTS.md). hf: transformers' generate on the policy
    itself, the reference. vllm: a vLLM engine colocated with the trainer, one per process under either
    distributed.strategy (under fsdp2 fed from the shards, one gathered tensor at a time), its weights
    pushed after every optimiser step; its log-probs differ from the trainer's by kernels and rounding,
    which the step's rollout/mismatch_* metrics measure."""

    engine: Literal["hf", "vllm"] = "hf"
    # Truncated importance sampling: each token's advantage is weighted by min(π_trainer/π_sampler, tis_cap)
    # (docs/ALGORITHMS.md). None: off.
    tis_cap: Annotated[float, Field(ge=1.0, le=1000.0)] | None = None
    # vllm on a GPU: the share of each device's memory the engine may take while awake (its weights and KV
    # cache). None: from the memory estimate, what the training state leaves (trainer.rollout.vllm_engine).
    gpu_memory_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] | None = None


class EntropyBandSpec(_Strict):
    low: Annotated[float, Field(ge=0.0, le=MAX_ENTROPY_NATS)] = 0.1
    high: Annotated[float, Field(ge=0.0, le=MAX_ENTROPY_NATS)] = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> EntropyBandSpec:
        if self.low > self.high:
            raise ValueError(f"entropy_band.low ({self.low}) must be ≤ entropy_band.high ({self.high})")
        return self


class CheckpointSpec(_Strict):
    interval: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 50
    keep_last: Annotated[int, Field(ge=1, le=1000)] = 2
    # Which checkpoints keep the optimizer state on the server (contract/checkpointing.py): the job is the same.
    training_state: checkpointing.TrainingStateKept = checkpointing.DEFAULT_TRAINING_STATE


class EvaluationSpec(_Strict):
    interval: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0  # 0: only before and after training
    k: Annotated[int, Field(ge=1, le=256)] = 1  # samples per prompt for avg@k / pass@k
    temperature: Annotated[float, Field(ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    greedy: bool = True  # k = 1 and greedy: plain accuracy

    @model_validator(mode="after")
    def _greedy_takes_one(self) -> EvaluationSpec:
        if self.greedy and self.k != 1:
            fix = "set evaluation.greedy: false to sample k responses per prompt (avg@k, pass@k), or k: 1"
            raise ValueError(f"evaluation.k must be 1 when evaluation.greedy is true (on by default): {fix}")
        return self


TOOL_NAMES = ("calculator", "python")  # the built-in tools (trainer/envs/tools.py); docs/TOOLS.md
ToolName = Literal["calculator", "python"]


class ToolLimitsSpec(_Strict):
    """What one call of the Python code tool may use (docs/TOOLS.md). The calculator bounds itself (its
    exponent and result size) and only reads output_bytes. The service refuses limits above the operator's
    (STARE_TOOL_MAX_* in service/settings.py)."""

    cpu_seconds: Annotated[float, Field(gt=0.0, le=600.0)] = 1.0  # RLIMIT_CPU of the sandboxed process
    wall_seconds: Annotated[float, Field(gt=0.0, le=600.0)] = 2.0  # the parent kills the sandbox after this
    memory_mb: Annotated[int, Field(ge=32, le=65_536)] = 256  # RLIMIT_AS (address space)
    processes: Annotated[int, Field(ge=1, le=4096)] = 8  # RLIMIT_NPROC: threads and processes in the sandbox
    output_bytes: Annotated[int, Field(ge=16, le=16 * 2**20)] = 4096  # stdout+stderr kept; the rest is cut

    @model_validator(mode="after")
    def _wall_covers_cpu(self) -> ToolLimitsSpec:
        if self.wall_seconds < self.cpu_seconds:
            raise ValueError(
                f"environment.limits.wall_seconds ({self.wall_seconds}) must be ≥ cpu_seconds "
                f"({self.cpu_seconds})"
            )
        return self


class EnvironmentSpec(_Strict):
    """A multi-turn environment (trainer/envs/): the rollout is a conversation of model turns and tool
    results, up to max_turns model turns, and the last turn's text is the answer the verifier scores.

    A model turn ends at EOS (or after sampling.max_new_tokens tokens). A turn whose text starts with
    `(TOOL)` is a tool call: TOOL is a tool's name or its 1-based position in `tools`, the rest of the turn
    is the argument (`(1)347*68`, `(python)print(2**10)`). The tool's result, cut to max_result_tokens
    tokens and followed by a newline, is appended to the context (masked out of the loss) and the model
    takes the next turn. docs/TOOLS.md has the format, the tools and the sandbox.
    """

    name: Literal["tool_use"] = "tool_use"
    tools: Annotated[list[ToolName], Field(min_length=1, max_length=len(TOOL_NAMES))] = Field(
        default_factory=lambda: list[ToolName](["calculator"])
    )
    max_turns: Annotated[int, Field(ge=1, le=32)] = 3  # model turns per episode (tool calls ≤ max_turns − 1)
    max_result_tokens: Annotated[int, Field(ge=1, le=4096)] = 32  # tokens of one tool result in the context
    limits: ToolLimitsSpec = Field(default_factory=ToolLimitsSpec)

    @field_validator("tools")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"environment.tools lists a tool twice: {value}")
        return value


class TrainSpec(_Strict):
    """A whole RL fine-tuning job."""

    name: Annotated[str, Field(max_length=200)] | None = None
    model: ModelSpec = Field(default_factory=ModelSpec)
    task: TaskSpec = Field(default_factory=TaskSpec)
    verifier: VerifierSpec = Field(default_factory=VerifierSpec)
    # A tenant's grader in place of the verifier, and how it runs (contract.graders, docs/GRADERS.md).
    grader: graders.Grader | None = None
    grading: graders.GradingSpec | None = None
    reward: RewardSpec = Field(default_factory=RewardSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec, validate_default=True)  # `_law_can_act` reads it
    sft: SftSpec | None = None
    entropy_band: EntropyBandSpec = Field(default_factory=EntropyBandSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    distributed: DistributedSpec = Field(default_factory=DistributedSpec)
    # None: single-turn (the response is the answer). A tool-use environment: docs/TOOLS.md.
    environment: EnvironmentSpec | None = None
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0

    @field_validator("optim")
    @classmethod
    def _law_can_act(cls, optim: OptimSpec, info: ValidationInfo) -> OptimSpec:
        algorithm: AlgorithmSpec | None = info.data.get("algorithm")  # None: it failed its own validation
        if algorithm is None:
            return optim
        law = algorithms.get(algorithm.name).controller_info
        if law is not None and law.needs_off_policy and optim.ppo_epochs < 2:
            # One update per batch: π_θ = π_old until the optimiser step, every ratio is 1 and the clip
            # (the law's actuator) never binds: the job would be grpo_ds with a law that cannot act.
            raise ValueError(
                f"optim.ppo_epochs: {algorithm.name} steers the ratio clip's ε_high, which binds only on an "
                "off-policy update; with ppo_epochs 1 every ratio π_θ/π_old is 1 and the law cannot act. "
                "Set optim.ppo_epochs ≥ 2, or use the default law (leave algorithm.name unset)"
            )
        return optim

    @model_validator(mode="after")
    def _cross_field(self) -> TrainSpec:
        if self.sft is not None and self.sft.steps > 0 and self.model.name not in BUILTIN_MODELS:
            raise ValueError("sft warm-start is only offered for built-in models (model.name)")
        if self.sft is not None and self.sft.steps > 0 and self.model.name != TINY_ARITH:
            raise ValueError("sft warm-start is only offered for the built-in tiny model 'tiny-arith'")
        overlong = self.reward.overlong
        if overlong is not None and overlong.cache_length > self.sampling.max_new_tokens:
            raise ValueError("reward.overlong.cache_length must be ≤ sampling.max_new_tokens")
        try:
            verifiers.validate_params(self.verifier.name, self.verifier.params)
        except ValueError as err:
            raise ValueError(f"verifier: {err}") from None
        # A resolved spec writes the default verifier out: only another one is a second reward.
        graders.check_job(
            self.grader,
            self.grading,
            verifier_set=self.verifier != VerifierSpec(),
            style=self.reward.style,
        )
        if self.rollout.tis_cap is not None and self.rollout.engine != "vllm":
            raise ValueError(
                "rollout.tis_cap needs rollout.engine vllm (HF generate samples from the trainer)"
            )
        if self.environment is not None and self.distributed.world_size > 1:
            raise ValueError(
                "environment: tool-use rollouts run in one process (distributed: one node, one process)"
            )
        return self

    def band_follows_target(self) -> bool:
        """The entropy band is placed around the resolved target (BAND_AROUND_TARGET × target): where the
        spec sets no band and its controller's target is relative (its nats are known only once RL starts)."""
        target = self.algorithm.target()
        return "entropy_band" not in self.model_fields_set and target is not None and target.is_relative

    def band_around(self, target_entropy: float) -> tuple[float, float]:
        low, high = BAND_AROUND_TARGET
        return low * target_entropy, high * target_entropy

    @property
    def responses_per_step(self) -> int:
        return self.optim.prompts_per_step * self.sampling.group_size

    def resolved(self) -> dict[str, Any]:
        """The spec with every default filled in, plus the loss parameters the engine will use."""
        data = self.model_dump(mode="json")
        data["algorithm"]["advantage"] = self.algorithm.estimator
        data["algorithm"]["params"] = self.algorithm.resolved_params()
        return data


def load_spec(path: str | Path) -> TrainSpec:
    """A spec file (YAML or JSON), under the same document rules as a request body (contract.safejson)."""
    with open(path, encoding="utf-8") as fh:
        try:
            data = yaml.safe_load(fh) or {}
        except ValueError as err:  # e.g. an integer past Python's 4,300-digit conversion limit
            raise ValueError(f"{path}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a job spec must be a mapping")
    problem = safejson.find_unsafe(data)
    if problem is not None:
        raise ValueError(f"{path}: {problem.where or 'the spec'}: {problem.message}")
    return TrainSpec.model_validate(data)
