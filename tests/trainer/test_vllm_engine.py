"""vLLM as the rollout engine (trainer.rollout.vllm_engine), on the tiny model after the tool-use spec's SFT
warm-start: greedy rollouts equal HF generate's token for token; groups, temperature and top-p, the
token budget and EOS; after an optimiser step and its weight push the engine's log-probs equal the
trainer's (and differ without the push); tool-use episodes are token-in, token-out and carry the
sampler's log-probs of their sampled tokens only (the mismatch metrics at every training step, the
truncated IS correction against a turn-by-turn oracle); dynamic sampling and evaluation run on it. One engine (one vLLM start) serves the whole module.

These tests need vLLM in the interpreter (`make install` builds .venv-vllm; `make test` runs them there).
"""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from contract.spec import load_spec
from tests.conftest import REAL_COMPONENT_MISSING
from trainer.algos import compute_policy_loss, make_loss_params
from trainer.algos.surrogate import PolicyLossInputs
from trainer.data import collect
from trainer.engine import Engine
from trainer.evaluation import evaluate
from trainer.policy.scoring import response_stats
from trainer.rollout.batch import Episodes, Rollout, episodes_rollout, run_episodes
from trainer.rollout.generation import HFGenerate
from trainer.rollout.mismatch import corrected_advantages, step_mismatch_metrics, truncated_is_weights

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason=f"{REAL_COMPONENT_MISSING} vllm (make install builds .venv-vllm; make test runs this there)",
    ),
]

SPEC = Path(__file__).resolve().parents[2] / "trainer" / "specs" / "tool_use_tiny.yaml"
PROMPTS = ["47*86=", "12*34=", "5*6=", "99*10="]
# |log π_vLLM − log π_trainer| per token, float32 on the CPU. Both compute the same function of the same
# weights with different kernels (vLLM's CPU attention and fused ops against torch's eager ops), so they
# differ by float32 rounding: relative error ~1e-7 per operation, amplified along a 2-layer network of width
# 128 to ~1e-5 in the logits; a log-prob moves by at most twice its logits' largest change. 1e-3 nats leaves
# two orders of magnitude for a CPU's kernel choices; one optimiser step at lr 1e-2 moves log-probs by
# ~0.1 nats, far above it, so a skipped push cannot pass.
LOGPROB_TOLERANCE = 1e-3
TIS_CAP = 1.5
MISMATCH_KEYS = ("rollout/mismatch_abs_mean", "rollout/mismatch_abs_max", "rollout/mismatch_kl")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    spec = load_spec(SPEC).model_copy(update={"rollout": {"engine": "vllm", "tis_cap": TIS_CAP}})
    spec = type(spec).model_validate(spec.model_dump())
    engine = Engine(spec, tmp_path_factory.mktemp("vllm"), progress=False)
    engine.setup()
    engine._sft()
    return engine


def _encode(engine: Engine, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = engine.tokenizer(prompts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def _trainer_logprob(engine: Engine, out: object) -> torch.Tensor:
    """The trainer's log-probs (temperature 1) of a Generation's response tokens, 0 past each response."""
    g = out  # trainer.rollout.generation.Generation
    batch = Rollout(
        input_ids=g.input_ids, attention_mask=g.attention_mask, response_mask=g.response_mask,  # type: ignore[attr-defined]
        prompt_length=g.prompt_length, rewards=torch.zeros(len(g.input_ids)),  # type: ignore[attr-defined]
        correct=torch.zeros(len(g.input_ids)), group_ids=torch.zeros(len(g.input_ids), dtype=torch.long),  # type: ignore[attr-defined]
        truncated=g.truncated,  # type: ignore[attr-defined]
    )  # fmt: skip
    model = engine.policy
    model.eval()
    with torch.no_grad():
        logprob, _, _ = response_stats(model, batch, torch.arange(batch.size), 1.0, with_entropy=False)
    model.train()
    return logprob * batch.response_mask


def _max_mismatch(engine: Engine) -> float:
    ids, mask = _encode(engine, PROMPTS)
    torch.manual_seed(11)
    out = engine.rollout_engine.generate(
        ids, mask, num_samples=4, temperature=1.0, top_p=1.0, max_new_tokens=12
    )
    assert out.sampler_logprob is not None
    delta = (out.sampler_logprob - _trainer_logprob(engine, out)) * out.response_mask
    return float(delta.abs().max())


def test_engine_says_its_record_is_not_pi_old(engine: Engine) -> None:
    assert engine.rollout_engine.gives_pi_old is False
    assert engine.record_sample_stats is False
    assert HFGenerate.gives_pi_old is True


def test_greedy_rollouts_equal_hf_token_for_token(engine: Engine) -> None:
    ids, mask = _encode(engine, [*PROMPTS, "3*4=", "(1)"])
    kwargs = dict(num_samples=1, temperature=1.0, top_p=1.0, max_new_tokens=16, greedy=True)
    fast = engine.rollout_engine.generate(ids, mask, **kwargs)  # type: ignore[arg-type]
    engine.policy.eval()
    reference = HFGenerate(engine.policy, engine.tokenizer).generate(ids, mask, **kwargs)  # type: ignore[arg-type]
    engine.policy.train()
    width = min(fast.input_ids.shape[1], reference.input_ids.shape[1])
    assert fast.prompt_length == reference.prompt_length
    assert torch.equal(fast.response_mask.sum(-1), reference.response_mask.sum(-1))
    assert torch.equal(fast.truncated, reference.truncated)
    masked = torch.cat([mask, fast.response_mask.long()], dim=1)[:, :width].bool()
    assert torch.equal(fast.input_ids[:, :width][masked], reference.input_ids[:, :width][masked])
    assert fast.response_mask.sum() > len(PROMPTS)  # the warm-started model answers, it does not stop at once


def test_groups_budget_eos_and_top_p(engine: Engine) -> None:
    ids, mask = _encode(engine, PROMPTS)
    torch.manual_seed(0)
    out = engine.rollout_engine.generate(
        ids, mask, num_samples=8, temperature=1.5, top_p=1.0, max_new_tokens=5
    )
    assert out.input_ids.shape[0] == len(PROMPTS) * 8 and out.response_mask.shape[1] <= 5
    eos = engine.tokenizer.eos_token_id
    responses = out.input_ids[:, out.prompt_length :]
    for row, n, cut in zip(responses, out.response_mask.sum(-1).long(), out.truncated):
        assert (row[: n - 1] != eos).all()  # stops at the first EOS, and only there
        assert bool(cut) == (row[n - 1] != eos)
    # Rows are example-major: each group's prompt is repeated G times.
    assert torch.equal(out.input_ids[:8, : out.prompt_length], ids[:1].repeat(8, 1))
    # At temperature 1.5 a group's samples differ; with top-p tiny only the top token survives: greedy.
    assert len({tuple(r.tolist()) for r in responses[:8]}) > 1
    nucleus = engine.rollout_engine.generate(
        ids, mask, num_samples=2, temperature=1.5, top_p=1e-6, max_new_tokens=8
    )
    greedy = engine.rollout_engine.generate(
        ids, mask, num_samples=1, temperature=1.0, top_p=1.0, max_new_tokens=8, greedy=True
    )
    assert torch.equal(nucleus.input_ids[::2], greedy.input_ids)
    # The sampler's log-probs are of its processed distribution: with top-p 1e-6 that is one token, log 1 = 0.
    assert float(nucleus.sampler_logprob.abs().max()) < 1e-5  # type: ignore[union-attr]


def _responses(out: object, rows: range) -> list[list[int]]:
    g = out  # trainer.rollout.generation.Generation
    lengths = g.response_mask.sum(-1).long()  # type: ignore[attr-defined]
    start = g.prompt_length  # type: ignore[attr-defined]
    return [g.input_ids[r, start : start + int(lengths[r])].tolist() for r in rows]  # type: ignore[attr-defined]


def test_a_prompts_samples_come_from_its_seed_not_its_batch(engine: Engine) -> None:
    # Per-request seeds (trainer.rollout.sampling): one prompt's samples alone, first in a batch and last in
    # another (other padding, other neighbours) are the same token ids; another seed gives other ones.
    g = 4
    kwargs = dict(num_samples=g, temperature=1.5, top_p=0.95, max_new_tokens=12)
    ids, mask = _encode(engine, ["12*34="])
    alone = engine.rollout_engine.generate(ids, mask, seeds=[77], **kwargs)  # type: ignore[arg-type]
    ids, mask = _encode(engine, ["12*34=", "99*10="])
    first = engine.rollout_engine.generate(ids, mask, seeds=[77, 8], **kwargs)  # type: ignore[arg-type]
    ids, mask = _encode(engine, ["147*86=", "5*6=", "12*34="])
    assert mask[2].sum() < mask.shape[1]  # left-padded in this batch
    last = engine.rollout_engine.generate(ids, mask, seeds=[5, 6, 77], **kwargs)  # type: ignore[arg-type]
    expected = _responses(alone, range(g))
    assert _responses(first, range(g)) == expected
    assert _responses(last, range(2 * g, 3 * g)) == expected
    assert len({tuple(r) for r in expected}) > 1  # a request's n samples draw apart (seed + i each)
    ids, mask = _encode(engine, ["12*34="])
    other = engine.rollout_engine.generate(ids, mask, seeds=[78], **kwargs)  # type: ignore[arg-type]
    assert _responses(other, range(g)) != expected


def test_logprobs_match_the_trainer_after_each_step_and_a_skipped_push_shows(engine: Engine) -> None:
    # Its probe updates are undone at the end: the module's later tests train the SFT'd policy itself.
    model = engine.policy
    saved = {name: t.detach().clone() for name, t in model.state_dict().items()}
    try:
        _probe_updates(engine)
    finally:
        model.load_state_dict(saved)
        engine.rollout_engine.load_weights(engine.strategy.full_state(engine.model))
    assert _max_mismatch(engine) < LOGPROB_TOLERANCE  # the restored weights reached vLLM too


def _probe_updates(engine: Engine) -> None:
    assert _max_mismatch(engine) < LOGPROB_TOLERANCE
    params = [p for p in engine.policy.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    ids, mask = _encode(engine, PROMPTS)
    for step in range(2):
        # An optimiser step on the policy that always moves it: raise the log-prob of one fixed token at every
        # response position of a sampled batch. (Raising the sampled tokens' own log-probs moved it by chance:
        # a batch of tokens the policy is already sure of has next to no gradient, 0.008 nats in one CI run.)
        torch.manual_seed(step)
        out = engine.rollout_engine.generate(
            ids, mask, num_samples=2, temperature=1.0, top_p=1.0, max_new_tokens=8
        )
        target = engine.tokenizer.convert_tokens_to_ids("9")
        input_ids = out.input_ids.clone()
        response = input_ids[:, out.prompt_length :]
        response[out.response_mask.bool()] = target
        batch = Rollout(
            input_ids=input_ids, attention_mask=out.attention_mask, response_mask=out.response_mask,
            prompt_length=out.prompt_length, rewards=torch.zeros(len(out.input_ids)),
            correct=torch.zeros(len(out.input_ids)), group_ids=torch.zeros(len(out.input_ids), dtype=torch.long),
            truncated=out.truncated,
        )  # fmt: skip
        logprob, _, _ = response_stats(engine.model, batch, torch.arange(batch.size), 1.0, with_entropy=False)
        (-(logprob * batch.response_mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stale = _max_mismatch(engine)
        assert stale > 20 * LOGPROB_TOLERANCE, f"step {step}: the update did not move the policy ({stale})"
        engine.rollout_engine.load_weights(engine.strategy.full_state(engine.model))
        fresh = _max_mismatch(engine)
        assert fresh < LOGPROB_TOLERANCE, f"step {step}: {fresh} nats after the push (stale: {stale})"


def test_train_steps_keep_tool_tokens_exact_and_report_the_mismatch(engine: Engine) -> None:
    for step in range(3):
        metrics = engine.train_step()
        assert metrics["tool/token_mismatches"] == 0.0, step
        assert metrics["tool/calls_per_response"] > 0.0, step  # episodes with tool results in them
        # The episodes carry vLLM's log-probs of their sampled tokens: sampler and trainer agree after
        # every push, and the correction's weights are 1 on them.
        assert set(MISMATCH_KEYS) <= set(metrics), (step, sorted(metrics))
        assert 0.0 <= metrics["rollout/mismatch_abs_mean"] <= metrics["rollout/mismatch_abs_max"], step
        assert metrics["rollout/mismatch_abs_max"] < LOGPROB_TOLERANCE, (step, metrics)
        assert 0.0 <= metrics["rollout/mismatch_kl"] < LOGPROB_TOLERANCE**2, (step, metrics)
        assert metrics["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=LOGPROB_TOLERANCE), step
        assert metrics["rollout/tis_capped_fraction"] == 0.0, step


def _turn_logprobs(model: torch.nn.Module, context: list[int], turn: list[int]) -> list[float]:
    """The model's log-probs (temperature 1) of one turn's ids after its context, scored on their own
    (unpadded, one row): the oracle the laid-out batch is checked against."""
    ids = torch.tensor([context + turn])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(context) - 1 : len(ids[0]) - 1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(turn)[:, None]).squeeze(-1).tolist()


def _tool_episodes(engine: Engine) -> tuple[Episodes, Rollout]:
    model = engine.policy
    examples = engine.prompts.examples[:4]
    model.eval()
    torch.manual_seed(5)
    episodes = run_episodes(
        model, engine.tokenizer, examples, engine.spec, num_samples=4, temperature=1.0, top_p=1.0,
        engine=engine.rollout_engine,
    )  # fmt: skip
    model.train()
    return episodes, episodes_rollout(episodes, examples, 0, engine.spec, engine.tokenizer.pad_token_id)


def test_the_correction_on_tool_episodes_weights_the_sampled_tokens_only(engine: Engine) -> None:
    episodes, batch = _tool_episodes(engine)
    assert batch.sampler_logprob is not None and episodes.sampler_logprobs is not None
    sampled = batch.response_mask.bool()
    tool = batch.attention_mask[:, batch.prompt_length :].bool() & ~sampled
    assert int(tool.sum()) > 0  # tool results inside the episodes
    assert float(batch.sampler_logprob[~sampled].abs().max()) == 0.0  # no sampler value off the samples
    # A trainer that differs from the sampler: the policy with perturbed weights (the engine keeps its own).
    trainer = copy.deepcopy(engine.policy).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in trainer.parameters():
            param.add_(0.03 * torch.randn(param.shape, generator=generator))
    with torch.no_grad():
        trainer_lp, _, _ = response_stats(trainer, batch, torch.arange(batch.size), 1.0, with_entropy=False)
    # The oracle, turn by turn in sampling order: w = min(π_trainer/π_sampler, C) from each turn's own
    # context and the sampler's values for that turn as vLLM returned them. C near 1: the warm-started
    # policy is confident (π_sampler near 1 on most tokens), so few ratios reach a larger cap.
    advantages, cap = torch.linspace(-1.0, 1.0, batch.size), 1.05
    expected_w, expected_adv = [], []
    for row, (seen, sampler_turns) in enumerate(zip(episodes.seen, episodes.sampler_logprobs)):
        for (context, turn), sampler in zip(seen, sampler_turns):
            for lt, ls in zip(_turn_logprobs(trainer, context, turn), sampler):
                expected_w.append(min(math.exp(lt - ls), cap))
                expected_adv.append(float(advantages[row]) * expected_w[-1])
    assert len(expected_w) == int(sampled.sum())
    capped = sum(w == cap for w in expected_w)
    assert 0 < capped < len(expected_w)  # the perturbation puts tokens on both sides of the cap
    metrics = step_mismatch_metrics(batch, trainer_lp, _identity_reduce, cap)
    assert metrics["rollout/tis_weight_mean"] == pytest.approx(sum(expected_w) / len(expected_w), abs=1e-4)
    assert abs(metrics["rollout/tis_capped_fraction"] * len(expected_w) - capped) <= 1  # a token at the cap
    corrected = corrected_advantages(advantages, batch.sampler_logprob, trainer_lp, cap)
    # The mask's positions, row-major, are the tokens in sampling order.
    assert torch.allclose(corrected[sampled], torch.tensor(expected_adv), atol=1e-4)
    # Had the tool tokens been counted, the weights' mean would move ten times that tolerance or more ...
    with_tools = truncated_is_weights(trainer_lp, batch.sampler_logprob, cap)[sampled | tool]
    assert abs(float(with_tools.mean()) - metrics["rollout/tis_weight_mean"]) > 1e-3
    # ... and the loss reads no advantage at a tool token: any value there leaves it unchanged.
    losses = []
    for at_tools in (0.0, 1e3):
        inputs = PolicyLossInputs(
            logprob=trainer_lp, old_logprob=trainer_lp, advantages=corrected.masked_fill(tool, at_tools),
            response_mask=batch.response_mask, global_token_count=float(sampled.sum()),
        )  # fmt: skip
        losses.append(compute_policy_loss("grpo", inputs, make_loss_params("grpo"))[0].item())
    assert losses[0] == losses[1]


def _identity_reduce(values: list[float], reduction: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_dynamic_sampling_and_evaluation_run_on_the_engine(engine: Engine) -> None:
    spec = engine.spec
    optim = spec.optim.model_copy(update={"dynamic_sampling": {"enabled": True, "max_gen_batches": 2}})
    dynamic = spec.model_copy(update={"optim": optim})
    dynamic = type(spec).model_validate(dynamic.model_dump())
    engine.policy.eval()
    batch, batches = collect(
        engine.policy, engine.tokenizer, engine.prompts, dynamic, rank=0, world=1,
        sample_stats=False, reduce=engine.runtime.reduce, engine=engine.rollout_engine, step=1,
    )  # fmt: skip
    engine.policy.train()
    assert 1 <= batches <= 2
    assert batch.tool_counts is None or float(batch.tool_counts[:, -1].sum()) == 0.0
    examples = engine.eval_examples[:8]
    on_vllm = evaluate(
        engine.policy,
        engine.tokenizer,
        spec,
        examples,
        engine.runtime.reduce,
        engine=engine.rollout_engine,
    )
    on_hf = evaluate(
        engine.policy,
        engine.tokenizer,
        spec,
        examples,
        engine.runtime.reduce,
        engine=HFGenerate(engine.policy, engine.tokenizer),
    )
    assert on_vllm["eval/num_prompts"] == 8.0
    # Greedy tool-use episodes: the same tokens on both engines, so the same scores.
    assert on_vllm["eval/avg@k"] == on_hf["eval/avg@k"]
    assert on_vllm["eval/response_length"] == on_hf["eval/response_length"]
