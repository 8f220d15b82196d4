"""memvir.train.adam_regime: the share of Adam's parameters whose step grows with the gradient, against a hand count."""

import pytest
import torch

from memvir.train.adam_regime import eps_dominated_shares


def test_shares_count_the_parameters_whose_root_mean_square_gradient_is_below_eps():
    # One step: v = (1 - beta2) g^2, bias correction 1 - beta2, so sqrt(v_hat) = |g|. With eps 0.1 the network's
    # gradients 0.05 and 0.01 are below it (2 of 4) and the class weights' 0.5, 0.2, 0.3 none (0 of 3).
    network = torch.nn.Parameter(torch.zeros(4))
    class_weights = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([{"params": [network]}, {"params": [class_weights]}], eps=0.1)
    assert eps_dominated_shares(optimizer) == {}  # no step yet
    network.grad = torch.tensor([0.05, 0.2, -0.01, 1.0])
    class_weights.grad = torch.tensor([0.5, -0.2, 0.3])
    optimizer.step()
    assert eps_dominated_shares(optimizer) == {"adam_eps_share": pytest.approx(0.5),
                                               "adam_eps_share_class": pytest.approx(0.0)}


def test_shares_follow_the_bias_corrected_average_over_steps():
    # Two steps of gradients 0.3 then 0: v = beta2 (1 - beta2) 0.09, v_hat = v / (1 - beta2^2)
    # = 0.09 beta2 / (1 + beta2) = 0.0449..., sqrt = 0.2120: below eps 0.25, above eps 0.2.
    for eps, expected in ((0.25, 1.0), (0.2, 0.0)):
        parameter = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.Adam([{"params": [parameter]}], eps=eps, betas=(0.9, 0.999))
        for gradient in (0.3, 0.0):
            parameter.grad = torch.tensor([gradient])
            optimizer.step()
        assert eps_dominated_shares(optimizer) == {"adam_eps_share": pytest.approx(expected)}
