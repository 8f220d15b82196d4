"""How many of Adam's parameters take steps that grow with their gradient (docs/method.md, "Reduction").

Adam's update is lr * m_hat / (sqrt(v_hat) + eps). Where sqrt(v_hat) is well below eps the denominator is about eps
and the step is about lr * m_hat / eps: proportional to the gradient, so a loss scaled by 1/(k+1) (MemVir's official
reduction) moves such a parameter 1/(k+1) as far. Where sqrt(v_hat) is above eps the step hardly depends on the
gradient's scale. The share of parameters below eps is what decides whether the reduction acts as a learning-rate cut;
the Trainer logs it, so that the premise is measured rather than assumed.
"""

from __future__ import annotations

import torch

# The logged names, one per parameter group of the Trainer's optimizer (the network, then the class weights).
SHARE_NAMES = ("adam_eps_share", "adam_eps_share_class")


def eps_dominated_shares(optimizer: torch.optim.Adam) -> dict[str, float]:
    """{SHARE_NAMES[g]: fraction of group g's scalar parameters with sqrt(v_hat) < eps}, over the parameters that
    have taken a step (empty before the first step). One host sync for all groups."""
    pending = []
    for name, group in zip(SHARE_NAMES, optimizer.param_groups, strict=False):
        _, beta2 = group["betas"]
        below, total = [], 0
        for parameter in group["params"]:
            state = optimizer.state.get(parameter, {})
            if "exp_avg_sq" not in state:
                continue
            # sqrt(v / (1 - beta2^t)) < eps, squared: no square root of every parameter
            bias_correction = 1 - beta2 ** float(state["step"])
            below.append((state["exp_avg_sq"] < group["eps"] ** 2 * bias_correction).sum())
            total += parameter.numel()
        if total:
            pending.append((name, torch.stack(below).sum(), total))
    if not pending:
        return {}
    counts = torch.stack([count for _, count, _ in pending]).tolist()
    return {name: count / total for (name, _, total), count in zip(pending, counts, strict=True)}
