"""Tests for memvir.losses: every loss against a hand-written per-row, per-class reference (value and gradient),
with and without MemVir-style virtual classes, plus gradcheck, dtype handling and every error path.

The references below loop over rows and classes with scalar tensor ops and textbook formulas (acos for angles,
explicit squared distances, per-proxy sums), so they share no code path with the vectorised implementation;
their gradients come from autograd through those loops.
"""

import math

import pytest
import torch
from torch import nn

from memvir.losses import LOSSES, build_loss

NUM_CLASSES, BATCH, DIM = 4, 5, 3
NUM_VIRTUAL_SETS = 2


# ----------------------------------------------------------------------------------------------------------------
# Independent references
# ----------------------------------------------------------------------------------------------------------------


def unit(vector):
    return vector / torch.sqrt((vector * vector).sum())


def reference_cosines(embeddings, class_weights):
    """List of rows, each a list of 0-dim tensors cos(x_i, w_j)."""
    weights = [unit(w) for w in class_weights]
    return [[(unit(x) * w).sum() for w in weights] for x in embeddings]


def reference_cross_entropy(logit_rows, labels):
    """mean_i [ -z_iy + log sum_j exp(z_ij) ], one row at a time."""
    total = 0.0
    for row, label in zip(logit_rows, labels.tolist(), strict=True):
        total = total - row[label] + torch.log(sum(torch.exp(z) for z in row))
    return total / len(logit_rows)


def reference_arc_target(cos_y, margin):
    """cos(theta + m) through the angle itself; insightface fallback once theta + m passes pi."""
    theta = torch.acos(cos_y)
    if theta.item() + margin > math.pi:
        return cos_y - math.sin(math.pi - margin) * margin
    return torch.cos(theta + margin)


def ref_softmax(embeddings, labels, class_weights):
    rows = [[(x * w).sum() for w in class_weights] for x in embeddings]
    return reference_cross_entropy(rows, labels)


def ref_norm_softmax(embeddings, labels, class_weights, scale=23.0):
    rows = [[scale * c for c in row] for row in reference_cosines(embeddings, class_weights)]
    return reference_cross_entropy(rows, labels)


def ref_cosface(embeddings, labels, class_weights, scale=64.0, margin=0.35):
    rows = []
    for row, label in zip(reference_cosines(embeddings, class_weights), labels.tolist(), strict=True):
        rows.append([scale * (c - margin) if j == label else scale * c for j, c in enumerate(row)])
    return reference_cross_entropy(rows, labels)


def ref_arcface(embeddings, labels, class_weights, scale=64.0, margin=0.5):
    rows = []
    for row, label in zip(reference_cosines(embeddings, class_weights), labels.tolist(), strict=True):
        rows.append([scale * reference_arc_target(c, margin) if j == label else scale * c for j, c in enumerate(row)])
    return reference_cross_entropy(rows, labels)


def ref_curricularface(embeddings, labels, class_weights, t_before, training, scale=64.0, margin=0.5):
    """Returns (loss, t used). In training t is first moved to 0.01 * mean target cosine + 0.99 * t."""
    cosine_rows = reference_cosines(embeddings, class_weights)
    label_list = labels.tolist()
    t = t_before
    if training:
        mean_target = sum(row[y].item() for row, y in zip(cosine_rows, label_list, strict=True)) / len(label_list)
        t = 0.01 * mean_target + 0.99 * t_before
    rows = []
    for row, label in zip(cosine_rows, label_list, strict=True):
        hard_threshold = math.cos(math.acos(row[label].item()) + margin)
        logits = []
        for j, c in enumerate(row):
            if j == label:
                logits.append(scale * reference_arc_target(c, margin))
            elif c.item() > hard_threshold:
                logits.append(scale * c * (t + c))
            else:
                logits.append(scale * c)
        rows.append(logits)
    return reference_cross_entropy(rows, labels), t


def ref_proxy_nca(embeddings, labels, class_weights, scale=12.0):
    rows = []
    for x in embeddings:
        rows.append([-scale * ((unit(x) - unit(w)) ** 2).sum() for w in class_weights])
    return reference_cross_entropy(rows, labels)


def ref_proxy_anchor(embeddings, labels, class_weights, margin=0.1, alpha=32.0):
    cosine_rows = reference_cosines(embeddings, class_weights)
    label_list = labels.tolist()
    num_proxies = len(class_weights)
    positive_total, negative_total, proxies_with_positives = 0.0, 0.0, 0
    for p in range(num_proxies):
        positive_sum, negative_sum, has_positive = 0.0, 0.0, False
        for row, y in zip(cosine_rows, label_list, strict=True):
            if y == p:
                positive_sum = positive_sum + torch.exp(-alpha * (row[p] - margin))
                has_positive = True
            else:
                negative_sum = negative_sum + torch.exp(alpha * (row[p] + margin))
        if has_positive:
            positive_total = positive_total + torch.log(1 + positive_sum)
            proxies_with_positives += 1
        negative_total = negative_total + torch.log1p(torch.as_tensor(negative_sum, dtype=torch.float64))
    return positive_total / proxies_with_positives + negative_total / num_proxies


REFERENCES = {
    "softmax": ref_softmax,
    "norm-softmax": ref_norm_softmax,
    "cosface": ref_cosface,
    "arcface": ref_arcface,
    "proxy-nca": ref_proxy_nca,
    "proxy-anchor": ref_proxy_anchor,
}


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


def make_inputs(seed, batch=BATCH, num_classes=NUM_CLASSES, dim=DIM, virtual_sets=0, dtype=torch.float64):
    """Random inputs shaped like MemVir's output: (k+1)B rows, labels y + j*C for the j-th set, (k+1)C classes."""
    generator = torch.Generator().manual_seed(seed)
    sets = virtual_sets + 1
    embeddings = torch.randn(sets * batch, dim, generator=generator, dtype=dtype)
    class_weights = torch.randn(sets * num_classes, dim, generator=generator, dtype=dtype)
    base_labels = torch.randint(0, num_classes, (batch,), generator=generator)
    labels = torch.cat([base_labels + j * num_classes for j in range(sets)])
    return embeddings.requires_grad_(), labels, class_weights.requires_grad_()


def value_and_grads(loss_fn, embeddings, labels, class_weights):
    value = loss_fn(embeddings, labels, class_weights)
    grad_embeddings, grad_weights = torch.autograd.grad(value, (embeddings, class_weights))
    return value.detach(), grad_embeddings, grad_weights


def assert_matches_reference(loss_fn, reference_fn, embeddings, labels, class_weights):
    value, grad_embeddings, grad_weights = value_and_grads(loss_fn, embeddings, labels, class_weights)
    ref_value, ref_grad_embeddings, ref_grad_weights = value_and_grads(reference_fn, embeddings, labels, class_weights)
    assert value.shape == ()
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, ref_value, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad_embeddings, ref_grad_embeddings, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(grad_weights, ref_grad_weights, rtol=1e-8, atol=1e-10)


# ----------------------------------------------------------------------------------------------------------------
# Registry, defaults, repr
# ----------------------------------------------------------------------------------------------------------------


def test_losses_lists_the_seven_names_in_order():
    assert LOSSES == (
        "softmax",
        "norm-softmax",
        "cosface",
        "arcface",
        "curricularface",
        "proxy-nca",
        "proxy-anchor",
    )


@pytest.mark.parametrize(
    ("name", "defaults", "text"),
    [
        ("softmax", {}, "SoftmaxLoss()"),
        ("norm-softmax", {"scale": 23.0}, "scale=23.0"),
        ("cosface", {"scale": 64.0, "margin": 0.35}, "scale=64.0, margin=0.35"),
        ("arcface", {"scale": 64.0, "margin": 0.5}, "scale=64.0, margin=0.5"),
        ("curricularface", {"scale": 64.0, "margin": 0.5}, "scale=64.0, margin=0.5"),
        ("proxy-nca", {"scale": 12.0}, "scale=12.0"),
        ("proxy-anchor", {"margin": 0.1, "alpha": 32.0}, "margin=0.1, alpha=32.0"),
    ],
)
def test_defaults_are_attributes_and_shown_in_repr(name, defaults, text):
    loss = build_loss(name)
    assert isinstance(loss, nn.Module)
    for attribute, value in defaults.items():
        assert getattr(loss, attribute) == value
    assert text in repr(loss)


def test_hparams_are_passed_through_and_ints_become_floats():
    loss = build_loss("cosface", scale=30, margin=0.2)
    assert (loss.scale, loss.margin) == (30.0, 0.2)
    assert isinstance(loss.scale, float)
    assert "scale=30.0, margin=0.2" in repr(loss)


# ----------------------------------------------------------------------------------------------------------------
# Values and gradients against the references
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("virtual_sets", [0, NUM_VIRTUAL_SETS])
@pytest.mark.parametrize("name", list(REFERENCES))
def test_matches_reference_value_and_gradient(name, virtual_sets):
    embeddings, labels, class_weights = make_inputs(seed=1, virtual_sets=virtual_sets)
    assert_matches_reference(build_loss(name), REFERENCES[name], embeddings, labels, class_weights)


@pytest.mark.parametrize(
    ("name", "hparams"),
    [
        ("norm-softmax", {"scale": 5.0}),
        ("cosface", {"scale": 7.0, "margin": 0.6}),
        ("arcface", {"scale": 9.0, "margin": 1.2}),
        ("proxy-nca", {"scale": 3.0}),
        ("proxy-anchor", {"margin": 0.3, "alpha": 8.0}),
    ],
)
def test_matches_reference_with_non_default_hparams(name, hparams):
    embeddings, labels, class_weights = make_inputs(seed=2, virtual_sets=1)
    reference = REFERENCES[name]
    assert_matches_reference(
        build_loss(name, **hparams), lambda x, y, w: reference(x, y, w, **hparams), embeddings, labels, class_weights
    )


@pytest.mark.parametrize("virtual_sets", [0, NUM_VIRTUAL_SETS])
@pytest.mark.parametrize("training", [True, False])
def test_curricularface_matches_reference(training, virtual_sets):
    embeddings, labels, class_weights = make_inputs(seed=3, virtual_sets=virtual_sets)
    # A large margin and a non-zero starting t make both hard negatives and the t factor matter.
    loss = build_loss("curricularface", scale=10.0, margin=1.0).train(training)
    loss.t.fill_(0.4)
    value, grad_embeddings, grad_weights = value_and_grads(loss, embeddings, labels, class_weights)
    t_used = loss.t.item()

    def reference(x, y, w):
        return ref_curricularface(x, y, w, t_before=0.4, training=training, scale=10.0, margin=1.0)[0]

    ref_value, ref_grad_embeddings, ref_grad_weights = value_and_grads(reference, embeddings, labels, class_weights)
    _, ref_t = ref_curricularface(embeddings, labels, class_weights, 0.4, training, scale=10.0, margin=1.0)
    assert t_used == pytest.approx(ref_t, abs=1e-7)  # the buffer is float32
    torch.testing.assert_close(value, ref_value, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_embeddings, ref_grad_embeddings, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_weights, ref_grad_weights, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# The balanced reduction (classes_per_set=C): each MemVir set averaged on its own, the set means summed
# ----------------------------------------------------------------------------------------------------------------


def balanced_reference(reference_fn, embeddings, labels, class_weights, num_classes):
    """Each set's rows (labels in [jC, (j+1)C)) through the per-row reference on their own, against every class; the
    reference averages over the rows it is given, so this is the sum of the set means."""
    sets = labels // num_classes
    total = 0.0
    for j in sorted(set(sets.tolist())):
        rows = sets == j
        total = total + reference_fn(embeddings[rows], labels[rows], class_weights)
    return total


def ref_proxy_anchor_balanced(embeddings, labels, class_weights, num_classes, margin=0.1, alpha=32.0):
    """Proxy-Anchor with both per-proxy averages taken within each set of C proxies, the sets' terms summed."""
    cosine_rows = reference_cosines(embeddings, class_weights)
    label_list = labels.tolist()
    total = 0.0
    for first in range(0, len(class_weights), num_classes):
        positive_total, negative_total, proxies_with_positives = 0.0, 0.0, 0
        for p in range(first, first + num_classes):
            positive_sum, negative_sum, has_positive = 0.0, 0.0, False
            for row, y in zip(cosine_rows, label_list, strict=True):
                if y == p:
                    positive_sum = positive_sum + torch.exp(-alpha * (row[p] - margin))
                    has_positive = True
                else:
                    negative_sum = negative_sum + torch.exp(alpha * (row[p] + margin))
            if has_positive:
                positive_total = positive_total + torch.log(1 + positive_sum)
                proxies_with_positives += 1
            negative_total = negative_total + torch.log1p(torch.as_tensor(negative_sum, dtype=torch.float64))
        if proxies_with_positives:
            total = total + positive_total / proxies_with_positives
        total = total + negative_total / num_classes
    return total


def uneven_inputs(seed, set_sizes, num_classes=NUM_CLASSES, dim=DIM):
    """MemVir-shaped inputs whose sets hold different numbers of rows (batches of different sizes)."""
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(sum(set_sizes), dim, generator=generator, dtype=torch.float64)
    class_weights = torch.randn(len(set_sizes) * num_classes, dim, generator=generator, dtype=torch.float64)
    labels = torch.cat([torch.randint(0, num_classes, (size,), generator=generator) + j * num_classes
                        for j, size in enumerate(set_sizes)])
    return embeddings.requires_grad_(), labels, class_weights.requires_grad_()


@pytest.mark.parametrize("virtual_sets", [0, 1, 3])
@pytest.mark.parametrize("name", list(REFERENCES))
def test_balanced_reduction_matches_reference_value_and_gradient(name, virtual_sets):
    embeddings, labels, class_weights = make_inputs(seed=11, virtual_sets=virtual_sets)
    if name == "proxy-anchor":
        def reference(x, y, w):
            return ref_proxy_anchor_balanced(x, y, w, NUM_CLASSES)
    else:
        def reference(x, y, w):
            return balanced_reference(REFERENCES[name], x, y, w, NUM_CLASSES)
    loss = build_loss(name)
    assert_matches_reference(lambda x, y, w: loss(x, y, w, classes_per_set=NUM_CLASSES), reference,
                             embeddings, labels, class_weights)


@pytest.mark.parametrize("name", ["norm-softmax", "cosface", "proxy-anchor"])
def test_balanced_reduction_with_sets_of_different_sizes(name):
    embeddings, labels, class_weights = uneven_inputs(seed=12, set_sizes=(5, 2, 7, 1))
    if name == "proxy-anchor":
        def reference(x, y, w):
            return ref_proxy_anchor_balanced(x, y, w, NUM_CLASSES)
    else:
        def reference(x, y, w):
            return balanced_reference(REFERENCES[name], x, y, w, NUM_CLASSES)
    loss = build_loss(name)
    assert_matches_reference(lambda x, y, w: loss(x, y, w, classes_per_set=NUM_CLASSES), reference,
                             embeddings, labels, class_weights)


@pytest.mark.parametrize("virtual_sets", [0, 1, 3])
def test_balanced_softmax_gradient_by_hand(virtual_sets):
    """d/dx_i of the balanced softmax loss is (p_i - e_{y_i}) W / B_set(i): each row weighs 1/(its set's size), so
    the live rows weigh 1/B whatever k is (official: 1/((k+1)B)). p_i = softmax(W x_i), written out in numpy."""
    import numpy as np

    set_sizes = (3, 5, 2, 4)[: virtual_sets + 1]
    embeddings, labels, class_weights = uneven_inputs(seed=13, set_sizes=set_sizes)
    loss = build_loss("softmax")(embeddings, labels, class_weights, classes_per_set=NUM_CLASSES)
    grad_x, grad_w = torch.autograd.grad(loss, (embeddings, class_weights))
    x, w, y = embeddings.detach().numpy(), class_weights.detach().numpy(), labels.numpy()
    logits = x @ w.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    residual = p - np.eye(w.shape[0])[y]
    row_weight = np.array([1.0 / set_sizes[label // NUM_CLASSES] for label in y])
    expected_x = (row_weight[:, None] * residual) @ w
    expected_w = (row_weight[:, None] * residual).T @ x
    expected_loss = sum(
        -np.log(p[np.arange(len(y)), y])[y // NUM_CLASSES == j].mean() for j in range(len(set_sizes)))
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(grad_x.numpy(), expected_x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad_w.numpy(), expected_w, rtol=1e-10, atol=1e-12)


def test_balanced_curricularface_updates_t_from_all_rows():
    """t moves by the mean over all rows, virtual ones included, as under the official reduction; the loss is then
    the sum of the set means at that t."""
    embeddings, labels, class_weights = make_inputs(seed=14, virtual_sets=2)
    loss = build_loss("curricularface", scale=10.0, margin=1.0).train()
    loss.t.fill_(0.4)
    value, grad_embeddings, grad_weights = value_and_grads(
        lambda x, y, w: loss(x, y, w, classes_per_set=NUM_CLASSES), embeddings, labels, class_weights)
    _, t_after = ref_curricularface(embeddings, labels, class_weights, 0.4, True, scale=10.0, margin=1.0)
    assert loss.t.item() == pytest.approx(t_after, abs=1e-7)

    def reference(x, y, w):
        def per_set(xs, ys, ws):
            return ref_curricularface(xs, ys, ws, t_before=loss.t.item(), training=False, scale=10.0, margin=1.0)[0]
        return balanced_reference(per_set, x, y, w, NUM_CLASSES)

    ref_value, ref_grad_embeddings, ref_grad_weights = value_and_grads(reference, embeddings, labels, class_weights)
    torch.testing.assert_close(value, ref_value, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_embeddings, ref_grad_embeddings, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_weights, ref_grad_weights, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("classes_per_set", [3, 0, -4, 2.0, True])
def test_balanced_reduction_refuses_a_set_size_that_does_not_divide_the_classes(classes_per_set):
    embeddings, labels, class_weights = make_inputs(seed=15, virtual_sets=1)  # 8 weight rows
    with pytest.raises(ValueError, match="classes_per_set must be a positive integer that divides the 8"):
        build_loss("norm-softmax")(embeddings, labels, class_weights, classes_per_set=classes_per_set)


def test_curricularface_has_hard_negatives_in_the_reference_inputs():
    """Guards the test above: with these inputs some non-target classes are hard, so the t branch is exercised."""
    embeddings, labels, class_weights = make_inputs(seed=3, virtual_sets=NUM_VIRTUAL_SETS)
    rows = reference_cosines(embeddings.detach(), class_weights.detach())
    hard = 0
    for row, y in zip(rows, labels.tolist(), strict=True):
        threshold = math.cos(math.acos(row[y].item()) + 1.0)
        hard += sum(1 for j, c in enumerate(row) if j != y and c.item() > threshold)
    assert 0 < hard < len(rows) * (len(rows[0]) - 1)


@pytest.mark.parametrize("name", LOSSES)
def test_virtual_classes_are_treated_like_real_ones(name):
    """Swapping the real class block with a virtual block (and relabelling) permutes classes only: the loss, and
    the gradients of each row and class, must follow. So a margin lands on a virtual target exactly as on a real one.
    """
    embeddings, labels, class_weights = make_inputs(seed=4, virtual_sets=1)
    loss = build_loss(name).eval()
    value, grad_embeddings, grad_weights = value_and_grads(loss, embeddings, labels, class_weights)

    swapped_weights = torch.cat([class_weights[NUM_CLASSES:], class_weights[:NUM_CLASSES]]).detach().requires_grad_()
    swapped_labels = (labels + NUM_CLASSES) % (2 * NUM_CLASSES)
    swapped_value, swapped_grad_embeddings, swapped_grad_weights = value_and_grads(
        loss, embeddings, swapped_labels, swapped_weights
    )
    torch.testing.assert_close(swapped_value, value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(swapped_grad_embeddings, grad_embeddings, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        swapped_grad_weights,
        torch.cat([grad_weights[NUM_CLASSES:], grad_weights[:NUM_CLASSES]]),
        rtol=1e-10,
        atol=1e-12,
    )


def test_cosface_margin_on_a_virtual_target_by_hand():
    """One row whose target is a virtual class (index 5 of 6): its logit is scale*(cos - m), the others scale*cos."""
    embeddings, _, class_weights = make_inputs(seed=16, batch=1, num_classes=3, virtual_sets=1)
    x, weights = embeddings.detach()[0].tolist(), class_weights.detach().tolist()

    def cosine(a, b):
        return sum(p * q for p, q in zip(a, b, strict=True)) / math.sqrt(sum(p * p for p in a) * sum(q * q for q in b))

    logits = [10.0 * (cosine(x, w) - 0.4) if j == 5 else 10.0 * cosine(x, w) for j, w in enumerate(weights)]
    expected = -logits[5] + math.log(sum(math.exp(z) for z in logits))
    value = build_loss("cosface", scale=10.0, margin=0.4)(embeddings[:1], torch.tensor([5]), class_weights)
    assert value.item() == pytest.approx(expected, rel=1e-12)


def test_cross_entropy_losses_average_over_all_rows():
    """The loss of (k+1)B rows is the mean of the per-row losses (MemVir's reference averaging)."""
    embeddings, labels, class_weights = make_inputs(seed=5, virtual_sets=NUM_VIRTUAL_SETS)
    loss = build_loss("norm-softmax")
    per_row = [loss(embeddings[i : i + 1], labels[i : i + 1], class_weights).item() for i in range(len(labels))]
    assert loss(embeddings, labels, class_weights).item() == pytest.approx(sum(per_row) / len(per_row), rel=1e-12)


def test_proxy_nca_equals_norm_softmax_at_twice_the_scale():
    embeddings, labels, class_weights = make_inputs(seed=6, virtual_sets=1)
    proxy_nca = build_loss("proxy-nca", scale=12.0)(embeddings, labels, class_weights)
    norm_softmax = build_loss("norm-softmax", scale=24.0)(embeddings, labels, class_weights)
    torch.testing.assert_close(proxy_nca, norm_softmax, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Loss-specific behaviour
# ----------------------------------------------------------------------------------------------------------------


def arcface_probe(theta, margin, scale=4.0):
    """Row at angle theta from its target class (e1) and orthogonal to the only other class (e3):
    the loss is log(1 + exp(-scale * target_logit)), so it tracks the target logit alone."""
    embedding = torch.tensor([[math.cos(theta), math.sin(theta), 0.0]], dtype=torch.float64)
    class_weights = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    return build_loss("arcface", scale=scale, margin=margin)(embedding, torch.tensor([0]), class_weights).item()


def test_arcface_fallback_past_pi():
    margin, theta = 0.5, 2.9  # theta + m > pi
    cos_y = math.cos(theta)
    fallback_target = cos_y - math.sin(math.pi - margin) * margin
    assert arcface_probe(theta, margin) == pytest.approx(math.log1p(math.exp(-4.0 * fallback_target)), rel=1e-12)
    # Without the fallback the target would be cos(theta + m), a larger logit and a smaller loss.
    assert arcface_probe(theta, margin) > math.log1p(math.exp(-4.0 * math.cos(theta + margin)))


def test_arcface_loss_rises_monotonically_with_the_target_angle_across_the_fallback():
    margin = 0.5
    thetas = [0.05 * i for i in range(1, 63)]  # up to 3.1 rad, crossing pi - m = 2.64
    losses = [arcface_probe(theta, margin) for theta in thetas]
    assert all(later > earlier for earlier, later in zip(losses, losses[1:], strict=False))


def test_arcface_reference_inputs_include_the_fallback_branch():
    embeddings = torch.tensor([[-1.0, 0.1, 0.0], [1.0, 0.2, 0.3], [0.2, 1.0, 0.0]], dtype=torch.float64)
    class_weights = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 1])  # row 0 sits almost opposite its class: theta ~ 3.04 rad
    assert math.acos(-1.0 / math.sqrt(1.01)) + 0.5 > math.pi
    assert_matches_reference(
        build_loss("arcface", scale=8.0),
        lambda x, y, w: ref_arcface(x, y, w, scale=8.0),
        embeddings.requires_grad_(),
        labels,
        class_weights.requires_grad_(),
    )


@pytest.mark.parametrize("name", ["arcface", "curricularface"])
def test_angular_losses_have_finite_gradients_when_a_row_equals_its_class(name):
    """cos_y = 1 makes sqrt(1 - cos^2) flat-out steep; the gradient must stay finite, not NaN."""
    embeddings = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    class_weights = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]], dtype=torch.float64, requires_grad=True)
    _, grad_embeddings, grad_weights = value_and_grads(
        build_loss(name), embeddings, torch.tensor([0, 1]), class_weights
    )
    assert torch.isfinite(grad_embeddings).all() and torch.isfinite(grad_weights).all()


def test_curricularface_t_updates_in_training_and_is_saved():
    embeddings, labels, class_weights = make_inputs(seed=7)
    loss = build_loss("curricularface").train()
    assert loss.t.item() == 0.0
    assert "t" in loss.state_dict()

    expected_t = 0.0
    for step in range(2):
        x, w = embeddings.detach() + 0.1 * step, class_weights.detach()
        rows = reference_cosines(x, w)
        mean_target = sum(row[y].item() for row, y in zip(rows, labels.tolist(), strict=True)) / len(rows)
        expected_t = 0.01 * mean_target + 0.99 * expected_t
        loss(x, labels, w)
        assert loss.t.item() == pytest.approx(expected_t, abs=1e-7)

    restored = build_loss("curricularface")
    restored.load_state_dict(loss.state_dict())
    assert restored.t.item() == loss.t.item()


def test_curricularface_t_is_frozen_in_eval_mode():
    embeddings, labels, class_weights = make_inputs(seed=8)
    loss = build_loss("curricularface").eval()
    loss.t.fill_(0.25)
    loss(embeddings, labels, class_weights)
    assert loss.t.item() == 0.25


def test_proxy_anchor_with_proxies_that_have_no_positive():
    embeddings, labels, class_weights = make_inputs(seed=9)
    labels = torch.tensor([0, 1, 1, 0, 1])  # proxies 2 and 3 have no positive row
    assert_matches_reference(build_loss("proxy-anchor"), ref_proxy_anchor, embeddings, labels, class_weights)

    # By hand: the positive term averages over the 2 proxies with positives, the negative term over all 4.
    cosines = [[c.item() for c in row] for row in reference_cosines(embeddings.detach(), class_weights.detach())]
    positive = sum(
        math.log1p(sum(math.exp(-32 * (cosines[i][p] - 0.1)) for i in range(5) if labels[i] == p)) for p in (0, 1)
    )
    negative = sum(
        math.log1p(sum(math.exp(32 * (cosines[i][p] + 0.1)) for i in range(5) if labels[i] != p)) for p in range(4)
    )
    value = build_loss("proxy-anchor")(embeddings, labels, class_weights).item()
    assert value == pytest.approx(positive / 2 + negative / 4, rel=1e-12)


def test_proxy_anchor_without_any_negative_has_finite_gradients():
    embeddings, _, class_weights = make_inputs(seed=10, num_classes=1)
    labels = torch.zeros(BATCH, dtype=torch.long)  # one proxy, every row positive: the negative sum is empty
    value, grad_embeddings, grad_weights = value_and_grads(
        build_loss("proxy-anchor"), embeddings, labels, class_weights
    )
    ref_value = ref_proxy_anchor(embeddings.detach(), labels, class_weights.detach())
    assert value.item() == pytest.approx(ref_value.item(), rel=1e-12)
    assert torch.isfinite(grad_embeddings).all() and torch.isfinite(grad_weights).all()


# ----------------------------------------------------------------------------------------------------------------
# gradcheck and dtypes
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSSES)
def test_gradcheck(name):
    embeddings, labels, class_weights = make_inputs(seed=11, batch=4, num_classes=3, virtual_sets=1)
    loss = build_loss(name).eval()  # curricularface: a fixed t, so repeated calls see the same function
    if name == "curricularface":
        loss.t.fill_(0.3)
    assert torch.autograd.gradcheck(lambda x, w: loss(x, labels, w), (embeddings, class_weights))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", LOSSES)
def test_half_precision_inputs_compute_in_float32(name, half):
    embeddings, labels, class_weights = make_inputs(seed=12, virtual_sets=1, dtype=torch.float32)
    half_embeddings, half_weights = embeddings.detach().to(half), class_weights.detach().to(half)
    loss = build_loss(name).eval()
    expected = loss(half_embeddings.float(), labels, half_weights.float())
    result = loss(half_embeddings, labels, half_weights)
    assert result.dtype == torch.float32 and result.shape == ()
    torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)
    mixed = loss(half_embeddings, labels, half_weights.float())
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, expected, rtol=1e-5, atol=1e-5)


def test_half_precision_gradients_reach_the_half_inputs():
    embeddings, labels, class_weights = make_inputs(seed=13, dtype=torch.float32)
    embeddings = embeddings.detach().half().requires_grad_()
    build_loss("arcface")(embeddings, labels, class_weights).backward()
    assert embeddings.grad.dtype == torch.float16 and torch.isfinite(embeddings.grad).all()


def test_float64_stays_float64():
    embeddings, labels, class_weights = make_inputs(seed=14)
    for name in LOSSES:
        assert build_loss(name)(embeddings, labels, class_weights).dtype == torch.float64


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown loss 'triplet'") as error:
        build_loss("triplet")
    for name in LOSSES:
        assert name in str(error.value)


@pytest.mark.parametrize(
    ("name", "hparams", "message"),
    [
        ("cosface", {"alpha": 2.0}, "unknown hyper-parameter.*alpha.*accepted: scale, margin"),
        ("norm-softmax", {"margin": 0.1}, "unknown hyper-parameter.*margin.*accepted: scale$"),
        ("proxy-anchor", {"scale": 3.0}, "unknown hyper-parameter.*scale.*accepted: margin, alpha"),
        ("softmax", {"scale": 1.0}, "'softmax'.*unknown hyper-parameter.*scale.*takes no hyper-parameters"),
    ],
)
def test_unknown_hparam_names_the_accepted_ones(name, hparams, message):
    with pytest.raises(ValueError, match=message):
        build_loss(name, **hparams)


@pytest.mark.parametrize(
    ("name", "hparams", "message"),
    [
        ("norm-softmax", {"scale": 0.0}, r"scale must be > 0, got 0.0"),
        ("cosface", {"scale": -1.0}, r"scale must be > 0, got -1.0"),
        ("cosface", {"margin": -0.1}, r"margin must be >= 0, got -0.1"),
        ("arcface", {"margin": math.pi}, r"margin is an angle in radians and must be < pi"),
        ("arcface", {"margin": -0.5}, r"margin must be >= 0"),
        ("curricularface", {"margin": 4.0}, r"margin is an angle in radians and must be < pi"),
        ("curricularface", {"scale": 0}, r"scale must be > 0"),
        ("proxy-nca", {"scale": -12.0}, r"scale must be > 0"),
        ("proxy-anchor", {"alpha": 0.0}, r"alpha must be > 0, got 0.0"),
        ("proxy-anchor", {"margin": -0.1}, r"margin must be >= 0"),
        ("cosface", {"scale": "64"}, r"scale must be a real number, got '64' of type str"),
        ("cosface", {"margin": True}, r"margin must be a real number, got True of type bool"),
        ("arcface", {"scale": math.nan}, r"scale must be finite, got nan"),
        ("proxy-anchor", {"alpha": math.inf}, r"alpha must be finite, got inf"),
    ],
)
def test_invalid_hparam_values(name, hparams, message):
    with pytest.raises(ValueError, match=message):
        build_loss(name, **hparams)


def shape_error_cases():
    x, y, w = torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), torch.randn(3, 3)
    return [
        ((x[0], y, w), r"embeddings must be a 2-D floating tensor \[B, D\], got shape \(3,\)"),
        ((x.long(), y, w), r"embeddings must be a 2-D floating tensor .* dtype torch.int64"),
        ((x, y, w[None]), r"class_weights must be a 2-D floating tensor \[C, D\], got shape \(1, 3, 3\)"),
        ((x, y, torch.randn(3, 5)), r"same D, got embeddings \(4, 3\) and class_weights \(3, 5\)"),
        ((x[:0], y[:0], w), r"at least one embedding row and one class, got embeddings \(0, 3\)"),
        ((x, y, w[:0]), r"at least one embedding row and one class.*class_weights \(0, 3\)"),
        ((x, y[:, None], w), r"labels must be 1-D with one label per embedding row, got labels \(4, 1\)"),
        ((x, y[:3], w), r"labels must be 1-D .* got labels \(3,\) for embeddings \(4, 3\)"),
        ((x, y.float(), w), r"labels must be an integer tensor \(int64\), got dtype torch.float32"),
        ((x, y.bool(), w), r"labels must be an integer tensor \(int64\), got dtype torch.bool"),
        ((x, torch.tensor([0, -1, 2, 0]), w), r"labels must lie in \[0, 3\) .* got labels from -1 to 2"),
        ((x, torch.tensor([0, 1, 3, 0]), w), r"labels must lie in \[0, 3\) .*\(3, 3\).* got labels from 0 to 3"),
        ((x.tolist(), y, w), r"embeddings must be a torch.Tensor, got list"),
        ((x, [0, 1, 2, 0], w), r"labels must be a torch.Tensor, got list"),
    ]


@pytest.mark.parametrize("name", LOSSES)
def test_bad_inputs_are_rejected_with_a_clear_message(name):
    loss = build_loss(name)
    for arguments, message in shape_error_cases():
        with pytest.raises(ValueError, match=message):
            loss(*arguments)


def test_other_integer_label_dtypes_are_accepted():
    embeddings, labels, class_weights = make_inputs(seed=15)
    loss = build_loss("cosface")
    torch.testing.assert_close(
        loss(embeddings, labels.int(), class_weights), loss(embeddings, labels, class_weights), rtol=0, atol=0
    )


def test_without_value_checks_labels_are_not_range_checked_but_shapes_are():
    embeddings, labels, class_weights = make_inputs(seed=16)
    checked = build_loss("norm-softmax")(embeddings, labels, class_weights)
    loss = build_loss("norm-softmax")
    loss.check_values = False
    assert torch.equal(loss(embeddings, labels, class_weights), checked)
    with pytest.raises(ValueError, match="labels must be 1-D"):
        loss(embeddings, labels[:2], class_weights)


@pytest.mark.parametrize("virtual_sets", [0, 1, 3])
@pytest.mark.parametrize("name", ["softmax", "norm-softmax", "cosface", "arcface", "curricularface", "proxy-nca"])
def test_balanced_is_k_plus_one_times_official_on_sets_of_equal_size(name, virtual_sets):
    """With k virtual sets of B rows each (MemVir's batches all of one size), the sum of the k+1 set means of a
    row-averaged loss is (k+1) times the mean over all (k+1)B rows: balanced is official with a larger step, in
    value and gradient (docs/method.md, "Reduction")."""
    embeddings, labels, class_weights = uneven_inputs(seed=5, set_sizes=[BATCH] * (virtual_sets + 1))
    official = build_loss(name)(embeddings, labels, class_weights)
    balanced = build_loss(name)(embeddings, labels, class_weights, classes_per_set=NUM_CLASSES)
    torch.testing.assert_close(balanced, (virtual_sets + 1) * official, rtol=1e-12, atol=1e-12)
    official_grads = torch.autograd.grad(official, (embeddings, class_weights))
    balanced_grads = torch.autograd.grad(balanced, (embeddings, class_weights))
    for balanced_grad, official_grad in zip(balanced_grads, official_grads, strict=True):
        torch.testing.assert_close(balanced_grad, (virtual_sets + 1) * official_grad, rtol=1e-10, atol=1e-12)


def test_proxy_anchor_balanced_is_not_a_multiple_of_official():
    """Proxy-Anchor averages over proxies (with positives, and all), not rows: where the sets' batches hold different
    classes (as MemVir's stored batches do) its balanced reduction re-weighs the sets' terms, no plain rescaling."""
    embeddings, labels, class_weights = uneven_inputs(seed=5, set_sizes=[BATCH] * 3)
    assert len({frozenset((labels[i * BATCH:(i + 1) * BATCH] % NUM_CLASSES).tolist()) for i in range(3)}) > 1
    official = build_loss("proxy-anchor")(embeddings, labels, class_weights)
    balanced = build_loss("proxy-anchor")(embeddings, labels, class_weights, classes_per_set=NUM_CLASSES)
    assert not torch.isclose(balanced, 3 * official, rtol=1e-3)


def test_loss_defaults_are_each_loss_s_hyper_parameters_as_written_in_the_papers_settings():
    """Written out: the defaults the losses' docstrings and the reference settings give."""
    from memvir.losses import loss_defaults

    assert loss_defaults("norm-softmax") == {"scale": 23.0}
    assert loss_defaults("cosface") == {"scale": 64.0, "margin": 0.35}
    assert loss_defaults("proxy-anchor") == {"margin": 0.1, "alpha": 32.0}
    assert loss_defaults("softmax") == {}
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        loss_defaults("nope")
