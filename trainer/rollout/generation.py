"""Generation behind one small interface, so a second rollout engine (vLLM) can stand in for HF generate.

`RolloutEngine.generate`: a batch of left-padded prompt token ids → the sampled token ids (prompt and
response), the response mask up to each first EOS, the truncation flags and, on request, the sampling
record (each response token's log-prob, entropy and C(p) under the sampling policy, which the update may
read as π_old). Scoring the responses is `trainer.rollout.batch.score_responses`. `HFGenerate` is the first
implementation: transformers' `generate` with a KV cache, each prompt prefilled once for its G samples,
each prompt's samples drawn from its own stream (`seeds`; trainer.rollout.sampling).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import DynamicCache, LogitsProcessorList

from trainer.algos.kernels import token_stats_from_logits
from trainer.models import hf_model
from trainer.rollout.sampling import SeededSampler, seeds_or_drawn

SampleRecord = tuple[Tensor, Tensor, Tensor]  # (log-prob, entropy, C), each (B, R), 0 past the response


@dataclass(frozen=True)
class Generation:
    """What a rollout engine returns, on the CPU; B = prompts × samples, example-major."""

    input_ids: Tensor  # (B, P + R) long
    attention_mask: Tensor  # (B, P + R) long
    response_mask: Tensor  # (B, R) float: generated tokens up to and including the first EOS
    truncated: Tensor  # (B,) bool: no EOS within the budget
    prompt_length: int  # P
    sample_record: SampleRecord | None = None
    # (B, R) each response token's log-prob under the engine's own sampling distribution, where the engine
    # is not the trainer (vLLM): the mismatch metrics and the truncated IS correction read it
    sampler_logprob: Tensor | None = None


class RolloutEngine(Protocol):
    """A sampler of responses. Between rollouts the trainer updates the policy; `trainer.rollout.hybrid.rollout_mode`
    switches it to sampling and back through `owns_weights`, `wake`, `load_weights` and `sleep`."""

    # Whether `sample_record` (when recorded) is the trainer's own π_old, so the update may read it in place
    # of a forward. False for an engine with its own kernels and weights copy (vLLM).
    gives_pi_old: bool
    # Whether it samples from its own copy of the weights (vLLM), which `load_weights` refreshes after an
    # update; False: it samples from the policy itself (HF generate, inside the strategy's full_weights).
    owns_weights: bool

    def wake(self) -> None:
        """Before a rollout: take back the device memory given up by `sleep`."""
        ...

    def sleep(self) -> None:
        """After a rollout: give up device memory (weights, KV cache) for the update."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Take the policy's new weights (full tensors in transformers' names, one at a time)."""
        ...

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
        """num_samples responses for each left-padded prompt row (n, P); `record`: the sampling record too;
        `seeds`: each row's sampling stream (trainer.rollout.sampling; None: drawn from torch's global RNG)."""
        ...


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def model_device(model: Any) -> torch.device:
    """Where the model's weights live (the first parameter's device)."""
    return next(iter(model.parameters())).device


def cache_argument(model: Any) -> str:
    """The forward/generate keyword of the KV cache: transformers 5.x renamed past_key_values to cache."""
    model_class: Any = type(hf_model(model))
    return _cache_argument_of(model_class)


@functools.cache
def _cache_argument_of(model_class: Any) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@torch.no_grad()
def shared_prompt_cache(
    model: Any, prompt_ids: Tensor, prompt_mask: Tensor, num_samples: int
) -> DynamicCache:
    """KV cache of the left-padded prompts (n, P) without their last token, repeated to n · num_samples rows.

    One forward over n rows instead of n · num_samples; position ids as generate derives them. The rows
    hold what a prefill of the repeated prompts would hold, up to float rounding of the smaller matmuls.
    """
    cache = DynamicCache(config=hf_model(model).config)
    model(
        input_ids=prompt_ids[:, :-1],
        attention_mask=prompt_mask[:, :-1],
        position_ids=position_ids_from_mask(prompt_mask[:, :-1]),
        use_cache=True,
        logits_to_keep=1,
        **{cache_argument(model): cache},
    )
    cache.batch_repeat_interleave(num_samples)
    return cache


class SampledTokenStats:
    """Records the log-prob, entropy and C(p) of each token generate samples, from its own forward passes.

    A forward hook on the transformers model sees the raw logits of every decoding step: those of call t give
    the distribution of response token t, whose identity arrives as the input of call t + 1 (the last one
    with `finish`). Steps are buffered and scored together, one kernel call per `buffer_bytes` of logits
    (for a small model, one per rollout instead of one per token). The statistics are of the policy at
    `temperature` over the whole vocabulary, as the training pass scores it, whatever top-p or other logits
    processors did to the sampling distribution. Use it in eval mode (no dropout), like generate itself.
    """

    def __init__(self, temperature: float, buffer_bytes: int = 64 * 2**20) -> None:
        self.temperature = temperature
        self.buffer_bytes = buffer_bytes
        self._pending: Tensor | None = None  # (B, V) logits whose sampled token is not known yet
        self._buffer: list[tuple[Tensor, Tensor]] = []  # (logits (B, V), sampled tokens (B,)) to score
        self._buffered = 0
        self._parts: list[tuple[Tensor, Tensor, Tensor]] = []  # scored: (B, n) log-prob, entropy, C
        self._broken = False  # a call without input_ids (inputs_embeds): no statistics this time

    @contextlib.contextmanager
    def recording(self, model: Any) -> Iterator[None]:
        handle = hf_model(model).register_forward_hook(self._hook, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def _hook(self, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        logits = output["logits"] if isinstance(output, dict) else getattr(output, "logits", None)
        if input_ids is None or logits is None:
            self._broken = True
            return
        if self._pending is not None:
            self._add(input_ids[:, -1])
        self._pending = logits[:, -1, :]

    def _add(self, tokens: Tensor) -> None:
        assert self._pending is not None
        self._buffer.append((self._pending, tokens.to(self._pending.device)))
        self._buffered += self._pending.numel() * self._pending.element_size()
        self._pending = None
        if self._buffered >= self.buffer_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        logits = torch.stack([row for row, _ in self._buffer], dim=1)  # (B, n, V)
        tokens = torch.stack([token for _, token in self._buffer], dim=1)  # (B, n)
        self._buffer, self._buffered = [], 0
        stats = token_stats_from_logits(logits, tokens, temperature=self.temperature)
        assert stats.entropy is not None and stats.correction is not None
        self._parts.append((stats.logprob, stats.entropy, stats.correction))

    def finish(self, responses: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """(log-prob, entropy, C), each (B, R) on the CPU and 0 past each response; None if not recorded."""
        width = responses.shape[1]
        if self._pending is not None and width:
            self._add(responses[:, -1])
        self._flush()
        parts, self._parts = self._parts, []
        if self._broken or not parts or sum(part[0].shape[1] for part in parts) != width:
            return None
        mask = response_mask.bool()
        logprob, entropy, correction = (
            torch.cat(column, dim=1).to("cpu", torch.float32).masked_fill(~mask, 0.0)
            for column in zip(*parts)
        )
        return logprob, entropy, correction


def response_mask_from_eos(responses: Tensor, eos_token_id: int | list[int]) -> tuple[Tensor, Tensor]:
    """(B, R) ids → (mask up to and including the first EOS, truncated flag)."""
    eos_ids = torch.tensor(
        eos_token_id if isinstance(eos_token_id, list) else [eos_token_id], device=responses.device
    )
    is_eos = torch.isin(responses, eos_ids)  # (B, R)
    seen_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # EOS strictly before t
    mask = (seen_before == 0).float()
    truncated = ~is_eos.any(-1)
    return mask, truncated


def generation_kwargs(
    model: Any,
    tokenizer: Any,
    *,
    max_new_tokens: int,
    greedy: bool,
    temperature: float,
    top_p: float,
    seeds: Sequence[int] | None = None,
    samples_per_seed: int = 1,
) -> tuple[Any, dict[str, object]]:
    """The EOS id(s) and the `model.generate` arguments every rollout uses: sampling at the spec's
    temperature and top-p with top-k off, each row from its prompt's stream (`seeds`, one per prompt, each
    prompt's `samples_per_seed` rows in a row; trainer.rollout.sampling.SeededSampler), or greedy decoding. The
    sampler draws the tokens itself, so generate runs in its greedy mode either way."""
    gen_config = model.generation_config
    eos = gen_config.eos_token_id if gen_config.eos_token_id is not None else tokenizer.eos_token_id
    kwargs: dict[str, object] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": eos,
        "use_cache": True,
        # Never step-locked across processes (HF turns it on for an FSDP module): generation runs on full
        # weights (Strategy.full_weights), and processes make different numbers of generate calls.
        "synced_gpus": False,
    }
    kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if not greedy:
        if seeds is None:
            raise ValueError("sampling needs a seed per prompt (trainer.rollout.sampling.seeds_or_drawn)")
        sampler = SeededSampler(seeds, samples_per_seed, temperature, top_p)
        kwargs["logits_processor"] = LogitsProcessorList([sampler])
    return eos, kwargs


class SamplingError(ValueError):
    """Sampling met probabilities torch cannot draw from (inf, NaN or negative): the spec's sampling settings
    (a temperature so low that logits / temperature overflows, contract.spec.MIN_TEMPERATURE says why) or a
    model driven to non-finite logits. A ValueError, so the trainer exits USER_ERROR
    (contract.protocol.ExitCode) and the job fails as a user error (invalid_job) instead of being retried
    as a crash."""


UNSAMPLEABLE = "probability tensor contains either"  # torch.multinomial's refusal


def unsampleable(err: RuntimeError, temperature: float, top_p: float) -> SamplingError | None:
    """The SamplingError that `err` stands for, or None when it is another failure."""
    if UNSAMPLEABLE not in str(err):
        return None
    return SamplingError(
        f"sampling at temperature {temperature!r}, top_p {top_p!r} gave probabilities that cannot be sampled "
        f"(inf, NaN or negative: {err}); check sampling.temperature and sampling.top_p"
    )


class HFGenerate:
    """The rollout engine on the policy itself: transformers' generate (KV cache), in eval mode."""

    gives_pi_old = True
    owns_weights = False  # it samples from the policy: nothing to wake, put to sleep or load

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer

    def wake(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        pass

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
        recorder = SampledTokenStats(temperature) if record else None
        out, attention_mask, response_mask, truncated, p_len = self.sample(
            prompt_ids, prompt_mask, num_samples=num_samples, temperature=temperature, top_p=top_p,
            max_new_tokens=max_new_tokens, greedy=greedy, recorder=recorder, seeds=seeds,
        )  # fmt: skip
        sample_record = recorder.finish(out[:, p_len:], response_mask) if recorder is not None else None
        return Generation(out, attention_mask, response_mask, truncated, p_len, sample_record)

    @torch.no_grad()
    def sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        num_samples: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        greedy: bool = False,
        recorder: SampledTokenStats | None = None,
        seeds: Sequence[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
        """(input_ids (B, P+R), attention_mask, response_mask (B, R), truncated (B,), P) on the CPU.
        `recorder` (optional) watches generate's forward passes; read it with `recorder.finish`. `seeds`:
        each prompt row's sampling stream (trainer.rollout.sampling); None: drawn from torch's global RNG."""
        model = self.model
        device = model_device(model)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        rows_ids = prompt_ids.repeat_interleave(num_samples, dim=0)
        rows_mask = prompt_mask.repeat_interleave(num_samples, dim=0)
        eos, kwargs = generation_kwargs(
            model, self.tokenizer, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature,
            top_p=top_p, seeds=None if greedy else seeds_or_drawn(seeds, prompt_ids.shape[0]),
            samples_per_seed=num_samples,
        )  # fmt: skip
        # Inference mode, not only no-grad: no version counters or autograd bookkeeping on the ~150 small ops
        # of every decode forward (docs/BENCHMARKS.md, engine, second round). Its tensors cannot be saved for
        # backward, so what leaves this block is copied out of it (`to(copy=True)` outside the block gives a
        # normal tensor).
        with torch.inference_mode():
            if num_samples > 1 and prompt_ids.shape[1] > 1:
                # The samples of a prompt share its KV cache: prefill each distinct prompt once (all but its
                # last token, which generate runs itself) and repeat the cache, instead of prefilling it G
                # times.
                kwargs[cache_argument(model)] = shared_prompt_cache(
                    model, prompt_ids, prompt_mask, num_samples
                )
            with recorder.recording(model) if recorder is not None else contextlib.nullcontext():
                try:
                    out = model.generate(input_ids=rows_ids, attention_mask=rows_mask, **kwargs)
                except RuntimeError as err:
                    refused = unsampleable(err, temperature, top_p)
                    if refused is None:
                        raise
                    raise refused from err
        out = out.to("cpu", copy=True)
        rows_mask = rows_mask.cpu()
        p_len = rows_ids.shape[1]
        responses = out[:, p_len:]
        response_mask, truncated = response_mask_from_eos(responses, eos)
        attention_mask = torch.cat([rows_mask, response_mask.long()], dim=1)
        return out, attention_mask, response_mask, truncated, p_len
