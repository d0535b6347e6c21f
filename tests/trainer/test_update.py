"""π_old's optimisations give its documented path's numbers (docs/ALGORITHMS.md §4.14), on fixed inputs:
the one-pass path bit for bit; the sampling record up to float rounding (generation runs other matmul
shapes, with a KV cache). And the update's micro-batch plan: under sharding every micro-batch makes the
same forward calls, whatever its rows, with the numbers of the path the rows would have chosen."""

from __future__ import annotations

import pytest
import torch

from contract.spec import TrainSpec
from trainer.data import load_examples
from trainer.models import load_model_and_tokenizer
from trainer.policy.scoring import prompts_shareable, response_logits, response_stats
from trainer.policy.update import measure_old_policy, micro_batch_plan, no_grad_pass, one_pass
from trainer.rollout.batch import rollout
from trainer.rollout.generation import HFGenerate


def _spec(**optim: object) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "seed": 2,
            "model": {"name": "tiny-arith"},
            "task": {"source": "arithmetic", "train_size": 8, "eval_size": 0},
            "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
            "algorithm": {"name": "stare"},
            "sampling": {"group_size": 3, "max_new_tokens": 5},
            "optim": {"steps": 1, "prompts_per_step": 3, "micro_batch_size": 64, **optim},
        }
    )


def _batch(spec: TrainSpec, *, sample_stats: bool):  # type: ignore[no-untyped-def]
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=0)
    prompts, _ = load_examples(spec)
    examples, first = prompts.take(3)
    torch.manual_seed(4)
    model.eval()
    batch = rollout(
        model,
        tokenizer,
        examples,
        first,
        spec,
        sample_stats=sample_stats,
        engine=HFGenerate(model, tokenizer),
    )
    model.train()
    return model, batch


def test_the_one_pass_path_is_the_no_grad_pass_bit_for_bit() -> None:
    spec = _spec()
    model, batch = _batch(spec, sample_stats=False)
    reference = no_grad_pass(model, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
    fast = one_pass(model, batch, None, spec.sampling.temperature, entropy_grad=False)
    for name in ("logprob", "entropy", "correction"):
        assert torch.equal(getattr(fast, name), getattr(reference, name)), name
    assert fast.first_pass is not None and fast.first_pass[0].requires_grad  # the update's graph
    chosen = measure_old_policy(
        model, batch, None, spec=spec, n_micro=1, deterministic=True, entropy_grad=False
    )
    assert chosen.first_pass is not None  # the engine takes it where it applies


def test_the_sampling_record_is_the_no_grad_pass_up_to_rounding() -> None:
    spec = _spec(micro_batch_size=4)
    model, batch = _batch(spec, sample_stats=True)
    reference = no_grad_pass(model, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
    chosen = measure_old_policy(
        model, batch, None, spec=spec, n_micro=3, deterministic=True, entropy_grad=False
    )
    assert chosen.ratio_logprob is None and chosen.logprob is batch.sample_logprob  # read, no pass
    mask = batch.response_mask.bool()
    for name in ("logprob", "entropy", "correction"):
        got, want = getattr(chosen, name)[mask], getattr(reference, name)[mask]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)


def test_off_policy_reads_the_documented_pass() -> None:
    spec = _spec(ppo_epochs=2)
    model, batch = _batch(spec, sample_stats=True)
    chosen = measure_old_policy(
        model, batch, None, spec=spec, n_micro=1, deterministic=True, entropy_grad=False
    )
    reference = no_grad_pass(model, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
    assert chosen.ratio_logprob is not None and torch.equal(chosen.ratio_logprob, reference.logprob)


def _max_with(other: list[int]):  # type: ignore[no-untyped-def]
    """A `reduce` as over two processes, the other one's values being `other` (max only)."""

    def reduce(values: list[int], reduction: str, dtype: torch.dtype) -> torch.Tensor:
        assert reduction == "max"
        return torch.maximum(torch.tensor(values, dtype=dtype), torch.tensor(other, dtype=dtype))

    return reduce


def test_the_micro_batch_plan_is_agreed_and_fixes_the_forward_calls() -> None:
    spec = _spec()
    model, batch = _batch(spec, sample_stats=False)  # 3 prompts × 3 rows
    calls: list[int] = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))

    def forwards(index: list[int], share: bool | None) -> tuple[int, torch.Tensor]:
        calls.clear()
        with torch.no_grad():
            logprob = response_stats(
                model, batch, torch.tensor(index), 1.0, with_entropy=False, share_prompts=share
            )[0]
        return len(calls), logprob

    assert prompts_shareable(batch.prompt_length, batch.input_ids.shape[1])
    assert micro_batch_plan(batch, 2, _max_with([0, 0]), sharing="rows") == (5, None)
    assert micro_batch_plan(batch, 2, _max_with([7, 0]), sharing="agreed") == (7, True)
    assert micro_batch_plan(batch, 2, _max_with([1, 1]), sharing="agreed") == (5, False)  # the other can't
    assert micro_batch_plan(batch, 2, _max_with([0, 0]), sharing="never") == (5, False)  # DDP: full forwards
    # By the rows: a padding micro-batch (one row) or distinct prompts run the full forward (one call),
    # rows of one group the shared-prompt path (two calls). Agreed: the same calls whatever the rows.
    for index in ([0], [0, 3, 6], [0, 1, 2]):
        full, plain = forwards(index, False)
        shared, split = forwards(index, True)
        assert (full, shared) == (1, 2), index
        torch.testing.assert_close(split, plain, rtol=1e-5, atol=1e-6)
    assert [forwards(index, None)[0] for index in ([0], [0, 3, 6], [0, 1, 2])] == [1, 1, 2]
    p_len = batch.prompt_length
    one_token = [t[:, : p_len + 1] for t in (batch.input_ids, batch.attention_mask, batch.position_ids())]
    assert not prompts_shareable(p_len, p_len + 1)  # a one-token response: no tail to run on the cache
    with pytest.raises(ValueError, match="cannot share"):
        response_logits(model, *one_token, p_len, share_prompts=True)


def _h_bar(entropy: torch.Tensor, mask: torch.Tensor) -> float:
    """H̄ as the engine forms it: the float64 sum of the token entropies over the count (Engine._mean_entropy)."""
    return float((entropy.double() * mask).sum()) / float(mask.sum())


def test_the_controlled_entropy_does_not_depend_on_how_the_batch_is_split() -> None:
    """The sensor a law reads (docs/ALGORITHMS.md §12.3): H̄ of π_old over the step batch, computed in fp32 per
    token and summed in float64, is the same to 1e-6 whether the batch is scored one row at a time, in
    micro-batches of 4, in one pass, by the training forward, or read off the sampling record."""
    spec = _spec()
    model, batch = _batch(spec, sample_stats=True)
    mask = batch.response_mask.double()
    t = spec.sampling.temperature
    values = {size: _h_bar(no_grad_pass(model, batch, t, size).entropy, mask) for size in (1, 4, 64)}  # type: ignore[arg-type]
    fast = one_pass(model, batch, None, t, entropy_grad=False)
    assert fast.entropy is not None and batch.sample_entropy is not None
    values["one pass"] = _h_bar(fast.entropy, mask)
    values["sampling record"] = _h_bar(batch.sample_entropy, mask)
    reference = values[64]
    assert reference > 0
    for name, value in values.items():
        assert abs(value - reference) <= 1e-6 * reference, (name, value, reference)
