"""Hyperparameters of the policy losses and the STARE gate, as frozen dataclasses that validate themselves.

Each class and each default is defined here once. This module imports no torch: the job-spec model (and
through it the HTTP service) validates algorithm parameters with these same classes, so a bad value is
rejected with the same message everywhere. Which loss uses which class: contract.algorithms. Formulas and
defaults: docs/ALGORITHMS.md §4–6; the losses themselves live in trainer/algos/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from contract.numbers import finite


class AggMode(StrEnum):
    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


def parse_agg_mode(value: str | AggMode) -> AggMode:
    try:
        return AggMode(value)
    except ValueError:
        raise ValueError(f"agg_mode {value!r} is not one of {', '.join(m.value for m in AggMode)}") from None


def _finite(name: str, value: float) -> None:
    if finite(value) is None:
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _one_of(name: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(repr(v) for v in valid)}, got {value!r}")


STARE_VARIANTS = ("O1", "C2")
STARE_SCOPES = ("micro_batch", "step_batch")
RSI_BOUND_MODES = ("fixed", "quantile")
RSI_DENOMINATORS = ("all", "kept")


@dataclass(frozen=True)
class ClipLossParams:
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip_c: float | None = 10.0
    agg_mode: str = AggMode.TOKEN_MEAN.value
    kl_beta: float = 0.0

    def __post_init__(self) -> None:
        _finite("clip_low", self.clip_low)
        _finite("clip_high", self.clip_high)
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low!r}")
        if self.clip_high < 0.0:
            raise ValueError(f"clip_high must be ≥ 0, got {self.clip_high!r}")
        if self.dual_clip_c is not None:
            _finite("dual_clip_c", self.dual_clip_c)
            if self.dual_clip_c <= 1.0:
                raise ValueError(f"dual_clip_c must be > 1 (or None), got {self.dual_clip_c!r}")
        parse_agg_mode(self.agg_mode)
        _finite("kl_beta", self.kl_beta)
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be ≥ 0, got {self.kl_beta!r}")


@dataclass(frozen=True)
class GrpoParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    agg_mode: str = AggMode.SEQ_MEAN_TOKEN_MEAN.value


@dataclass(frozen=True)
class DrGrpoParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    agg_mode: str = AggMode.SEQ_MEAN_TOKEN_SUM_NORM.value


@dataclass(frozen=True)
class StareParams(ClipLossParams):
    top_ratio: float = 0.1  # P
    reweight_w: float = 1.1  # W
    reweight_m: float = 0.9  # M (C2 only)
    variant: Literal["O1", "C2"] = "O1"
    scope: Literal["micro_batch", "step_batch"] = "micro_batch"

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("top_ratio", self.top_ratio)
        # P = 0 is accepted as "select nothing" (docs/ALGORITHMS.md §7.9: P = 0 gives grpo_ds bit for bit).
        if not 0.0 <= self.top_ratio <= 1.0:
            raise ValueError(f"top_ratio (P) must be in (0, 1] (or 0 to disable), got {self.top_ratio!r}")
        _finite("reweight_w", self.reweight_w)
        if self.reweight_w < 1.0:
            raise ValueError(f"reweight_w (W) must be ≥ 1, got {self.reweight_w!r}")
        _finite("reweight_m", self.reweight_m)
        if not 0.0 < self.reweight_m <= 1.0:
            raise ValueError(f"reweight_m (M) must be in (0, 1], got {self.reweight_m!r}")
        _one_of("variant", self.variant, STARE_VARIANTS)
        _one_of("scope", self.scope, STARE_SCOPES)


@dataclass(frozen=True)
class RsiParams(ClipLossParams):
    bound_mode: Literal["fixed", "quantile"] = "fixed"
    r_lo: float = 0.5  # fixed: RSI bound; quantile: quantile level
    r_hi: float = 2.0
    denominator: Literal["all", "kept"] = "all"
    entropy_eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("r_lo", self.r_lo)
        _finite("r_hi", self.r_hi)
        if self.r_lo > self.r_hi:
            raise ValueError(f"r_lo must be ≤ r_hi, got r_lo={self.r_lo!r} > r_hi={self.r_hi!r}")
        if self.r_lo < 0:
            raise ValueError(f"r_lo must be ≥ 0, got {self.r_lo!r}")
        _one_of("bound_mode", self.bound_mode, RSI_BOUND_MODES)
        if self.bound_mode == "quantile" and self.r_hi > 1.0:
            raise ValueError(f"r_hi must be a quantile level in [0, 1] in quantile mode, got {self.r_hi!r}")
        _one_of("denominator", self.denominator, RSI_DENOMINATORS)
        if not self.entropy_eps > 0:
            raise ValueError(f"entropy_eps must be > 0, got {self.entropy_eps!r}")


@dataclass(frozen=True)
class ForkingParams(ClipLossParams):
    top_entropy_ratio: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("top_entropy_ratio", self.top_entropy_ratio)
        if not 0.0 < self.top_entropy_ratio <= 1.0:
            raise ValueError(f"top_entropy_ratio must be in (0, 1], got {self.top_entropy_ratio!r}")


@dataclass(frozen=True)
class ClipCovParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    clip_cov_ratio: float = 2e-4
    cov_lower: float = 1.0
    cov_upper: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("clip_cov_ratio", self.clip_cov_ratio)
        if not 0.0 <= self.clip_cov_ratio <= 1.0:
            raise ValueError(f"clip_cov_ratio must be in [0, 1], got {self.clip_cov_ratio!r}")
        if self.cov_lower > self.cov_upper:
            raise ValueError(f"cov_lower must be ≤ cov_upper, got {self.cov_lower!r} > {self.cov_upper!r}")


@dataclass(frozen=True)
class KlCovParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    kl_cov_ratio: float = 2e-3
    kl_cov_coef: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("kl_cov_ratio", self.kl_cov_ratio)
        if not 0.0 <= self.kl_cov_ratio <= 1.0:
            raise ValueError(f"kl_cov_ratio must be in [0, 1], got {self.kl_cov_ratio!r}")
        _finite("kl_cov_coef", self.kl_cov_coef)
        if self.kl_cov_coef < 0:
            raise ValueError(f"kl_cov_coef must be ≥ 0, got {self.kl_cov_coef!r}")


@dataclass(frozen=True)
class AdaptiveEntropyParams(ClipLossParams):
    """An entropy bonus whose coefficient adapts toward a target entropy (Skywork-OR1's adaptive entropy
    control, arXiv 2505.22312 §3.2; TRL's GRPOTrainer `use_adaptive_entropy`). The target is the
    controller's own setting (algorithm.control.target_entropy, contract/control/entropy_coef.py), with the
    same default as STARE's gate, so the two are compared at one target.

    Per step k, from H̄_k (token-mean entropy of π_old over the training batch, as STARE's gate measures):
        c_{k+1} = clip(c_k + Δ·sgn(H_tgt − H̄_k), 0, c_max)
        α_k     = c_k · 1[H̄_k < H_tgt]
    and the loss is the grpo_ds per-token loss − α_k·H_t (H_t differentiable), token-mean aggregated.
    """

    coef_init: float = 0.0  # c_0
    coef_step: float = 0.005  # Δ
    coef_max: float = 0.1  # upper clip of c

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("coef_init", "coef_step", "coef_max"):
            _finite(name, getattr(self, name))
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)!r}")
        if self.coef_init > self.coef_max:
            raise ValueError(f"coef_init must be ≤ coef_max, got {self.coef_init!r} > {self.coef_max!r}")


def check_target_entropy(value: float, name: str = "target_entropy") -> float:
    """A resolved target entropy in nats: finite and non-negative."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class EntropyTarget:
    """A controller's target entropy as the user sets it: absolute (nats) or relative to H₀, the token-mean
    entropy of π_old on the first RL step's batch (an initial-anchored target). Exactly one is set."""

    nats: float | None = None
    relative: float | None = None

    def __post_init__(self) -> None:
        if (self.nats is None) == (self.relative is None):
            raise ValueError("target_entropy: set a number of nats or {relative: r}, exactly one")
        if self.nats is not None:
            check_target_entropy(self.nats)
        if self.relative is not None and not (
            math.isfinite(self.relative) and 0.0 < self.relative <= RELATIVE_TARGET_MAX
        ):
            raise ValueError(
                f"target_entropy.relative must be in (0, {RELATIVE_TARGET_MAX:g}], got {self.relative!r}"
            )

    @property
    def is_relative(self) -> bool:
        return self.relative is not None

    def resolve(self, initial_entropy: float | None) -> float:
        """The target in nats: the absolute value, or relative × H₀ (H₀ required then)."""
        if self.nats is not None:
            return self.nats
        assert self.relative is not None
        if initial_entropy is None or not math.isfinite(initial_entropy):
            raise ValueError(f"a relative target needs a finite initial entropy H0, got {initial_entropy!r}")
        return check_target_entropy(self.relative * initial_entropy)


RELATIVE_TARGET_MAX = 10.0
# Both controllers' default target (nats): STARE's paper value, so the two compare at one target.
DEFAULT_TARGET_ENTROPY = 0.3
# The entropy band's default around a relative target: [low, high] × the resolved target.
BAND_AROUND_TARGET = (0.5, 2.0)
