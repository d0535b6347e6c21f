"""The algorithm library: pure tensor math for STARE, RSI-S and the baselines. No I/O, no frameworks."""

from trainer.algos.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, group_mean_std
from trainer.algos.aggregation import AggMode, aggregate
from trainer.algos.diagnostics import (
    entropy_logit_gradient,
    entropy_sensitivity,
    masked_mean,
    quadrant_analysis,
)
from trainer.algos.kernels import (
    TokenStats,
    token_stats_from_hidden,
    token_stats_from_logits,
    token_stats_reference,
)
from trainer.algos.losses import (
    POLICY_LOSSES,
    ClipLossParams,
    PolicyLossInputs,
    StareParams,
    compute_policy_loss,
    make_loss_params,
    zero_advantage_rows_inert,
)
from trainer.algos.registry import UnknownNameError
from trainer.algos.selection import relative_surprisal_index, rsi_keep_mask, stare_weights
from trainer.algos.shaping import informative_groups, overlong_penalty
from trainer.algos.stare import StareControllerState, StareGateParams, initial_state, update

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AggMode",
    "ClipLossParams",
    "PolicyLossInputs",
    "StareControllerState",
    "StareGateParams",
    "StareParams",
    "TokenStats",
    "UnknownNameError",
    "aggregate",
    "compute_advantages",
    "compute_policy_loss",
    "entropy_logit_gradient",
    "entropy_sensitivity",
    "group_mean_std",
    "informative_groups",
    "initial_state",
    "make_loss_params",
    "masked_mean",
    "overlong_penalty",
    "quadrant_analysis",
    "relative_surprisal_index",
    "rsi_keep_mask",
    "stare_weights",
    "token_stats_from_hidden",
    "token_stats_from_logits",
    "token_stats_reference",
    "update",
    "zero_advantage_rows_inert",
]
