"""memvir.analysis.spread against loops written out here: cosines one pair at a time, Wang and Isola's uniformity as its
formula reads."""

import math

import pytest
import torch

from memvir import MemVir
from memvir.analysis.spread import class_weight_spread, virtual_spread


def cosine(a, b):
    return float(a @ b) / math.sqrt(float(a @ a) * float(b @ b))


def test_class_weight_spread_by_hand():
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 0.0], [-3.0, 0.5, 1.0]])
    pairs = [(a, b) for a in range(4) for b in range(4) if a != b]
    mean_cos = sum(cosine(weights[a], weights[b]) for a, b in pairs) / len(pairs)
    units = [w / w.norm() for w in weights]
    uniformity = math.log(sum(math.exp(-2 * float(((units[a] - units[b]) ** 2).sum())) for a, b in pairs)
                          / len(pairs))
    measures = class_weight_spread(weights)
    assert measures["weight_mean_cos"] == pytest.approx(mean_cos, abs=1e-6)
    assert measures["weight_uniformity"] == pytest.approx(uniformity, abs=1e-6)


def test_crowded_classes_have_a_high_mean_cosine_and_spread_ones_a_low_uniformity():
    crowded = torch.ones(10, 8) + 0.01 * torch.randn(10, 8, generator=torch.Generator().manual_seed(0))
    spread = torch.eye(8)
    assert class_weight_spread(crowded)["weight_mean_cos"] > 0.99
    assert class_weight_spread(spread)["weight_mean_cos"] == pytest.approx(0.0, abs=1e-7)
    assert class_weight_spread(spread)["weight_uniformity"] < class_weight_spread(crowded)["weight_uniformity"]


def test_virtual_spread_by_hand_from_a_real_memory():
    """MemVir(2, 0): the fourth call uses the steps 1 and 2 calls before it (ages 1, 2). Each age's figures are
    worked out here from the tensors those calls were given, against the fourth call's live weights."""
    gen = torch.Generator().manual_seed(3)
    memory = MemVir(num_steps=2, margin=0)
    steps = []
    for _ in range(4):
        x, y = torch.randn(5, 4, generator=gen), torch.randint(0, 3, (5,), generator=gen)
        w = torch.randn(3, 4, generator=gen)
        output = memory(x, y, w)
        steps.append((x, y, w))
    measures = virtual_spread(*output, num_classes=3)
    assert sorted(measures) == ["virtual_embedding_cos_1", "virtual_embedding_cos_2", "virtual_weight_cos_1",
                                "virtual_weight_cos_2"]
    live = steps[-1][2]
    for age in (1, 2):
        x, y, w = steps[-1 - age]
        weight_cos = sum(cosine(w[c], live[c]) for c in range(3)) / 3
        embedding_cos = sum(cosine(x[i], live[y[i]]) for i in range(5)) / 5
        assert measures[f"virtual_weight_cos_{age}"] == pytest.approx(weight_cos, abs=1e-6)
        assert measures[f"virtual_embedding_cos_{age}"] == pytest.approx(embedding_cos, abs=1e-6)


def test_no_virtual_sets_no_measures():
    assert virtual_spread(torch.randn(5, 4), torch.zeros(5, dtype=torch.long), torch.randn(3, 4), 3) == {}
    assert class_weight_spread(torch.randn(1, 4)) == {}
