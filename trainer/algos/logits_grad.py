"""The gradient written over the logits (`grad_in_logits`): the guard both log-prob kernels share (the chunked
one, trainer/algos/kernels.py, and the fused Triton one, trainer/algos/triton_kernels.py)."""

from __future__ import annotations

import torch


def require_no_graph_for_grad_in_logits() -> None:
    """Backward with create_graph=True would record the overwrite of the logits in the new graph."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "grad_in_logits=True does not support create_graph=True (higher-order gradients): the "
            "gradient is written over the logits; call with grad_in_logits=False"
        )
