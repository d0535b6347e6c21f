"""The tool-use environment inside the engine (trainer/specs/tool_use_tiny.yaml after its SFT warm-start):
the rollout lays out model turns and tool results token-in, token-out (tool/token_mismatches is 0), tool
tokens are context with response_mask 0, they receive exactly zero gradient from every loss, and entropy,
the quadrant analysis and STARE's selection read model tokens only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from contract.metrics import CATALOGUE
from contract.spec import load_spec
from trainer.algos import compute_policy_loss, make_loss_params, quadrant_analysis, token_stats_from_logits
from trainer.algos.surrogate import PolicyLossInputs
from trainer.engine import Engine
from trainer.envs.tool_use import COUNT_FIELDS, transcript
from trainer.policy.scoring import response_logits
from trainer.rollout.batch import Rollout
from trainer.sft import sft_transcripts

SPEC = Path(__file__).resolve().parents[2] / "trainer" / "specs" / "tool_use_tiny.yaml"
TOOL_KEYS = [m.key for m in CATALOGUE if m.key.startswith("tool/")]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    spec = load_spec(SPEC)
    engine = Engine(spec, tmp_path_factory.mktemp("tool-use"), progress=False)
    engine.setup()
    engine._sft()
    return engine


@pytest.fixture(scope="module")
def batch(engine: Engine) -> Rollout:
    torch.manual_seed(3)
    batch, _ = engine.collect()
    return batch


def test_rollout_is_token_in_token_out_with_tool_results_masked(engine: Engine, batch: Rollout) -> None:
    tok = engine.tokenizer
    counts = batch.tool_counts
    assert counts is not None and counts.shape == (batch.size, len(COUNT_FIELDS))
    column = {name: counts[:, i] for i, name in enumerate(COUNT_FIELDS)}
    assert float(column["token_mismatches"].sum()) == 0.0
    assert float(column["calls"].sum()) > 0  # the warm-started model calls the calculator
    assert batch.sampler_logprob is None  # HF generate samples from the trainer: no second record
    assert torch.equal(column["turns"], column["calls"] + 1)  # one answer turn after the calls
    resp = batch.input_ids[:, batch.prompt_length :]
    attn = batch.attention_mask[:, batch.prompt_length :]
    tool_positions = (attn == 1) & (batch.response_mask == 0)
    assert int(tool_positions.sum()) == int(column["tool_tokens"].sum()) > 0
    assert torch.equal(batch.response_mask.sum(-1), column["model_tokens"])
    assert bool((batch.response_mask <= attn.float()).all())  # no trained token outside the context
    for row in range(batch.size):
        if column["calls"][row] == 0:
            continue
        ids = resp[row][attn[row].bool()].tolist()
        mask = batch.response_mask[row][attn[row].bool()].tolist()
        call_end = ids.index(tok.eos_token_id)  # the call turn ends with EOS, inside the response
        assert mask[: call_end + 1] == [1.0] * (call_end + 1)
        call = tok.decode(ids[:call_end])
        result = tok.decode([t for t, m in zip(ids, mask) if m == 0])
        left, star, right = call.removeprefix("(1)").partition("*")
        if call.startswith("(1)") and star and left.isdigit() and right.isdigit():
            assert result == f"{int(left) * int(right)}\n"  # the calculator's product, as its own tokens
    # Re-tokenising the joined text would not give these ids back: the EOS inside the response is a turn
    # boundary that text loses (skip_special_tokens), which is why rollouts keep the ids per turn.
    joined = tok.decode(resp[0][attn[0].bool()], skip_special_tokens=True)
    assert tok(joined, add_special_tokens=False)["input_ids"] != resp[0][attn[0].bool()].tolist()


@pytest.mark.parametrize("loss_name", ["stare", "grpo_ds", "rsi_s"])
def test_tool_tokens_receive_exactly_zero_gradient(engine: Engine, batch: Rollout, loss_name: str) -> None:
    model = engine.model
    attn = batch.attention_mask[:, batch.prompt_length :]
    tool_positions = (attn == 1) & (batch.response_mask == 0)
    logits = response_logits(
        model, batch.input_ids, batch.attention_mask, batch.position_ids(), batch.prompt_length
    )
    leaf = logits.detach().clone().requires_grad_(True)
    targets = batch.input_ids[:, batch.prompt_length :]
    stats = token_stats_from_logits(leaf, targets, temperature=1.0)
    advantages = torch.linspace(-1.0, 1.0, batch.size)
    inputs = PolicyLossInputs(
        logprob=stats.logprob,
        old_logprob=stats.logprob.detach() - 0.05,  # off-policy: ratios other than 1
        advantages=advantages,
        response_mask=batch.response_mask,
        entropy=stats.entropy.detach() if stats.entropy is not None else None,
    )
    loss, _ = compute_policy_loss(loss_name, inputs, make_loss_params(loss_name))
    loss.backward()
    assert leaf.grad is not None
    assert float(leaf.grad[tool_positions].abs().max()) == 0.0  # exactly zero, every vocabulary entry
    assert float(leaf.grad[batch.response_mask.bool()].abs().sum()) > 0.0
    # The weights' gradient does not move with what the tools wrote's log-probs: perturbing the targets at
    # tool positions leaves the loss bit-identical.
    perturbed = targets.clone()
    perturbed[tool_positions] = (perturbed[tool_positions] + 1) % logits.shape[-1]
    stats2 = token_stats_from_logits(logits.detach(), perturbed, temperature=1.0)
    inputs2 = PolicyLossInputs(
        logprob=stats2.logprob,
        old_logprob=stats.logprob.detach() - 0.05,
        advantages=advantages,
        response_mask=batch.response_mask,
        entropy=stats2.entropy,
    )
    loss2, _ = compute_policy_loss(loss_name, inputs2, make_loss_params(loss_name))
    assert float(loss2) == float(loss.detach())


def test_entropy_and_quadrants_count_model_tokens_only(engine: Engine, batch: Rollout) -> None:
    attn = batch.attention_mask[:, batch.prompt_length :]
    tool_positions = (attn == 1) & (batch.response_mask == 0)
    mask = batch.response_mask
    torch.manual_seed(0)
    logprob = -torch.rand(mask.shape)
    entropy = torch.rand(mask.shape)
    correction = torch.randn(mask.shape)
    advantages = torch.linspace(-1.0, 1.0, batch.size)
    tokens = float(mask.sum())
    base = quadrant_analysis(advantages, logprob, entropy, correction, mask, global_token_count=tokens)
    h_bar = engine._mean_entropy(1, entropy, mask, tokens)
    # Very different (finite, as the kernel's always are) numbers at the tool positions change nothing.
    logprob[tool_positions] = -40.0
    entropy[tool_positions] = 40.0
    correction[tool_positions] = -40.0
    again = quadrant_analysis(advantages, logprob, entropy, correction, mask, global_token_count=tokens)
    assert {k: float(v) for k, v in again.items()} == {k: float(v) for k, v in base.items()}
    assert engine._mean_entropy(1, entropy, mask, tokens) == h_bar


def test_a_train_step_emits_every_tool_metric(engine: Engine) -> None:
    metrics = engine.train_step()
    assert set(TOOL_KEYS) <= set(metrics), set(TOOL_KEYS) - set(metrics)
    assert metrics["tool/token_mismatches"] == 0.0
    assert metrics["tool/calls_per_response"] > 0.0
    assert 0.0 < metrics["tool/output_token_fraction"] < 1.0
    # Every turn but the last is a tool call (the last turn answers, even when it looks like a call), so
    # an episode has exactly one turn more than it has calls.
    assert metrics["tool/turns_per_episode"] == pytest.approx(metrics["tool/calls_per_response"] + 1.0)
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))
    assert not [key for key in metrics if key.startswith(("rollout/mismatch", "rollout/tis"))]


def test_sft_transcripts_call_the_calculator_and_label_model_turns_only(engine: Engine) -> None:
    env = engine.spec.environment
    assert env is not None
    example = engine.prompts.examples[0]
    pieces = transcript(example, env)
    assert [is_model for _, is_model in pieces] == [True, False, True]
    assert pieces[0][0] == "(1)" + example.prompt[:-1]
    assert pieces[1][0] == example.answer + "\n" and pieces[2][0] == example.answer
    prompt = engine.tokenizer([example.prompt])["input_ids"]
    seqs, targets = sft_transcripts(engine.tokenizer, engine.spec, [example], prompt)
    result_ids = engine.tokenizer(pieces[1][0], add_special_tokens=False)["input_ids"]
    start = len(prompt[0]) + len(pieces[0][0]) + 1
    assert seqs[0][start : start + len(result_ids)] == result_ids
    assert targets[0][start : start + len(result_ids)] == [False] * len(result_ids)
    assert targets[0].count(True) == len(pieces[0][0]) + 1 + len(pieces[2][0]) + 1


def test_evaluation_scores_the_episodes_answers(engine: Engine) -> None:
    metrics = engine.evaluate()
    assert metrics["eval/num_prompts"] == engine.spec.task.eval_size
    assert metrics["eval/avg@k"] == metrics["eval/pass@k"]  # greedy, k = 1
    assert metrics["eval/avg@k"] > 0.3  # products the model cannot do in its head: the calculator's work
    # Model tokens only: a call "(1)ab*cd<eos>" and an answer "abcd<eos>" are at most 9 + 6 tokens.
    assert 6.0 <= metrics["eval/response_length"] <= 2 * engine.spec.sampling.max_new_tokens
