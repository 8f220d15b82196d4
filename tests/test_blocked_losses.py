"""The losses' blocked computation (``live=(B, C)``, memvir.losses "Blocks") against the plain one written here: the
whole batch concatenated, the full (k+1)B x (k+1)C logit matrix, F.cross_entropy or the Proxy-Anchor formula, as
every loss computed before the blocks. Loss, gradients of the live embeddings and weights and CurricularFace's t must
agree to 1e-10 in float64, for every loss, both reductions, MemVir's labels and the Trainer's "seen" control, with
stored sets smaller than the live batch and chunks smaller than a set; then through a real MemVir and the Trainer;
then with the pairs of stored steps kept between calls ("Cache"), over moving selections and a run with live changes
of N and M, a change of the loss's settings and a resume, where no kept pair may be served stale.
"""

import copy
import io
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

from memvir import MemVir, build_loss
from memvir.losses import LOSSES
from memvir.memory.virtual_classes import AugmentedBatch, LiveBlock, StoredSets

NUM_CLASSES, BATCH, DIM = 5, 6, 4
STORED_SET_SIZES = (6, 4, 2)  # MemVir stores batches of any size: stored sets may be smaller than the live one
EXACT = dict(rtol=1e-10, atol=1e-10)
T_BEFORE = torch.tensor(0.3).item()  # CurricularFace's t before the call, as its float32 buffer holds it


# ----------------------------------------------------------------------------------------------------------------
# The plain computation: everything concatenated, the whole logit matrix
# ----------------------------------------------------------------------------------------------------------------


def plain_logits(name, embeddings, labels, class_weights, t):
    """[R, K] every row's logits over every class, each target carrying its margin (the losses' own formulas)."""
    if name == "softmax":
        return embeddings @ class_weights.T
    cosines = F.normalize(embeddings, dim=1) @ F.normalize(class_weights, dim=1).T
    target = cosines[torch.arange(len(labels)), labels]
    is_target = F.one_hot(labels, cosines.shape[1]).bool()
    if name == "norm-softmax":
        return 23.0 * cosines
    if name == "proxy-nca":
        differences = F.normalize(embeddings, dim=1)[:, None] - F.normalize(class_weights, dim=1)[None]
        return -12.0 * (differences * differences).sum(-1)
    if name == "cosface":
        return 64.0 * torch.where(is_target, cosines - 0.35, cosines)
    margin = 0.5
    theta = torch.acos(target)
    fallback = target - math.sin(math.pi - margin) * margin
    arc = torch.where(theta + margin <= math.pi, torch.cos(theta + margin), fallback)
    if name == "arcface":
        return 64.0 * torch.where(is_target, arc[:, None], cosines)
    assert name == "curricularface"
    hard = cosines > torch.cos(theta.detach() + margin)[:, None]
    others = torch.where(hard, cosines * (t + cosines), cosines)
    return 64.0 * torch.where(is_target, arc[:, None], others)


def plain_proxy_anchor(embeddings, labels, class_weights, classes_per_set, margin=0.1, alpha=32.0):
    cosines = F.normalize(embeddings, dim=1) @ F.normalize(class_weights, dim=1).T
    positive = F.one_hot(labels, cosines.shape[1]).bool()
    pull = torch.log1p(torch.where(positive, torch.exp(-alpha * (cosines - margin)), 0.0).sum(0))
    push = torch.log1p(torch.where(positive, 0.0, torch.exp(alpha * (cosines + margin))).sum(0))
    has_positives = positive.any(0)
    if classes_per_set is None:
        return pull.sum() / has_positives.sum() + push.sum() / len(push)
    total = 0.0
    for first in range(0, len(push), classes_per_set):
        proxies = slice(first, first + classes_per_set)
        total = total + pull[proxies].sum() / has_positives[proxies].sum() + push[proxies].mean()
    return total


def plain_loss(name, embeddings, labels, class_weights, classes_per_set=None, t_before=0.0, training=True,
               scale_factor=1.0):
    """(loss, CurricularFace's t after the call, None for the other losses) on the concatenated inputs; the losses'
    default scale (alpha for Proxy-Anchor) times ``scale_factor``."""
    if name == "proxy-anchor":
        return plain_proxy_anchor(embeddings, labels, class_weights, classes_per_set, alpha=32.0 * scale_factor), None
    t = t_before if name == "curricularface" else None
    if name == "curricularface" and training:
        with torch.no_grad():
            target = (F.normalize(embeddings, dim=1) * F.normalize(class_weights, dim=1)[labels]).sum(1)
        t = float(torch.tensor(0.01 * target.mean().item() + 0.99 * t_before).float())  # the buffer is float32
    logits = plain_logits(name, embeddings, labels, class_weights, t) * (1.0 if name == "softmax" else scale_factor)
    per_row = F.cross_entropy(logits, labels, reduction="none")
    if classes_per_set is None:
        return per_row.mean(), t
    sets = labels // classes_per_set
    return sum(per_row[sets == j].mean() for j in sets.unique()), t


# ----------------------------------------------------------------------------------------------------------------
# Inputs shaped like MemVir's output
# ----------------------------------------------------------------------------------------------------------------


def augmented_inputs(seed, virtual_sets, labels_mode="virtual"):
    """Live leaves (x [B, D], W [C, D]) that take gradients, and the concatenated (embeddings, labels, weights, live)
    a loss sees: k stored sets of STORED_SET_SIZES rows, detached, labels y + jC (or y under "seen", against the
    live weights alone)."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def labels(rows):
        return torch.randint(0, NUM_CLASSES, (rows,), generator=generator)

    x, w = randn(BATCH, DIM).requires_grad_(), randn(NUM_CLASSES, DIM).requires_grad_()
    sizes = STORED_SET_SIZES[:virtual_sets]
    stored_x = [randn(size, DIM) for size in sizes]
    stored_w = [randn(NUM_CLASSES, DIM) for _ in sizes]
    label_parts = [labels(BATCH)] + [labels(size) + j * NUM_CLASSES for j, size in enumerate(sizes, 1)]
    all_labels = torch.cat(label_parts)
    if labels_mode == "seen":
        return x, w, (torch.cat([x, *stored_x]), all_labels % NUM_CLASSES, w, (BATCH, NUM_CLASSES))
    return x, w, (torch.cat([x, *stored_x]), all_labels, torch.cat([w, *stored_w]), (BATCH, NUM_CLASSES))


def value_and_grads(loss, leaves):
    return (loss.detach(), *torch.autograd.grad(loss, leaves, retain_graph=True))


def assert_all_close(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **EXACT)


def blocked_loss(name, chunk_rows):
    loss = build_loss(name)
    loss.chunk_rows = chunk_rows
    if name == "curricularface":
        loss.t.fill_(T_BEFORE)
    return loss


def check_against_plain(name, x, w, inputs, classes_per_set, chunk_rows, use_live=True):
    embeddings, labels, weights, live = inputs
    loss = blocked_loss(name, chunk_rows)
    options = {"live": live} if use_live else {}
    blocked = value_and_grads(loss(embeddings, labels, weights, classes_per_set, **options), (x, w))
    value, t = plain_loss(name, embeddings, labels, weights, classes_per_set, t_before=T_BEFORE)
    assert_all_close(blocked, value_and_grads(value, (x, w)))
    if t is not None:
        assert loss.t.item() == pytest.approx(t, abs=1e-10)


# ----------------------------------------------------------------------------------------------------------------
# Blocked == plain
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_rows", [1, 5, 256])
@pytest.mark.parametrize("reduction", ["official", "balanced"])
@pytest.mark.parametrize("virtual_sets", [0, 1, 3])
@pytest.mark.parametrize("name", LOSSES)
def test_blocked_equals_plain_with_virtual_labels(name, virtual_sets, reduction, chunk_rows):
    x, w, inputs = augmented_inputs(virtual_sets * 10 + len(name), virtual_sets)
    classes_per_set = NUM_CLASSES if reduction == "balanced" else None
    check_against_plain(name, x, w, inputs, classes_per_set, chunk_rows)


@pytest.mark.parametrize("virtual_sets", [1, 3])
@pytest.mark.parametrize("name", LOSSES)
def test_blocked_equals_plain_under_the_seen_control(name, virtual_sets):
    """Seen labels y against the live weights only: no stored class, the stored rows' targets are live columns."""
    x, w, inputs = augmented_inputs(virtual_sets + 100, virtual_sets, labels_mode="seen")
    assert inputs[2] is w and int(inputs[1].max()) < NUM_CLASSES
    check_against_plain(name, x, w, inputs, None, chunk_rows=3)


@pytest.mark.parametrize("name", LOSSES)
def test_a_plain_call_is_the_plain_computation(name):
    """Without ``live`` everything is one live block: the stored parts, if they took gradients, would get them."""
    x, w, inputs = augmented_inputs(7, 3)
    check_against_plain(name, x, w, inputs, None, chunk_rows=2, use_live=False)


@pytest.mark.parametrize("training", [True, False])
def test_curricularface_in_eval_mode_keeps_t_and_uses_it(training):
    x, w, (embeddings, labels, weights, live) = augmented_inputs(3, 3)
    loss = blocked_loss("curricularface", chunk_rows=2).train(training)
    blocked = value_and_grads(loss(embeddings, labels, weights, live=live), (x, w))
    value, t = plain_loss("curricularface", embeddings, labels, weights, t_before=T_BEFORE, training=training)
    assert_all_close(blocked, value_and_grads(value, (x, w)))
    assert loss.t.item() == pytest.approx(t, abs=1e-10) and (training or t == T_BEFORE)


def test_curricularface_has_hard_negatives_among_the_stored_rows_live_columns():
    """The check above means something for the stored x live block: some stored row finds a live class hard."""
    _, _, (embeddings, labels, weights, _) = augmented_inputs(3, 3)
    cosines = F.normalize(embeddings, dim=1) @ F.normalize(weights, dim=1).T
    target = cosines[torch.arange(len(labels)), labels]
    hard = cosines > torch.cos(torch.acos(target) + 0.5)[:, None]
    assert hard[BATCH:, :NUM_CLASSES].any() and hard[BATCH:, NUM_CLASSES:].any()


@pytest.mark.parametrize("live", [(0, 5), (8, 5), (6, 0), (6, 21), (6.0, 5), (6,), "6,5", (True, 5)])
def test_live_must_be_two_counts_within_the_inputs(live):
    _, _, (embeddings, labels, weights, _) = augmented_inputs(1, 1)
    with pytest.raises(ValueError, match=r"live must be \(live rows, live classes\)"):
        build_loss("norm-softmax")(embeddings[:7], labels[:7], weights, live=live)


# ----------------------------------------------------------------------------------------------------------------
# Through MemVir and the Trainer
# ----------------------------------------------------------------------------------------------------------------


def test_memvir_returns_a_three_tuple_that_says_its_live_block():
    mv = MemVir(2, 0, live_pairs=True)
    generator = torch.Generator().manual_seed(0)
    for batch, expected_rows in ((4, 4), (3, 7), (5, 12)):
        x, y, w = torch.randn(batch, DIM, generator=generator), torch.arange(batch) % 3, torch.randn(3, DIM)
        out = mv(x, y, w)
        embeddings, labels, weights = out
        assert isinstance(out, tuple) and len(out) == 3 and out[0] is embeddings and out[-1] is weights
        assert embeddings.shape[0] == expected_rows and out.live == (batch, 3)
        assert (out.num_live_rows, out.num_live_classes) == (batch, 3)
        assert weights.shape[0] == 3 * (mv.num_virtual_sets + 1)
        assert out == (embeddings, labels, weights)
        for twin in (copy.copy(out), pickle.loads(pickle.dumps(out))):
            assert isinstance(twin, AugmentedBatch) and twin.live == out.live and len(twin) == 3
            assert torch.equal(twin[0], embeddings) and torch.equal(twin[2], weights)
            assert twin.stored_sets == out.stored_sets and twin.live.stored_sets == out.stored_sets
        live = pickle.loads(pickle.dumps(out.live))
        assert isinstance(live, LiveBlock) and live == (batch, 3) and live.stored_sets == out.stored_sets
    # the virtual sets named by the calls that stored them (steps 1 and 0 at call 2), with their row counts, and the
    # step this call's live inputs are stored as (2: the memory keeps their dtype, so their values), and the call's
    assert out.stored_sets[1:] == ((1, 0), (3, 4), 0, 2, 2)
    # a memory of another dtype keeps other values: no live step is named
    half = MemVir(1, 0, store_dtype=torch.float16, live_pairs=True)
    for _ in range(2):
        out = half(x, y, w)
    assert out.stored_sets.steps == (0,) and out.stored_sets.live_step is None


@pytest.mark.parametrize("check_values", [True, False])
@pytest.mark.parametrize("name", LOSSES)
def test_the_loss_takes_memvirs_live_inputs_not_a_slice_of_its_output(name, check_values):
    """Given MemVir's output as it is and its own ``live``, a loss takes the live rows and weight rows from MemVir's
    inputs: no gradient reaches the concatenated output (autograd writes none as large as it, zeros in the memory's
    part), and the inputs' gradients are the plain ones, whether MemVir checked the live labels (then no target is
    looked for among the stored classes) or not. An output changed in place after the call is sliced, as any other
    input, and the gradient reaches the inputs through it."""
    mv = MemVir(2, 0, check_values=check_values)
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):
        x = torch.randn(BATCH, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        out = mv(x, torch.randint(0, NUM_CLASSES, (BATCH,), generator=generator), w)
    embeddings, labels, weights = out
    assert mv.num_virtual_sets == 2
    loss = blocked_loss(name, chunk_rows=2)
    value = loss(*out, live=out.live)
    assert torch.autograd.grad(value, (embeddings, weights), retain_graph=True, allow_unused=True) == (None, None)
    plain = plain_loss(name, *out, t_before=T_BEFORE)[0]
    assert_all_close(value_and_grads(value, (x, w)), value_and_grads(plain, (x, w)))
    embeddings.mul_(0.5)  # changed after the call: no longer the rows MemVir stored
    changed = blocked_loss(name, chunk_rows=2)(*out, live=out.live)
    (through_output,) = torch.autograd.grad(changed, (embeddings,), retain_graph=True)
    assert through_output[:BATCH].abs().max() > 0
    plain = plain_loss(name, *out, t_before=T_BEFORE)[0]
    assert_all_close(value_and_grads(changed, (x, w)), value_and_grads(plain, (x, w)))


@pytest.mark.parametrize("name", ["norm-softmax", "proxy-anchor"])
@pytest.mark.parametrize("parts", [1, 2])
def test_a_call_leaves_no_reference_cycle_holding_the_output(name, parts):
    """Once the caller drops MemVir's output and the loss, nothing of the call holds the concatenated tensors, without
    Python's cycle collector: a cycle through the call's blocks kept every step's output alive until it ran."""
    import gc

    from memvir.losses import _Blocks

    mv = MemVir(2, 0)
    loss = blocked_loss(name, chunk_rows=2)
    generator = torch.Generator().manual_seed(3)
    gc.collect()
    gc.disable()
    try:
        for _ in range(4):
            x = torch.randn(BATCH, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
            w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
            out = mv(x, torch.randint(0, NUM_CLASSES, (BATCH,), generator=generator), w)
            loss(*out, live=out.live, share=(0, parts) if parts > 1 else None).backward()
            del out
            # the blocks hold views of the output's tensors (its stored weights, the normalised rows)
            assert not [item for item in gc.get_objects() if type(item) is _Blocks]
    finally:
        gc.enable()


@pytest.mark.parametrize("store_dtype", [None, torch.float32])
@pytest.mark.parametrize("name", LOSSES)
def test_blocked_equals_plain_through_memvir_as_k_grows(name, store_dtype):
    """A real MemVir(3, 0) over steps of different batch sizes (k = 0, 1, 2, 3, 3, 3); a float32 memory under
    float64 inputs takes MemVir's other concatenation (a copy into one tensor)."""
    mv = MemVir(3, 0, store_dtype=store_dtype)
    generator = torch.Generator().manual_seed(len(name))
    losses = {reduction: blocked_loss(name, chunk_rows=2) for reduction in ("official", "balanced")}
    for step, batch in enumerate((6, 4, 6, 3, 2, 6)):
        x = torch.randn(batch, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        y = torch.randint(0, NUM_CLASSES, (batch,), generator=generator)
        out = mv(x, y, w)
        assert mv.num_virtual_sets == min(step, 3) and out.live == (batch, NUM_CLASSES)
        for reduction, loss in losses.items():
            classes_per_set = NUM_CLASSES if reduction == "balanced" else None
            t_before = loss.t.item() if name == "curricularface" else 0.0
            blocked = value_and_grads(loss(*out, classes_per_set, live=out.live), (x, w))
            value, t = plain_loss(name, *out, classes_per_set, t_before=t_before)
            assert_all_close(blocked, value_and_grads(value, (x, w)))
            if t is not None:
                assert loss.t.item() == pytest.approx(t, abs=1e-10)


@pytest.mark.parametrize("loss,reduction,labels_mode", [
    ("norm-softmax", "official", "virtual"),
    ("proxy-anchor", "balanced", "virtual"),
    ("cosface", "official", "seen"),
])
def test_the_trainer_passes_the_live_block_and_computes_the_plain_loss(loss, reduction, labels_mode):
    """The Trainer's own steps (glyphs-mini, MemVir(2, 0), no warm-up): once the memory adds rows it passes live =
    (B, C), and the loss it trains on is the plain loss of the same inputs; each recorded call again in float64,
    blocked against plain, value and the live rows' and weights' gradients."""
    from memvir import TrainConfig
    from memvir.train.trainer import Trainer

    config = TrainConfig(dataset="glyphs-mini", batch_size=32, epochs=1, max_steps=3, loss=loss, memvir_n=2,
                         memvir_m=0, warmup_epochs=0, memvir_reduction=reduction, memvir_labels=labels_mode,
                         snapshot_every=0, eval_every=0, eval_at_start=False, log_every=1, checkpoint_every=1000)
    trainer = Trainer(config)
    calls, loss_fn = [], trainer.loss_fn

    def record(x, y, w, *rest, **options):
        value = loss_fn(x, y, w, *rest, **options)
        calls.append((x.detach().double(), y, w.detach().double(), options, value.detach().double()))
        return value

    trainer.loss_fn = record
    trainer.run()
    assert [call[3].get("live") for call in calls] == [None, (32, 24), (32, 24)]
    # MemVir's own live, naming its stored steps, where the loss sees MemVir's output; a plain one for the control's
    assert [getattr(call[3]["live"], "stored_sets", None) is not None for call in calls[1:]] == [
        labels_mode == "virtual"] * 2
    classes_per_set = 24 if reduction == "balanced" else None
    assert all(call[3].get("classes_per_set") == classes_per_set for call in calls)
    for sets, (x, y, w, options, trained_value) in enumerate(calls[1:], 2):  # k = 1, then 2
        assert x.shape[0] == 32 * sets and w.shape[0] == (24 if labels_mode == "seen" else 24 * sets)
        live_x, live_w = x[:32].clone().requires_grad_(), w[:24].clone().requires_grad_()
        embeddings, weights = torch.cat([live_x, x[32:]]), torch.cat([live_w, w[24:]])
        blocked = value_and_grads(build_loss(loss)(embeddings, y, weights, **options), (live_x, live_w))
        value, _ = plain_loss(loss, embeddings, y, weights, classes_per_set)
        assert_all_close(blocked, value_and_grads(value, (live_x, live_w)))
        torch.testing.assert_close(trained_value, value.detach(), rtol=1e-5, atol=1e-5)  # the step's float32


# ----------------------------------------------------------------------------------------------------------------
# Kept pairs (memvir.losses, "Cache"): what one pair of stored steps gives, kept between calls
# ----------------------------------------------------------------------------------------------------------------

KEEPS_PAIRS = [name for name in LOSSES if name != "curricularface"]


def live_naming(steps, sizes, memory="memory-a", oldest=0):
    """A ``live`` as MemVir's output carries it: (B, C) and which stored steps the virtual sets are."""
    return LiveBlock(BATCH, NUM_CLASSES, StoredSets(memory, tuple(steps), tuple(sizes), oldest) if steps else None)


def moved_inputs(seed, virtual_sets, previous):
    """The next call of a MemVir with M = 0 after ``previous`` (augmented_inputs' stored sets, or this function's):
    a new live batch, its old live batch's step as set 1, its sets 1..k-1 as sets 2..k, the steps numbered so."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, DIM, generator=generator, dtype=torch.float64).requires_grad_()
    w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=torch.float64).requires_grad_()
    y = torch.randint(0, NUM_CLASSES, (BATCH,), generator=generator)
    old_x, old_y, old_w, old_sets = previous
    stored_x = [old_x.detach(), *old_sets[0]][:virtual_sets]
    stored_y = [old_y, *old_sets[1]][:virtual_sets]
    stored_w = [old_w.detach(), *old_sets[2]][:virtual_sets]
    labels = torch.cat([y] + [labels + j * NUM_CLASSES for j, labels in enumerate(stored_y, 1)])
    inputs = (torch.cat([x, *stored_x]), labels, torch.cat([w, *stored_w]))
    return x, w, y, inputs, (stored_x, stored_y, stored_w)


@pytest.mark.parametrize("chunk_rows", [1, 5, 256])
@pytest.mark.parametrize("reduction", ["official", "balanced"])
@pytest.mark.parametrize("virtual_sets", [0, 1, 3])
@pytest.mark.parametrize("name", LOSSES)
def test_kept_pairs_equal_plain_when_served_and_when_the_selection_moves(name, virtual_sets, reduction, chunk_rows):
    """The same augmented batch three times (every pair computed, then every pair served), then the next call of a
    MemVir with M = 0 (a new step as set 1, the others one set further): only its 2k-1 new pairs are computed.
    Stored sets of 6, 4 and 2 rows, chunks down to one row; each call against the plain computation."""
    classes_per_set = NUM_CLASSES if reduction == "balanced" else None
    loss = blocked_loss(name, chunk_rows)
    keeps = name in KEEPS_PAIRS and virtual_sets > 0
    x, w, (embeddings, labels, weights, _) = augmented_inputs(virtual_sets * 10 + len(name), virtual_sets)
    sizes = STORED_SET_SIZES[:virtual_sets]
    steps = [100 - j for j in range(1, virtual_sets + 1)]
    for call in range(3):
        t_before = loss.t.item() if name == "curricularface" else 0.0
        live = live_naming(steps, sizes, oldest=90)
        blocked = value_and_grads(loss(embeddings, labels, weights, classes_per_set, live=live), (x, w))
        value, t = plain_loss(name, embeddings, labels, weights, classes_per_set, t_before=t_before)
        assert_all_close(blocked, value_and_grads(value, (x, w)))
        assert loss._stored_pairs.computed == (virtual_sets**2 if keeps and call == 0 else 0)
    stored = [embeddings[BATCH:].split(sizes), (labels[BATCH:] % NUM_CLASSES).split(sizes),
              weights[NUM_CLASSES:].split(NUM_CLASSES)]
    previous = (x, labels[:BATCH], w, stored)
    new_x, new_w, _, (embeddings, labels, weights), _ = moved_inputs(5, virtual_sets, previous)
    t_before = loss.t.item() if name == "curricularface" else 0.0
    live = live_naming([100] + steps[:-1], ([BATCH] + list(sizes))[:virtual_sets], oldest=91)
    blocked = value_and_grads(loss(embeddings, labels, weights, classes_per_set, live=live), (new_x, new_w))
    value, _ = plain_loss(name, embeddings, labels, weights, classes_per_set, t_before=t_before)
    assert_all_close(blocked, value_and_grads(value, (new_x, new_w)))
    assert loss._stored_pairs.computed == (2 * virtual_sets - 1 if keeps else 0)


@pytest.mark.parametrize("name", LOSSES)
def test_the_seen_control_uses_no_kept_pair(name):
    """Seen labels against the live weights, even given MemVir's own ``live``: no stored class, nothing to keep."""
    x, w, (embeddings, labels, weights, _) = augmented_inputs(103, 3, labels_mode="seen")
    loss = blocked_loss(name, chunk_rows=3)
    live = live_naming([9, 8, 7], STORED_SET_SIZES)
    blocked = value_and_grads(loss(embeddings, labels, weights, live=live), (x, w))
    assert_all_close(blocked, value_and_grads(plain_loss(name, embeddings, labels, weights, t_before=T_BEFORE)[0],
                                              (x, w)))
    assert loss._stored_pairs.computed == 0 and not loss._stored_pairs.values


@pytest.mark.parametrize("change", ["labels", "rows", "steps"])
def test_a_live_that_names_other_inputs_is_refused(change):
    """MemVir's ``live`` with inputs that are not its output (seen labels beside the stored weights, other set sizes,
    another number of sets): a ValueError that says to pass a plain (rows, classes)."""
    _, _, (embeddings, labels, weights, _) = augmented_inputs(4, 3)
    steps, sizes = [9, 8, 7], list(STORED_SET_SIZES)
    if change == "labels":
        labels = labels % NUM_CLASSES
    elif change == "rows":
        sizes = [5, 5, 2]
    else:
        steps, sizes = steps[:2], sizes[:2]
    with pytest.raises(ValueError, match=r"live names MemVir's stored sets .* plain \(rows, classes\)"):
        build_loss("norm-softmax")(embeddings, labels, weights, live=live_naming(steps, sizes))


def run_with_changes(name, reduction, labels_mode):
    """A real MemVir(3, 1) over 40 steps of batches of 6, 4 or 3 rows, more than 2N(M+1) = 16: N 3 -> 2 at step 12,
    M 1 -> 2 at step 18, the state of step 24 saved, the loss's settings changed at step 28, the step-24 state
    resumed at step 32 and the run continued on other batches (the same step numbers, other contents). At every step
    the loss, kept from call to call, against the plain computation; returns each step's (k, blocks computed)."""
    mv = MemVir(3, 1, live_pairs=True)
    generator = torch.Generator().manual_seed(len(name))
    loss = blocked_loss(name, chunk_rows=2)
    classes_per_set = NUM_CLASSES if reduction == "balanced" else None
    record, saved, scale_factor = [], None, 1.0
    for step in range(40):
        if step == 12:
            mv.set_hparams(num_steps=2)
        if step == 18:
            mv.set_hparams(margin=2)
        if step == 24:
            saved = copy.deepcopy(mv.state_dict())
        if step == 28:
            hyper_parameter = "alpha" if name == "proxy-anchor" else "scale"
            if hasattr(loss, hyper_parameter):
                setattr(loss, hyper_parameter, getattr(loss, hyper_parameter) * 0.5)
                scale_factor = 0.5
        if step == 32:
            mv.load_state_dict(saved)
            generator.manual_seed(1000 + len(name))
        batch = (6, 4, 3)[step % 3]
        x = torch.randn(batch, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        out = mv(x, torch.randint(0, NUM_CLASSES, (batch,), generator=generator), w)
        embeddings, labels, weights = out
        if labels_mode == "seen":
            labels, weights = labels % NUM_CLASSES, w
        t_before = loss.t.item() if name == "curricularface" else 0.0
        blocked = value_and_grads(loss(embeddings, labels, weights, classes_per_set, live=out.live), (x, w))
        value, t = plain_loss(name, embeddings, labels, weights, classes_per_set, t_before=t_before,
                              scale_factor=scale_factor)
        assert_all_close(blocked, value_and_grads(value, (x, w)))
        if t is not None:
            assert loss.t.item() == pytest.approx(t, abs=1e-10)
        record.append((mv.num_virtual_sets, loss._stored_pairs.computed))
    return record


@pytest.mark.parametrize("labels_mode", ["virtual", "seen"])
@pytest.mark.parametrize("reduction", ["official", "balanced"])
@pytest.mark.parametrize("name", LOSSES)
def test_kept_pairs_over_a_run_with_live_changes_and_a_resume(name, reduction, labels_mode):
    """Equal to plain at every step of run_with_changes; the kept pairs are used (2k-1 blocks once a pair recurs)
    and none is served stale: each change of N, M, the loss's settings and the resume computes every pair again."""
    record = run_with_changes(name, reduction, labels_mode)
    if name not in KEEPS_PAIRS or labels_mode == "seen":
        assert all(computed == 0 for _, computed in record)
        return
    sets = [k for k, _ in record]
    computed = [blocks for _, blocks in record]
    assert max(sets) == 3 and sets[11] == 3 and sets[39] == 2
    # before the first change, once every selected step was a live step of this memory, its pairs were kept from
    # its live blocks: no stored block is computed
    assert computed[11] == 0 and computed[10] == 0
    # every change makes the next call with virtual sets compute all of its pairs (Softmax has no setting to change)
    for step in (12, 18, 32) if name == "softmax" else (12, 18, 28, 32):
        first = next(s for s in range(step, 40) if sets[s])
        assert computed[first] == sets[first] ** 2, (step, record)
    assert computed[39] == 0


def saved_and_read(state):
    """``state`` through a file as a checkpoint holds it (torch.save, then torch.load with weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def kept_pairs_run(name, steps, dtype, start=0, mv=None, loss=None, save_at=None):
    """A MemVir(2, 1, live_pairs=True) and ``name`` over calls ``start``..``steps``-1, batches of 6 or 4 rows drawn
    from a generator seeded by the call's number (so a resumed run sees the uninterrupted run's batches); returns
    [(value, dx, dw, blocks computed)] per call and the states of both (through a file) before call ``save_at``."""
    mv = mv if mv is not None else MemVir(2, 1, live_pairs=True)
    loss = loss if loss is not None else blocked_loss(name, chunk_rows=3)
    record, saved = [], None
    for step in range(start, steps):
        if step == save_at:
            saved = saved_and_read({"memvir": mv.state_dict(), "loss": loss.state_dict()})
        generator = torch.Generator().manual_seed(step)
        batch = (6, 4)[step % 2]
        x = torch.randn(batch, DIM, generator=generator, dtype=dtype, requires_grad=True)
        w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=dtype, requires_grad=True)
        out = mv(x, torch.randint(0, NUM_CLASSES, (batch,), generator=generator), w)
        record.append((*value_and_grads(loss(*out, live=out.live), (x, w)), loss._stored_pairs.computed))
    return record, saved


@pytest.mark.parametrize("name", KEEPS_PAIRS)
def test_a_loss_and_memory_resumed_from_their_states_reproduce_the_run_bit_for_bit(name):
    """float32, pairs kept from the live blocks (equal to the stored computation to float32's last digits only):
    a new MemVir and a new loss given the states saved at call 9 (through a file, as a checkpoint) compute calls 9-19
    exactly as the uninterrupted pair did, and compute no stored block at the first resumed call, as it did not."""
    straight, saved = kept_pairs_run(name, 20, torch.float32, save_at=9)
    mv, loss = MemVir(2, 1, live_pairs=True), blocked_loss(name, chunk_rows=3)
    mv.load_state_dict(saved["memvir"])
    loss.load_state_dict(saved["loss"])
    resumed, _ = kept_pairs_run(name, 20, torch.float32, start=9, mv=mv, loss=loss)
    assert straight[9][3] == resumed[0][3] == 0
    for call, (expected, actual) in enumerate(zip(straight[9:], resumed, strict=True), 9):
        for e, a in zip(expected[:3], actual[:3], strict=True):
            assert torch.equal(e, a), call
    # a loss without the saved pairs (a state from before they were saved) computes them again from the memory
    loss = blocked_loss(name, chunk_rows=3)
    old_state = {key: value for key, value in saved["loss"].items() if key != "_extra_state"}
    loss.load_state_dict(old_state)
    mv.load_state_dict(saved["memvir"])
    again, _ = kept_pairs_run(name, 10, torch.float32, start=9, mv=mv, loss=loss)
    assert again[0][3] == 4


@pytest.mark.parametrize("live_pairs", [False, True])
@pytest.mark.parametrize("name", ["norm-softmax", "proxy-anchor"])
def test_a_memory_loaded_from_an_earlier_state_gets_no_pair_of_its_later_steps(name, live_pairs):
    """The state of call 10 loaded into the same MemVir at call 15, with the loss kept: the memory keeps its identity,
    and calls 10-14 are stored again with other contents; the pairs the loss kept of the first calls 10-14 (call 12
    selected step 10) must not be served: every call equals the plain computation (float64)."""
    mv, loss = MemVir(2, 1, live_pairs=live_pairs), blocked_loss(name, chunk_rows=3)
    _, saved = kept_pairs_run(name, 15, torch.float64, mv=mv, loss=loss, save_at=10)
    mv.load_state_dict(saved["memvir"])
    generator = torch.Generator().manual_seed(99)
    for _ in range(6):
        x = torch.randn(5, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
        out = mv(x, torch.randint(0, NUM_CLASSES, (5,), generator=generator), w)
        assert_all_close(value_and_grads(loss(*out, live=out.live), (x, w)),
                         value_and_grads(plain_loss(name, *out)[0], (x, w)))


def test_a_damaged_kept_pairs_state_is_refused_and_changes_nothing():
    loss = build_loss("norm-softmax")
    with pytest.raises(ValueError, match="kept pairs in a form this version does not read"):
        loss.load_state_dict({"_extra_state": {"version": 1, "memory": 3}})
    assert loss.state_dict()["_extra_state"] is None


# ----------------------------------------------------------------------------------------------------------------
# Shares (memvir.losses, "Shares"): the rows split over the ranks of a torchrun run
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels_mode,reduction", [("virtual", "official"), ("virtual", "balanced"),
                                                   ("seen", "official")])
@pytest.mark.parametrize("name", LOSSES)
def test_the_shares_of_a_loss_sum_to_the_plain_loss(name, reduction, labels_mode):
    """Parts 0..G-1 of G = 2 and 3, each its own loss (a rank's, keeping its own pairs), through a real MemVir(3, 1)
    over 14 steps of batches of 6, 4 and 3 rows (sets of fewer rows than parts among them): at every step the
    shares' values and gradients summed equal the plain computation, and CurricularFace's t is the plain one in
    every part. The pairs are kept (and served) in every part."""
    classes_per_set = NUM_CLASSES if reduction == "balanced" else None
    for parts in (2, 3):
        mv = MemVir(3, 1, live_pairs=True)
        generator = torch.Generator().manual_seed(len(name) + parts)
        losses = [blocked_loss(name, chunk_rows=2) for _ in range(parts)]
        for step in range(14):
            batch = (6, 4, 3)[step % 3]
            x = torch.randn(batch, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
            w = torch.randn(NUM_CLASSES, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
            out = mv(x, torch.randint(0, NUM_CLASSES, (batch,), generator=generator), w)
            embeddings, labels, weights = out
            if labels_mode == "seen":
                labels, weights = labels % NUM_CLASSES, w
            t_before = losses[0].t.item() if name == "curricularface" else 0.0
            shares = [value_and_grads(loss(embeddings, labels, weights, classes_per_set, live=out.live,
                                           share=(part, parts)), (x, w)) for part, loss in enumerate(losses)]
            value, t = plain_loss(name, embeddings, labels, weights, classes_per_set, t_before=t_before)
            assert_all_close([sum(quantity) for quantity in zip(*shares, strict=True)],
                             value_and_grads(value, (x, w)))
            if t is not None:
                assert all(loss.t.item() == pytest.approx(t, abs=1e-10) for loss in losses)
        if name in KEEPS_PAIRS and labels_mode == "virtual":  # every part kept its pairs from its live blocks
            assert all(loss._stored_pairs.computed == 0 for loss in losses)


@pytest.mark.parametrize("name", LOSSES)
def test_a_share_computes_its_piece_only(name):
    """A share of a row-split loss sees its piece of the live rows (6 rows: 2 in each of 3 shares), a share of
    Proxy-Anchor its piece of the live proxies (5 proxies: 1, 2 and 2): no gradient reaches a live row, or a live
    proxy, outside it."""
    x, w, (embeddings, labels, weights, live) = augmented_inputs(11, 3)
    leaf, pieces = (w, (slice(0, 1), slice(1, 3), slice(3, 5))) if name == "proxy-anchor" else (
        x, (slice(0, 2), slice(2, 4), slice(4, 6)))
    for part, piece in enumerate(pieces):
        loss = blocked_loss(name, chunk_rows=2)(embeddings, labels, weights, live=live, share=(part, 3))
        (gradient,) = torch.autograd.grad(loss, leaf)
        outside = torch.ones(leaf.shape[0], dtype=torch.bool)
        outside[piece] = False
        assert gradient[outside].abs().max() == 0 and gradient[piece].abs().amax(1).min() > 0


@pytest.mark.parametrize("share", [(2, 2), (-1, 2), (0, 0), (0.0, 1), (0,), "0,1", (True, 2)])
def test_share_must_be_a_part_of_parts(share):
    _, _, (embeddings, labels, weights, live) = augmented_inputs(1, 1)
    with pytest.raises(ValueError, match=r"share must be \(part, parts\) with 0 <= part < parts"):
        build_loss("norm-softmax")(embeddings, labels, weights, live=live, share=share)
