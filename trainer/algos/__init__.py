"""The algorithm library: pure tensor math for STARE, RSI-S and the baselines. No I/O, no frameworks.

- stare.py: STARE whole: its parameters, target-entropy gate, token weights ω and loss;
- rsi.py: RSI-S whole: the Relative Surprisal Index, its keep mask and loss;
- surrogate.py: what every loss shares (inputs, registry, the PPO clipped surrogate, the KL penalty);
- losses.py: the baseline losses and the entry points (`compute_policy_loss`, `make_loss_params`);
- pi_control.py, split_control.py: the entropy laws' actuators (their losses; the laws are declared in
  contract/control);
- control.py: the actuators' registry (what a controller's state does to the loss) and `check_control`;
- selection.py: the token ranking the selections share, the 80/20 and covariance selections;
- advantages.py, aggregation.py, shaping.py, diagnostics.py, kernels.py: estimators, loss reductions,
  reward shaping and dynamic sampling, entropy diagnostics, the log-prob/entropy/C(p) kernels.
"""

from trainer.algos.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, group_mean_std
from trainer.algos.aggregation import AggMode, aggregate
from trainer.algos.diagnostics import entropy_sensitivity, quadrant_analysis
from trainer.algos.kernels import (
    TokenStats,
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
from trainer.algos.rsi import relative_surprisal_index, rsi_keep_mask
from trainer.algos.shaping import informative_groups, overlong_penalty
from trainer.algos.stare import StareControllerState, StareGateSettings, initial_state, stare_weights, update

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AggMode",
    "ClipLossParams",
    "PolicyLossInputs",
    "StareControllerState",
    "StareGateSettings",
    "StareParams",
    "TokenStats",
    "UnknownNameError",
    "aggregate",
    "compute_advantages",
    "compute_policy_loss",
    "entropy_sensitivity",
    "group_mean_std",
    "informative_groups",
    "initial_state",
    "make_loss_params",
    "overlong_penalty",
    "quadrant_analysis",
    "relative_surprisal_index",
    "rsi_keep_mask",
    "stare_weights",
    "token_stats_from_logits",
    "token_stats_reference",
    "update",
    "zero_advantage_rows_inert",
]
