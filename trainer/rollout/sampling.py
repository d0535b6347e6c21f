"""Where samples come from: one random stream per prompt, named by what the prompt is in the job, not by
which process draws it.

A stream's seed is a stable hash (SHA-256, not Python's `hash()`, which is salted per process) of
(job seed, purpose, step, dynamic-sampling round, the prompt's index in the step's batch): training
rollouts are ("train", step, round, index), evaluation ("eval", step, 0, index in the evaluation set). A
prompt's samples are then the same whichever process draws them and whatever other prompts share its batch,
so 1 process and N processes draw the same samples, and a run resumed at another process count continues
the run it would have been.

The engines read the seeds (`RolloutEngine.generate(seeds=...)`, one per prompt row):
- HF generate: `SeededSampler`, a logits processor that draws each row's next token itself, from its
  prompt's own `torch.Generator`, with the maths transformers' sampling uses (logits / temperature, the
  top-p nucleus, a categorical draw); generate then runs in its greedy mode and takes the drawn token;
- vLLM: each prompt's request carries its seed (`SamplingParams(seed=...)`); vLLM gives a request its own
  generator, and the i-th of its n samples seed + i.

Without seeds (benches, tests that seed the global RNG), each prompt's seed is drawn from torch's global
RNG: reproducible under `torch.manual_seed`, the same sampling path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import LogitsProcessor

SEED_BITS = 62  # vLLM seeds the i-th of a request's n samples with seed + i: room to add to it in an int64
UNSAMPLEABLE_MESSAGE = "probability tensor contains either `inf`, `nan` or element < 0"  # torch's wording


def stream_seed(seed: int, *key: str | int) -> int:
    """The 62-bit seed of the stream named by (seed, *key); the same in every process, run and Python."""
    name = "/".join(str(part) for part in (seed, *key))
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> (64 - SEED_BITS)


@dataclass(frozen=True)
class SampleStreams:
    """The streams of one batch of prompts: job seed, purpose ("train" or "eval"), step and dynamic-sampling
    round; `prompt_seeds` names one stream per prompt by its index in the step's (or evaluation) batch."""

    seed: int
    purpose: str
    step: int
    round: int = 0

    def prompt_seeds(self, indices: Iterable[int]) -> list[int]:
        return [stream_seed(self.seed, "sample", self.purpose, self.step, self.round, i) for i in indices]


def turn_seeds(prompt_seeds: Sequence[int], num_samples: int, turn: int) -> list[int]:
    """Multi-turn episodes (num_samples per prompt, rows prompt-major): the seed of each row's `turn`-th
    model turn, from its prompt's stream, its sample index and the turn."""
    return [stream_seed(s, "episode", j, "turn", turn) for s in prompt_seeds for j in range(num_samples)]


def seeds_or_drawn(seeds: Sequence[int] | None, n: int) -> list[int]:
    """`seeds` (one per prompt row, checked), or n seeds drawn from torch's global RNG."""
    if seeds is None:
        return [int(s) for s in torch.randint(0, 2**SEED_BITS, (n,))]
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} sampling seeds for {n} prompts")
    return [int(s) for s in seeds]


def nucleus(scores: Tensor, top_p: float) -> Tensor:
    """`scores` (B, V) with every token outside each row's top-p nucleus set to -inf: the nucleus is the
    smallest set of most probable tokens whose probability reaches top_p (at least the top token). Ties
    at the border are kept or cut as a sort puts them, as transformers' top-p warper does."""
    if top_p >= 1.0:
        return scores
    ascending, order = torch.sort(scores, dim=-1)
    mass_below = ascending.softmax(dim=-1).cumsum(dim=-1)  # probability of this token and all less likely
    cut = mass_below <= 1.0 - top_p
    cut[:, -1] = False  # the most probable token stays
    return scores.masked_fill(cut.scatter(1, order, cut), float("-inf"))


class SeededSampler(LogitsProcessor):
    """Draws every row's next token from its prompt's own stream, for generate in greedy mode.

    Rows are prompt-major, `samples_per_seed` rows per seed. At each decoding step the processor takes the
    scores generate's own processors left (the model's generation config), divides them by the temperature,
    keeps the top-p nucleus, and draws one token per row by inverting the cumulative distribution at a
    uniform from the row's prompt's generator (one uniform per row and step, so a stream advances the same
    whatever shares the batch). It returns scores that are 0 at the drawn token and -inf elsewhere, so
    generate's argmax takes it. Probabilities torch could not sample from (inf, NaN) raise the RuntimeError
    torch.multinomial raises (trainer.rollout.generation.unsampleable turns it into a SamplingError).
    """

    def __init__(self, seeds: Sequence[int], samples_per_seed: int, temperature: float, top_p: float) -> None:
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.samples_per_seed = samples_per_seed
        self.temperature, self.top_p = temperature, top_p

    def uniforms(self) -> Tensor:
        """(rows,) float64: the next uniform of every row, each prompt's rows from its generator in order."""
        g = self.samples_per_seed
        return torch.cat([torch.rand(g, generator=gen, dtype=torch.float64) for gen in self.generators])

    def draw(self, scores: Tensor) -> Tensor:
        """(B,) the token drawn for each row from the scores (B, V)."""
        if scores.shape[0] != len(self.generators) * self.samples_per_seed:
            raise ValueError(
                f"{scores.shape[0]} rows for {len(self.generators)} seeds × {self.samples_per_seed}"
            )
        scaled = scores if self.temperature == 1.0 else scores / self.temperature
        probs = nucleus(scaled, self.top_p).softmax(dim=-1)
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise RuntimeError(UNSAMPLEABLE_MESSAGE)
        cdf = probs.to(torch.float64).cumsum(dim=-1)
        u = self.uniforms().to(cdf.device)
        tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        # u · total can round up to the total itself: then the last token with any probability.
        vocab = probs.shape[-1]
        last_possible = vocab - 1 - (probs > 0).flip(-1).long().argmax(dim=-1)
        return torch.minimum(tokens, last_possible)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        tokens = self.draw(scores)
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens.unsqueeze(1), 0.0)
