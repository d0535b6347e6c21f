"""vLLM as the rollout engine (spec `rollout.engine: vllm`), colocated with the trainer: one in-process
`vllm.LLM` per trainer process, holding its own copy of the policy's weights, refreshed before the first
rollout after an optimiser step (`load_weights`, fed the strategy's `full_state` by trainer.rollout.hybrid's
`rollout_mode`). docs/ROLLOUTS.md describes it.

- Above one process (torchrun, a Ray worker; ddp or fsdp2): each process builds its own engine (tensor
  parallel 1) through vLLM's `external_launcher` backend, which joins the process group already there and
  puts the engine on the process's own device (LOCAL_RANK). Each engine is built from a folder its process
  writes from the strategy's `full_state`: under fsdp2 every tensor is gathered from the shards as it is
  reached (a collective: every process builds its engine at the same point and iterates in the same order),
  and at most one file's worth of full tensors is held beside the shards (`_save_policy`).

- Token ids in, token ids out: prompts go to vLLM as token ids (`TokensPrompt`) and the sampled ids come
  back as ids; nothing is re-tokenised, so multi-turn episodes keep the exact tokens of every turn.
- The sampling record: vLLM's log-probs are of its own processed distribution (temperature, top-p) and its
  own kernels, so they are not π_old. `gives_pi_old` is False: the update scores π_old with the trainer
  (`trainer.policy.update.measure_old_policy`), and the sampler's log-probs travel as `Generation.sampler_logprob`
  for the mismatch metrics and the truncated importance-sampling correction (`trainer.rollout.mismatch`).
- Sleep and wake: on a GPU the engine is built with `enable_sleep_mode` and sleeps (weights offloaded, KV
  cache freed) while the trainer updates, so both fit one device; its share of the device while awake is
  rollout.gpu_memory_fraction, or what the estimated training state leaves (`memory_fraction`). On the CPU
  there is nothing to free (vLLM's CPU backend has no sleep mode): `sleep` and `wake` do nothing there.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from contract.fleet import VLLM_CPU_KV_CACHE_GIB, job_memory
from contract.spec import TrainSpec
from trainer.distributed.hf_folder import FILE_BYTES, write_folder
from trainer.distributed.memory import model_shape
from trainer.distributed.strategy import full_state
from trainer.models import hf_model
from trainer.rollout.generation import Generation, HFGenerate, RolloutEngine
from trainer.rollout.sampling import seeds_or_drawn

# vLLM reads these when it is imported. In-process engine: the weight push hands tensors to the model
# runner directly (no copy through a file or a socket). CPU: a 1 GiB KV cache, and no thread pinning, as
# the trainer shares the cores.
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": str(VLLM_CPU_KV_CACHE_GIB),  # what placement counts (contract.fleet)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
MAX_MODEL_LEN_CAP = 4096  # tokens: prompt + response (multi-turn: the whole episode)


def _import_vllm() -> Any:
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    import vllm
    from vllm import _custom_ops

    if not torch.cuda.is_available():
        # vLLM's CPU linear layers pack their weight into a oneDNN handle and drop the tensor; an in-place
        # weight reload then leaves the handle on memory it no longer owns (measured: log-probs off by up
        # to 1 nat after the second push). Without oneDNN they keep the weight and run torch's linear, so
        # the push copies into the very tensor the layer reads.
        _custom_ops._supports_onednn = False
    return vllm


class VLLMGenerate:
    """The rollout engine on an in-process vLLM copy of the policy (trainer.rollout.generation.RolloutEngine)."""

    gives_pi_old = False  # its log-probs are the sampler's, not the trainer's π_old (module docstring)
    owns_weights = True  # its own copy, fed by load_weights (trainer.rollout.hybrid.rollout_mode)

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_model_len: int | None = None,
        gpu_memory_fraction: float | None = None,
        training_bytes: int = 0,
        world_size: int = 1,
    ) -> None:
        """`gpu_memory_fraction`: the device share the engine may take (None: what `training_bytes`, the
        training state that stays on the device while the engine is awake, leaves: `memory_fraction`).
        `world_size`: the run's processes (above one, each builds its own engine in the group)."""
        self.model, self.tokenizer, self.world_size = model, tokenizer, world_size
        self.gpu_memory_fraction, self.training_bytes = gpu_memory_fraction, training_bytes
        inner = hf_model(model)
        self.on_gpu = next(iter(inner.parameters())).device.type == "cuda"
        limit = int(getattr(inner.config, "max_position_embeddings", MAX_MODEL_LEN_CAP))
        self.max_model_len = max_model_len or min(limit, MAX_MODEL_LEN_CAP)
        eos = inner.generation_config.eos_token_id
        eos = tokenizer.eos_token_id if eos is None else eos
        self.eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0])
        self._llm: Any = None
        self.asleep = False

    @property
    def llm(self) -> Any:
        """The vLLM engine, built on first use from the policy's weights at that moment (after an SFT
        warm-start or a checkpoint restore), through a transient folder deleted once it is loaded."""
        if self._llm is None:
            vllm = _import_vllm()
            inner = hf_model(self.model)
            dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
            with tempfile.TemporaryDirectory(prefix="stare-vllm-") as folder:
                _save_policy(self.model, self.tokenizer, Path(folder))
                self._llm = vllm.LLM(
                    model=folder,
                    dtype=dtype.get(next(iter(inner.parameters())).dtype, "float32"),
                    max_model_len=self.max_model_len,
                    max_num_seqs=256,
                    enforce_eager=True,  # CUDA graphs / torch.compile start slower than short jobs gain
                    enable_sleep_mode=self.on_gpu,
                    gpu_memory_utilization=self._memory_fraction(),
                    # The log-probs of the distribution the tokens were drawn from: after temperature, top-p.
                    logprobs_mode="processed_logprobs",
                    seed=0,
                    # Above one process: one engine per process, in the process group already there (module
                    # docstring); vLLM reads RANK and LOCAL_RANK, which torchrun and the Ray worker set.
                    distributed_executor_backend="external_launcher" if self.world_size > 1 else None,
                )
            self._vllm = vllm
        return self._llm

    def _memory_fraction(self) -> float:
        if self.gpu_memory_fraction is not None or not self.on_gpu:
            return self.gpu_memory_fraction or MEMORY_FRACTION_BOUNDS[1]
        _, device_bytes = torch.cuda.mem_get_info()
        return memory_fraction(self.training_bytes, device_bytes)

    # ------------------------------------------------------------------ sampling

    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        num_samples: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        greedy: bool = False,
        record: bool = False,
        seeds: Sequence[int] | None = None,
    ) -> Generation:
        """num_samples responses per left-padded prompt row, laid out as HFGenerate lays them out; `record`
        is ignored (no sampling record usable as π_old; the sampler's log-probs always come back). Each
        prompt's request carries its seed (`seeds`, trainer.rollout.sampling; None: drawn from torch's global RNG):
        vLLM samples a seeded request from its own generator, so a prompt's samples do not depend on the
        batch around it."""
        del record
        llm = self.llm
        self.wake()
        prompts = [
            {"prompt_token_ids": [int(t) for t in row[mask.bool()].tolist()]}
            for row, mask in zip(prompt_ids, prompt_mask)
        ]
        params = [
            self._vllm.SamplingParams(
                n=num_samples,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                max_tokens=max_new_tokens,
                stop_token_ids=self.eos_ids,
                logprobs=0,
                detokenize=False,
                seed=seed,
            )
            for seed in ([None] * len(prompts) if greedy else seeds_or_drawn(seeds, len(prompts)))
        ]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        completions = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        return self._layout(prompt_ids, prompt_mask, num_samples, completions)

    def _layout(self, prompt_ids: Tensor, prompt_mask: Tensor, g: int, completions: list[Any]) -> Generation:
        rows = len(completions)
        width = max(1, max(len(c.token_ids) for c in completions))
        responses = torch.full((rows, width), self.pad_id, dtype=torch.long)
        response_mask = torch.zeros((rows, width), dtype=torch.float32)
        sampler_logprob = torch.zeros((rows, width), dtype=torch.float32)
        truncated = torch.zeros(rows, dtype=torch.bool)
        for i, c in enumerate(completions):
            ids = list(c.token_ids)
            responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask[i, : len(ids)] = 1.0
            truncated[i] = not (ids and ids[-1] in self.eos_ids)
            if c.logprobs is not None:
                values = [step[token].logprob for step, token in zip(c.logprobs, ids)]
                sampler_logprob[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
        rows_ids = prompt_ids.cpu().repeat_interleave(g, dim=0)
        rows_mask = prompt_mask.cpu().long().repeat_interleave(g, dim=0)
        return Generation(
            input_ids=torch.cat([rows_ids, responses], dim=1),
            attention_mask=torch.cat([rows_mask, response_mask.long()], dim=1),
            response_mask=response_mask,
            truncated=truncated,
            prompt_length=int(prompt_ids.shape[1]),
            sampler_logprob=sampler_logprob,
        )

    # ------------------------------------------------------------------ weights and memory

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Loads (name, tensor) pairs into the engine's model, one at a time as the iterator yields them,
        and drops the prefix cache (its KV entries were computed by the old weights). Before the engine is
        built there is nothing to update: it will read the weights then."""
        if self._llm is None:
            return
        self.wake(weights_only=True)
        runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        runner.reload_weights(weights_iterator=iter(weights))
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Before the update, on a GPU: weights to host memory, KV cache freed. The CPU: nothing to free."""
        if self.on_gpu and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self, *, weights_only: bool = False) -> None:
        """Before a rollout: built here if it is not yet (in every process at the same point: under fsdp2
        building it gathers the policy's full weights), then weights and KV cache back on the GPU."""
        llm = self.llm
        if self.on_gpu and self.asleep:
            if weights_only:
                llm.wake_up(tags=["weights"])
                return
            llm.wake_up()
            self.asleep = False


def _save_policy(model: Any, tokenizer: Any, folder: Path, *, file_bytes: int = FILE_BYTES) -> None:
    """The policy as a transformers folder vLLM can load (config, merged weights, tokenizer), written from
    `full_state` (the strategy's) as the tensors come (trainer.distributed.hf_folder): no full copy of a
    sharded model is ever held, at most one file's tensors and the one just gathered. Collective under
    fsdp2 (full_state): every process writes its own folder at the same point."""
    inner = hf_model(model)
    write_folder(
        full_state(model), folder, config=inner.config, generation_config=inner.generation_config,
        tokenizer=tokenizer, file_bytes=file_bytes,
    )  # fmt: skip


MEMORY_FRACTION_BOUNDS = (0.05, 0.9)
MEMORY_MARGIN = 0.1  # of the device: the CUDA context, allocator fragmentation, activations of a scoring pass


def memory_fraction(training_bytes: int, device_bytes: int) -> float:
    """vLLM's share of a device: what the training state that stays there while vLLM is awake (parameters
    and optimizer state: gradients are freed after each step) leaves, less a margin, within the bounds."""
    free = 1.0 - training_bytes / device_bytes - MEMORY_MARGIN
    low, high = MEMORY_FRACTION_BOUNDS
    return round(min(high, max(low, free)), 3)


def build_rollout_engine(spec: TrainSpec, model: Any, tokenizer: Any) -> RolloutEngine:
    """The spec's rollout engine (rollout.engine) on the policy `model` (unwrapped)."""
    if spec.rollout.engine == "vllm":
        # The training state per device, from the estimate (prompts bounded by the engine's context).
        limit = min(
            int(getattr(hf_model(model).config, "max_position_embeddings", MAX_MODEL_LEN_CAP)),
            MAX_MODEL_LEN_CAP,
        )
        estimate = job_memory(spec, model_shape(model), max(1, limit - spec.sampling.max_new_tokens))
        return VLLMGenerate(
            model,
            tokenizer,
            gpu_memory_fraction=spec.rollout.gpu_memory_fraction,
            training_bytes=estimate.parameters_bytes + estimate.optimizer_bytes,
            world_size=spec.distributed.world_size,  # the group's: the runtime refused any other launch
        )
    return HFGenerate(model, tokenizer)
