"""memvir.integrations.pml: PML losses with virtual classes, against hand-written formulas and this project's losses.

The references here are written with plain torch, one textbook formula per loss (angles through acos, explicit
squared distances, per-proxy sums), over a virtual-class set assembled by hand from a list of past steps
(docs/method.md, "Algorithm"); they call neither pytorch-metric-learning nor the wrapper. Between steps the class
weights move by an SGD step, so a stored copy differs from the live weights and a wrapper that reused the live ones
for a virtual set would fail.
"""

import io
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from memvir import MemVir, build_loss
from memvir.integrations.pml import SUPPORTED_LOSSES, MemVirLoss, UnsupportedLossError

NUM_CLASSES, DIM, BATCH = 5, 4, 6
N, M, U = 2, 1, 1  # two virtual sets, one step apart, after one warm-up step
NUM_STEPS = 8  # k reaches 2 at step U + N(M+1) = 5
LEARNING_RATE = 0.5


# ----------------------------------------------------------------------------------------------------------------
# Hand-written references
# ----------------------------------------------------------------------------------------------------------------


class HandMemory:
    """MemVir as docs/method.md states it: every step from the warm-up's end stored, oldest first; step t uses the
    steps t - j(M+1), labels shifted by jC, live rows first."""

    def __init__(self):
        self.steps = []
        self.calls = 0

    def __call__(self, x, y, w):
        t, self.calls = self.calls, self.calls + 1
        if t < U:
            return x, y, w, 0
        c = w.shape[0]
        k = min(N, len(self.steps) // (M + 1))
        xs, ys, ws = [x], [y], [w]
        for j in range(1, k + 1):
            past_x, past_y, past_w = self.steps[-j * (M + 1)]
            xs, ys, ws = xs + [past_x], ys + [past_y + j * c], ws + [past_w]
        self.steps = (self.steps + [(x.detach().clone(), y.clone(), w.detach().clone())])[-N * (M + 1):]
        return torch.cat(xs), torch.cat(ys), torch.cat(ws), k


def unit(v):
    return v / torch.sqrt((v * v).sum(-1, keepdim=True))


def cosines(x, w):
    return unit(x) @ unit(w).T


def cross_entropy(logits, y):
    """mean over rows of log sum_j exp(z_ij) - z_iy."""
    return (torch.log(torch.exp(logits).sum(1)) - logits[torch.arange(len(y)), y]).mean()


def with_target(logits, y, targets):
    out = logits.clone()
    out[torch.arange(len(y)), y] = targets
    return out


def ref_norm_softmax(x, y, w, temperature):
    return cross_entropy(cosines(x, w) / temperature, y)


def ref_cosface(x, y, w, scale, margin):
    cos = cosines(x, w)
    return cross_entropy(scale * with_target(cos, y, cos[torch.arange(len(y)), y] - margin), y)


def ref_arcface(x, y, w, scale, margin):
    cos = cosines(x, w)
    theta = torch.acos(cos[torch.arange(len(y)), y])
    # past theta + m = pi the target falls back to cos - m sin(m) (ArcFace's insightface rule)
    fallback = torch.cos(theta) - margin * math.sin(margin)
    target = torch.where(theta + margin <= math.pi, torch.cos(theta + margin), fallback)
    return cross_entropy(scale * with_target(cos, y, target), y)


def psi(theta, m):
    """L-Softmax's target: (-1)^k cos(m theta) - 2k on [k pi / m, (k+1) pi / m] (Liu et al. 2016, eq. 6)."""
    k = torch.floor(theta * m / math.pi)
    return (-1.0) ** k * torch.cos(m * theta) - 2 * k


def ref_large_margin_softmax(x, y, w, margin, scale):
    """logits ||w_j|| ||x|| cos(theta_j), the target's cos replaced by psi(theta_y)."""
    cos = cosines(x, w)
    target = psi(torch.acos(cos[torch.arange(len(y)), y]), margin)
    norms = x.norm(dim=1)[:, None] * w.norm(dim=1)[None, :]
    return cross_entropy(scale * norms * with_target(cos, y, target), y)


def ref_sphereface(x, y, w, margin, scale):
    """As L-Softmax with unit class weights: logits ||x|| cos(theta_j), the target's replaced by psi(theta_y)."""
    cos = cosines(x, w)
    target = psi(torch.acos(cos[torch.arange(len(y)), y]), margin)
    return cross_entropy(scale * x.norm(dim=1)[:, None] * with_target(cos, y, target), y)


def ref_proxy_nca(x, y, w, softmax_scale):
    squared_distances = ((unit(x)[:, None, :] - unit(w)[None, :, :]) ** 2).sum(-1)
    return cross_entropy(-softmax_scale * squared_distances, y)


def ref_proxy_anchor(x, y, w, margin, alpha):
    """1/|P+| sum_{p in P+} log(1 + sum_{x: y=p} e^{-alpha(s - margin)})
    + 1/|P| sum_p log(1 + sum_{x: y!=p} e^{alpha(s + margin)}), one proxy at a time."""
    cos = cosines(x, w)
    pull, push, with_positives = 0.0, 0.0, 0
    for p in range(w.shape[0]):
        positive = y == p
        if positive.any():
            with_positives += 1
            pull = pull + torch.log(1 + torch.exp(-alpha * (cos[positive, p] - margin)).sum())
        push = push + torch.log(1 + torch.exp(alpha * (cos[~positive, p] + margin)).sum())
    return pull / with_positives + push / w.shape[0]


# (PML loss, its hand-written formula, this project's loss at the same hyper-parameters or None)
CASES = {
    "NormalizedSoftmaxLoss": (
        lambda: pml_losses.NormalizedSoftmaxLoss(NUM_CLASSES, DIM, temperature=1 / 23),
        lambda x, y, w: ref_norm_softmax(x, y, w, temperature=1 / 23),
        lambda: build_loss("norm-softmax", scale=23.0),
    ),
    "CosFaceLoss": (
        lambda: pml_losses.CosFaceLoss(NUM_CLASSES, DIM, margin=0.35, scale=64),
        lambda x, y, w: ref_cosface(x, y, w, scale=64, margin=0.35),
        lambda: build_loss("cosface", scale=64.0, margin=0.35),
    ),
    "ArcFaceLoss": (  # PML takes the margin in degrees, this project in radians
        lambda: pml_losses.ArcFaceLoss(NUM_CLASSES, DIM, margin=math.degrees(0.5), scale=64),
        lambda x, y, w: ref_arcface(x, y, w, scale=64, margin=0.5),
        lambda: build_loss("arcface", scale=64.0, margin=0.5),
    ),
    "SphereFaceLoss": (
        lambda: pml_losses.SphereFaceLoss(NUM_CLASSES, DIM, margin=4, scale=1),
        lambda x, y, w: ref_sphereface(x, y, w, margin=4, scale=1),
        None,
    ),
    "LargeMarginSoftmaxLoss": (
        lambda: pml_losses.LargeMarginSoftmaxLoss(NUM_CLASSES, DIM, margin=3, scale=1),
        lambda x, y, w: ref_large_margin_softmax(x, y, w, margin=3, scale=1),
        None,
    ),
    "ProxyNCALoss": (
        lambda: pml_losses.ProxyNCALoss(NUM_CLASSES, DIM, softmax_scale=12),
        lambda x, y, w: ref_proxy_nca(x, y, w, softmax_scale=12),
        lambda: build_loss("proxy-nca", scale=12.0),
    ),
    "ProxyAnchorLoss": (
        lambda: pml_losses.ProxyAnchorLoss(NUM_CLASSES, DIM, margin=0.1, alpha=32),
        lambda x, y, w: ref_proxy_anchor(x, y, w, margin=0.1, alpha=32),
        lambda: build_loss("proxy-anchor", margin=0.1, alpha=32.0),
    ),
}


def class_weights(loss):
    """The PML loss's parameter as [C, D] (W is [D, C], proxies [C, D])."""
    return loss.W.T if hasattr(loss, "W") else loss.proxies


def batches(seed, steps=NUM_STEPS, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(BATCH, DIM, generator=gen, dtype=dtype), torch.randint(0, NUM_CLASSES, (BATCH,), generator=gen))
        for _ in range(steps)
    ]


# ----------------------------------------------------------------------------------------------------------------
# Every supported loss against its formula and this project's loss
# ----------------------------------------------------------------------------------------------------------------


def test_every_supported_loss_has_a_case():
    assert set(CASES) == set(SUPPORTED_LOSSES)


@pytest.mark.parametrize("name", list(CASES))
def test_loss_with_virtual_classes_equals_the_formula_and_sends_gradients_to_the_parameter(name):
    make_pml, formula, _ = CASES[name]
    torch.manual_seed(0)
    pml_loss = make_pml().double()
    wrapper = MemVirLoss(pml_loss, num_steps=N, margin=M, warmup_steps=U)
    parameter = next(pml_loss.parameters())
    reference_parameter = parameter.detach().clone().requires_grad_()
    memory = HandMemory()
    used_sets = []
    for x_data, y in batches(seed=1):
        x = x_data.clone().requires_grad_()
        loss = wrapper(x, y)
        loss.backward()

        x_ref = x_data.clone().requires_grad_()
        live = reference_parameter.T if hasattr(pml_loss, "W") else reference_parameter
        x_all, y_all, w_all, k = memory(x_ref, y, live)
        expected = formula(x_all, y_all, w_all)
        expected.backward()

        assert wrapper.num_virtual_sets == k
        used_sets.append(k)
        torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0
        torch.testing.assert_close(parameter.grad, reference_parameter.grad, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-8, atol=1e-10)
        with torch.no_grad():  # both move by the same SGD step, so stored weights differ from the live ones
            parameter -= LEARNING_RATE * parameter.grad
            reference_parameter -= LEARNING_RATE * reference_parameter.grad
        parameter.grad, reference_parameter.grad = None, None
    assert used_sets == [0, 0, 0, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[2] is not None])
def test_loss_with_virtual_classes_equals_this_projects_loss(name):
    make_pml, _, make_own = CASES[name]
    torch.manual_seed(0)
    pml_loss = make_pml().double()
    wrapper = MemVirLoss(pml_loss, num_steps=N, margin=M, warmup_steps=U)
    own_memvir, own_loss = MemVir(N, M, U), make_own()
    own_weights = class_weights(pml_loss).detach().clone().requires_grad_()  # the Trainer's [C, D] parameter
    parameter = next(pml_loss.parameters())
    for x_data, y in batches(seed=2):
        loss = wrapper(x_data, y)
        own = own_loss(*own_memvir(x_data, y, own_weights))
        torch.testing.assert_close(loss, own, rtol=1e-9, atol=1e-9)
        loss.backward()
        own.backward()
        gradient_as_rows = parameter.grad.T if hasattr(pml_loss, "W") else parameter.grad
        torch.testing.assert_close(gradient_as_rows, own_weights.grad, rtol=1e-7, atol=1e-9)
        with torch.no_grad():
            parameter -= LEARNING_RATE * parameter.grad
            own_weights -= LEARNING_RATE * own_weights.grad
        parameter.grad, own_weights.grad = None, None
    assert wrapper.num_virtual_sets == own_memvir.num_virtual_sets == N


# ----------------------------------------------------------------------------------------------------------------
# What the call leaves behind
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ArcFaceLoss", "ProxyNCALoss", "ProxyAnchorLoss"])
def test_the_class_count_and_the_parameter_are_as_they_were_after_a_call(name):
    pml_loss = CASES[name][0]()
    wrapper = MemVirLoss(pml_loss, num_steps=1, margin=0)
    parameter = next(pml_loss.parameters())
    for x, y in batches(seed=3, steps=3, dtype=torch.float64):  # float64 rows against a float32 parameter
        wrapper(x, y).backward()
    assert wrapper.num_virtual_sets == 1
    assert pml_loss.W is parameter if hasattr(pml_loss, "W") else pml_loss.proxies is parameter
    assert parameter.dtype == parameter.grad.dtype == torch.float32  # PML alone would rewrite it to float64
    assert tuple(class_weights(pml_loss).shape) == (NUM_CLASSES, DIM)
    if name == "ProxyNCALoss":
        assert torch.equal(pml_loss.proxy_labels, torch.arange(NUM_CLASSES))
    else:
        assert pml_loss.num_classes == NUM_CLASSES
    # the memory holds copies: the next step's virtual set is this step's weights, not the parameter itself
    assert wrapper.memvir.memory_bytes() > 0


def test_eval_mode_runs_the_plain_loss_and_leaves_the_memory_alone():
    pml_loss = CASES["NormalizedSoftmaxLoss"][0]().double()
    wrapper = MemVirLoss(pml_loss, num_steps=N, margin=0)
    data = batches(seed=4, steps=3)
    for x, y in data[:2]:
        wrapper(x, y)
    before = (wrapper.memvir.step, wrapper.memvir.num_stored)
    wrapper.eval()
    x, y = data[2]
    loss = wrapper(x, y)
    assert (wrapper.memvir.step, wrapper.memvir.num_stored) == before
    torch.testing.assert_close(loss, ref_norm_softmax(x, y, class_weights(pml_loss).detach(), 1 / 23))


# ----------------------------------------------------------------------------------------------------------------
# Miners
# ----------------------------------------------------------------------------------------------------------------


class RecordingMiner(torch.nn.Module):
    """Names one live row and one row of the first virtual set, and records what it was given."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, embeddings, labels):
        self.seen.append((embeddings.shape[0], int(labels.max())))
        rows = torch.tensor([0, BATCH + 1]) if embeddings.shape[0] > BATCH else torch.tensor([0])
        return rows, rows, rows


def test_a_miner_mines_the_extended_batch():
    pml_loss = CASES["NormalizedSoftmaxLoss"][0]().double()
    miner = RecordingMiner()
    wrapper = MemVirLoss(pml_loss, num_steps=1, margin=0, miner=miner)
    (x0, y0), (x1, y1) = batches(seed=5, steps=2)
    wrapper(x0, y0)
    loss = wrapper(x1, y1)  # the live batch x1, then step 0's rows as the virtual set
    w = class_weights(pml_loss).detach()
    x_all, y_all, w_all = torch.cat([x1, x0]), torch.cat([y1, y0 + NUM_CLASSES]), torch.cat([w, w])
    logits = 23 * cosines(x_all, w_all)
    per_row = torch.log(torch.exp(logits).sum(1)) - logits[torch.arange(2 * BATCH), y_all]
    # PML weighs the rows a miner names by 1, every other row by 0, and MeanReducer divides by all the rows
    torch.testing.assert_close(loss, (per_row[0] + per_row[BATCH + 1]) / (2 * BATCH))
    assert miner.seen[1] == (2 * BATCH, int(y_all.max()))  # the virtual rows and their labels reached the miner


def test_indices_mined_on_the_live_batch_are_refused_with_what_to_do():
    wrapper = MemVirLoss(CASES["NormalizedSoftmaxLoss"][0](), num_steps=1, margin=0)
    x, y = batches(seed=6, steps=1, dtype=torch.float32)[0]
    rows = torch.arange(BATCH)
    with pytest.raises(ValueError, match=r"miner=miner"):
        wrapper(x, y, (rows, rows, rows))
    assert wrapper.memvir.step == 0  # refused before MemVir took a step


# ----------------------------------------------------------------------------------------------------------------
# Resume
# ----------------------------------------------------------------------------------------------------------------


def build_run(seed):
    torch.manual_seed(seed)
    network = torch.nn.Linear(DIM, DIM)
    wrapper = MemVirLoss(pml_losses.ArcFaceLoss(NUM_CLASSES, DIM, margin=28.6, scale=16), num_steps=N, margin=M,
                         warmup_steps=U)
    optimizer = torch.optim.SGD([*network.parameters(), *wrapper.parameters()], lr=0.1, momentum=0.9)
    return network, wrapper, optimizer


def train(run, data):
    network, wrapper, optimizer = run
    losses = []
    for x, y in data:
        optimizer.zero_grad()
        loss = wrapper(network(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def test_a_resumed_run_continues_exactly():
    data = batches(seed=7, steps=10, dtype=torch.float32)
    straight = train(build_run(seed=0), data)

    first = build_run(seed=0)
    before = train(first, data[:5])
    assert first[1].num_virtual_sets == 1 and first[1].memvir.num_stored == N * (M + 1)
    buffer = io.BytesIO()
    torch.save({"network": first[0].state_dict(), "loss": first[1].state_dict(),
                "optimizer": first[2].state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # the memory's state needs no unpickling
    assert any(key.startswith("memvir.") for key in saved["loss"])

    resumed = build_run(seed=1)  # other initial weights, an empty memory: everything must come from the state
    resumed[0].load_state_dict(saved["network"])
    resumed[1].load_state_dict(saved["loss"])
    resumed[2].load_state_dict(saved["optimizer"])
    after = train(resumed, data[5:])
    assert all(torch.equal(a, b) for a, b in zip(before + after, straight, strict=True))

    # the memory is what makes it exact: without it the same weights give other losses once virtual sets are in use
    forgetful = build_run(seed=1)
    forgetful[0].load_state_dict(saved["network"])
    forgetful[1].loss.load_state_dict(first[1].loss.state_dict())
    forgetful[2].load_state_dict(saved["optimizer"])
    assert not torch.equal(train(forgetful, data[5:])[0], straight[5])


# ----------------------------------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------------------------------


class MyArcFace(pml_losses.ArcFaceLoss):
    pass


@pytest.mark.parametrize(("make", "says"), [
    (lambda: pml_losses.SubCenterArcFaceLoss(num_classes=NUM_CLASSES, embedding_size=DIM),
     r"K sub-centres.*use ArcFaceLoss"),
    (lambda: pml_losses.SoftTripleLoss(NUM_CLASSES, DIM), r"K centres.*use NormalizedSoftmaxLoss or ProxyNCALoss"),
    (lambda: pml_losses.TripletMarginLoss(), r"no class weights.*CrossBatchMemory"),
    (lambda: pml_losses.ContrastiveLoss(), r"no class weights.*CrossBatchMemory"),
    (lambda: pml_losses.NCALoss(), r"no class weights.*CrossBatchMemory"),
    (lambda: pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), DIM), r"itself a memory"),
    (lambda: pml_losses.P2SGradLoss(DIM, NUM_CLASSES), r"in place.*use CosFaceLoss"),
    (lambda: MyArcFace(NUM_CLASSES, DIM), r"subclass of ArcFaceLoss.*wrap ArcFaceLoss itself"),
    (lambda: torch.nn.CrossEntropyLoss(), r"got CrossEntropyLoss.*memvir.build_loss"),
])
def test_an_unsupported_loss_is_refused_with_what_to_use_instead(make, says):
    with pytest.raises(UnsupportedLossError, match=says) as caught:
        MemVirLoss(make(), num_steps=1, margin=0)
    assert ", ".join(SUPPORTED_LOSSES) in str(caught.value)


def test_a_reducer_with_a_weight_per_real_class_is_refused():
    from pytorch_metric_learning.reducers import ClassWeightedReducer

    loss = pml_losses.CosFaceLoss(NUM_CLASSES, DIM, reducer=ClassWeightedReducer(torch.ones(NUM_CLASSES)))
    with pytest.raises(UnsupportedLossError, match=r"ClassWeightedReducer.*\[C, \(k\+1\)C\)"):
        MemVirLoss(loss, num_steps=1, margin=0)


def test_memvir_imports_without_pml_and_the_wrapper_says_how_to_install_it():
    script = (
        "import sys; sys.modules['pytorch_metric_learning'] = None\n"  # an import of it now fails
        "import memvir, memvir.integrations.pml as pml\n"
        "memvir.MemVir(1, 0)\n"
        "try:\n"
        "    pml.MemVirLoss(object(), 1, 0)\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    repository = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                         cwd=repository)
    assert "needs pytorch-metric-learning: pip install pytorch-metric-learning==2.9.0" in out.stdout
