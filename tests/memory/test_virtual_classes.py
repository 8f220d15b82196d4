"""MemVir against a brute-force, list-based model of the algorithm (docs/method.md), written here independently."""

import io
import random

import pytest
import torch

from memvir import MemVir


class ReferenceMemVir:
    """docs/method.md "Algorithm" as plainly as it reads: a list of every stored step, trimmed from the front."""

    def __init__(self, n, m, u):
        self.n, self.m, self.u = n, m, u
        self.memory = []  # (x, y, W), oldest first
        self.calls = 0

    def set(self, n=None, m=None, u=None):
        self.n = self.n if n is None else n
        self.m = self.m if m is None else m
        self.u = self.u if u is None else u
        self._trim()

    def _trim(self):
        while len(self.memory) > self.n * (self.m + 1):
            self.memory.pop(0)

    def __call__(self, x, y, w):
        t = self.calls
        self.calls += 1
        if t < self.u or self.n == 0:
            self.memory = []
            return x, y, w, 0
        c = w.shape[0]
        k = min(self.n, len(self.memory) // (self.m + 1))
        xs, ys, ws = [x], [y], [w]
        for j in range(1, k + 1):
            px, py, pw = self.memory[-j * (self.m + 1)]
            xs.append(px)
            ys.append(py + j * c)
            ws.append(pw)
        self.memory.append((x.clone(), y.clone(), w.clone()))
        self._trim()
        return torch.cat(xs), torch.cat(ys), torch.cat(ws), k


def random_step(gen, batch, num_classes=5, dim=3):
    x = torch.randn(batch, dim, generator=gen)
    y = torch.randint(0, num_classes, (batch,), generator=gen)
    w = torch.randn(num_classes, dim, generator=gen)
    return x, y, w


def paper_class_count(i, c, n, m, u):
    """s(i) of docs/method.md, "Class count s(i)" (the paper's eq. 4)."""
    if i < u:
        return c
    return c * (min((i - u) // (m + 1), n) + 1)


@pytest.mark.parametrize(
    "n,m,u",
    [(1, 0, 0), (3, 0, 0), (2, 1, 0), (4, 2, 3), (1, 5, 2), (5, 3, 7), (0, 2, 0), (3, 10, 1), (45, 10, 0)],
)
def test_matches_reference_and_class_count_staircase(n, m, u):
    gen = torch.Generator().manual_seed(n * 100 + m * 10 + u)
    mv, ref = MemVir(n, m, warmup_steps=u), ReferenceMemVir(n, m, u)
    c = 5
    for i in range(u + n * (m + 1) + 2 * (m + 1) + 3):
        batch = 4 if n == 45 else int(torch.randint(1, 7, (1,), generator=gen))  # batches of different sizes
        x, y, w = random_step(gen, batch, c)
        ex, ey, ew, k = ref(x, y, w)
        ox, oy, ow = mv(x, y, w)
        assert torch.equal(ox, ex) and torch.equal(oy, ey) and torch.equal(ow, ew), f"step {i}"
        assert mv.num_virtual_sets == k
        assert ow.shape[0] == paper_class_count(i, c, n, m, u) == mv.num_classes_at(i, c)
        assert int(oy.max()) < ow.shape[0]


def test_hand_example_order_and_offsets():
    # N=2, M=1: step 5 uses steps 3 and 1; the embedding of step t is the number t, its label t % 3.
    mv = MemVir(num_steps=2, margin=1)
    c = 3
    weights = [torch.full((c, 1), 10.0 + t) for t in range(6)]
    for t in range(6):
        out_x, out_y, out_w = mv(torch.tensor([[float(t)]]), torch.tensor([t % 3]), weights[t])
    assert out_x.flatten().tolist() == [5.0, 3.0, 1.0]
    assert out_y.tolist() == [5 % 3, 3 % 3 + c, 1 % 3 + 2 * c]
    assert out_w.flatten().tolist() == [15.0] * c + [13.0] * c + [11.0] * c
    assert mv.num_virtual_sets == 2


def test_first_virtual_set_arrives_m_plus_one_steps_after_warmup():
    mv = MemVir(num_steps=3, margin=2, warmup_steps=4)
    gen = torch.Generator().manual_seed(0)
    sets = []
    for _ in range(4 + 3 * 3 + 2):
        mv(*random_step(gen, 2))
        sets.append(mv.num_virtual_sets)
    # warm-up 0..3; steps 4,5,6 have 0 sets; 7,8,9 one; 10,11,12 two; 13+ three.
    assert sets == [0] * 4 + [0] * 3 + [1] * 3 + [2] * 3 + [3] * 2


def test_baseline_n0_stores_nothing_and_returns_inputs():
    mv = MemVir(num_steps=0, margin=3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(10):
        x, y, w = random_step(gen, 4)
        ox, oy, ow = mv(x, y, w)
        assert ox is x and ow is w and torch.equal(oy, y)
    assert mv.num_stored == 0 and mv.memory_bytes() == 0


def test_live_changes_of_n_m_and_warmup_follow_reference():
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    mv, ref = MemVir(3, 2, warmup_steps=2), ReferenceMemVir(3, 2, 2)
    for step in range(300):
        if step % 17 == 5:
            change = {"n": rng.randint(0, 5), "m": rng.randint(0, 4)}
            if rng.random() < 0.2:
                change["u"] = rng.randint(0, step + 3)
            mv.set_hparams(num_steps=change["n"], margin=change["m"], warmup_steps=change.get("u"))
            ref.set(**change)
            assert mv.num_stored == len(ref.memory)
        x, y, w = random_step(gen, rng.randint(1, 6))
        ex, ey, ew, k = ref(x, y, w)
        ox, oy, ow = mv(x, y, w)
        assert torch.equal(ox, ex) and torch.equal(oy, ey) and torch.equal(ow, ew), f"step {step}"
        assert mv.num_virtual_sets == k


def test_shrinking_capacity_keeps_the_newest_steps():
    mv = MemVir(num_steps=4, margin=0)
    for t in range(4):
        mv(torch.tensor([[float(t)]]), torch.tensor([0]), torch.zeros(1, 1))
    mv.set_hparams(num_steps=2)
    assert mv.num_stored == 2
    out, _, _ = mv(torch.tensor([[4.0]]), torch.tensor([0]), torch.zeros(1, 1))
    assert out.flatten().tolist() == [4.0, 3.0, 2.0]


def test_resume_from_state_dict_matches_uninterrupted_run():
    def run(mv, start, stop):
        outs = []
        for s in range(start, stop):
            gen = torch.Generator().manual_seed(1000 + s)
            outs.append(mv(*random_step(gen, 3 + (s % 4))))
        return outs

    straight = MemVir(4, 3, warmup_steps=5)
    expected = run(straight, 0, 60)

    first = MemVir(4, 3, warmup_steps=5)
    run(first, 0, 27)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    resumed = MemVir(1, 0)  # different settings: the state carries N, M, U and the step counter
    resumed.load_state_dict(state)
    assert (resumed.num_steps, resumed.margin, resumed.warmup_steps, resumed.step) == (4, 3, 5, 27)
    got = run(resumed, 27, 60)
    for (gx, gy, gw), (ex, ey, ew) in zip(got, expected[27:], strict=True):
        assert torch.equal(gx, ex) and torch.equal(gy, ey) and torch.equal(gw, ew)


def test_empty_state_round_trip():
    mv = MemVir(2, 1, warmup_steps=10)
    mv(*random_step(torch.Generator().manual_seed(0), 2))
    other = MemVir(2, 1)
    other.load_state_dict(mv.state_dict())
    assert other.step == 1 and other.num_stored == 0 and other.warmup_steps == 10


@pytest.mark.parametrize("store_dtype", [torch.float16, torch.bfloat16])
def test_half_precision_storage(store_dtype):
    gen = torch.Generator().manual_seed(3)
    full, half = MemVir(2, 1), MemVir(2, 1, store_dtype=store_dtype)
    for _ in range(6):
        x, y, w = random_step(gen, 4, dim=8)
        fx, fy, fw = full(x, y, w)
        hx, hy, hw = half(x, y, w)
    assert half.memory_bytes() < full.memory_bytes()
    float_bytes = full._embeddings.numel() * 4 + full._weights.numel() * 4
    assert full.memory_bytes() - half.memory_bytes() == float_bytes // 2
    assert hx.dtype == x.dtype and hw.dtype == w.dtype  # outputs in the live dtype
    assert torch.equal(hx[:4], x) and torch.equal(hy, fy)
    assert torch.equal(hx[4:], fx[4:].to(store_dtype).float())  # stored parts rounded once to the store dtype
    assert torch.equal(hw[5:], fw[5:].to(store_dtype).float())


def test_gradient_flows_only_into_live_inputs():
    gen = torch.Generator().manual_seed(4)
    mv = MemVir(2, 0)
    for _ in range(3):
        x, y, w = random_step(gen, 3)
        x.requires_grad_(True)
        w.requires_grad_(True)
        ox, oy, ow = mv(x, y, w)
    assert ox.shape[0] == 9 and ow.shape[0] == 15
    coeff_x = torch.randn(ox.shape, generator=gen)
    coeff_w = torch.randn(ow.shape, generator=gen)
    ((ox * coeff_x).sum() + (ow * coeff_w).sum()).backward()
    assert torch.equal(x.grad, coeff_x[:3]) and torch.equal(w.grad, coeff_w[:5])
    assert not mv._embeddings.requires_grad and not mv._weights.requires_grad
    stored = x.detach().clone()
    with torch.no_grad():
        x.add_(100.0)  # the memory holds copies: changing the live tensor later changes nothing stored
    next_x, _, _ = mv(*random_step(gen, 3))
    assert torch.equal(next_x[3:6], stored)  # the previous step, as the next call's first virtual set (M = 0)


def test_full_memory_is_written_in_place():
    gen = torch.Generator().manual_seed(5)
    mv = MemVir(3, 1)
    for _ in range(6):
        mv(*random_step(gen, 4))
    pointers = (mv._embeddings.data_ptr(), mv._labels.data_ptr(), mv._weights.data_ptr())
    for _ in range(20):
        mv(*random_step(gen, int(torch.randint(1, 5, (1,), generator=gen))))
        assert (mv._embeddings.data_ptr(), mv._labels.data_ptr(), mv._weights.data_ptr()) == pointers


def test_reference_geometry_memory_size():
    # docs/method.md, "Memory cost": N(M+1) * (B*D + C*D) floats, about 229 MB at N=45, M=10, B=128, C=98, D=512.
    mv = MemVir(45, 10)
    mv(torch.zeros(128, 512), torch.zeros(128, dtype=torch.long), torch.zeros(98, 512))
    float_bytes = 45 * 11 * (128 * 512 + 98 * 512) * 4
    assert mv._embeddings.numel() * 4 + mv._weights.numel() * 4 == float_bytes
    assert 228e6 < float_bytes < 230e6


def test_raising_warmup_past_the_current_step_restarts_the_curriculum():
    gen = torch.Generator().manual_seed(8)
    mv = MemVir(2, 0)
    for _ in range(4):
        mv(*random_step(gen, 2))
    assert mv.num_stored == 2
    mv.set_hparams(warmup_steps=10)
    mv(*random_step(gen, 2))
    assert mv.num_stored == 0 and mv.num_virtual_sets == 0


def test_integer_labels_of_other_dtypes_are_accepted():
    mv = MemVir(1, 0)
    x, y, w = random_step(torch.Generator().manual_seed(9), 3)
    mv(x, y.int(), w)
    _, out_y, _ = mv(x, y.int(), w)
    assert out_y.dtype == torch.long and torch.equal(out_y, torch.cat([y, y + 5]))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"num_steps": -1, "margin": 0}, "num_steps"),
        ({"num_steps": 1, "margin": -2}, "margin"),
        ({"num_steps": 1, "margin": 0, "warmup_steps": -1}, "warmup_steps"),
        ({"num_steps": 1.5, "margin": 0}, "num_steps"),
        ({"num_steps": None, "margin": 0}, "num_steps"),
        ({"num_steps": 1, "margin": 0, "store_dtype": torch.int8}, "store_dtype"),
    ],
)
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MemVir(**kwargs)


def test_bad_live_settings_are_rejected_and_change_nothing():
    mv = MemVir(2, 1)
    with pytest.raises(ValueError, match="margin"):
        mv.set_hparams(num_steps=3, margin=-1)
    assert (mv.num_steps, mv.margin) == (2, 1)


LONG = dict(dtype=torch.long)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: (torch.zeros(4), torch.zeros(4, **LONG), torch.zeros(5, 3)), "embeddings must be a 2-D"),
        (lambda: (torch.zeros(4, 3), torch.zeros(4, **LONG), torch.zeros(5)), "class_weights must be a 2-D"),
        (lambda: (torch.zeros(4, 3), torch.zeros(4), torch.zeros(5, 3)), "MemVir: labels must be an integer tensor"),
        (lambda: (torch.zeros(4, 3), torch.zeros(3, **LONG), torch.zeros(5, 3)),
         r"one label per embedding row, got labels \(3,\)"),
        (lambda: (torch.zeros(4, 3), torch.zeros(4, **LONG), torch.zeros(5, 2)),
         r"same D, got embeddings \(4, 3\) and class_weights \(5, 2\)"),
        (lambda: (torch.zeros(4, 3), torch.tensor([0, 1, 5, 2]), torch.zeros(5, 3)), r"\[0, 5\).*from 0 to 5"),
        (lambda: (torch.zeros(4, 3), torch.tensor([0, -1, 2, 2]), torch.zeros(5, 3)), "got labels from -1 to 2"),
        (lambda: (torch.zeros(0, 3), torch.zeros(0, **LONG), torch.zeros(5, 3)), "at least one embedding row"),
        (lambda: (torch.zeros(4, 3).long(), torch.zeros(4).long(), torch.zeros(5, 3)), "floating"),
    ],
)
def test_bad_inputs_are_rejected(make, message):
    mv = MemVir(2, 1)
    with pytest.raises(ValueError, match=message):
        mv(*make())
    assert mv.step == 0  # a rejected call is not a step


def test_class_count_change_needs_reset():
    mv = MemVir(2, 0)
    gen = torch.Generator().manual_seed(10)
    mv(*random_step(gen, 2, num_classes=5))
    with pytest.raises(ValueError, match="reset"):
        mv(*random_step(gen, 2, num_classes=6))
    mv.reset()
    mv(*random_step(gen, 2, num_classes=6))
    assert mv.step == 1


def test_state_from_another_version_is_rejected():
    mv = MemVir(1, 0)
    state = mv.state_dict()
    state["_extra_state"] = {"version": 99}
    with pytest.raises(ValueError, match="version"):
        mv.load_state_dict(state)


class ReferenceAllAtOnce(ReferenceMemVir):
    """The Fig. 3 ablation read plainly: the last N(M+1) warm-up steps are stored (not used), so every set is ready
    when the warm-up ends."""

    def __call__(self, x, y, w):
        t = self.calls
        if self.u - self.n * (self.m + 1) <= t < self.u and self.n:
            self.calls += 1
            self.memory.append((x.clone(), y.clone(), w.clone()))
            self._trim()
            return x, y, w, 0
        return super().__call__(x, y, w)


@pytest.mark.parametrize("n,m,u", [(2, 3, 20), (3, 2, 9), (3, 2, 4), (2, 1, 0), (1, 0, 5)])
def test_all_at_once_schedule_matches_reference(n, m, u):
    gen = torch.Generator().manual_seed(7 * n + m + u)
    mv, ref = MemVir(n, m, warmup_steps=u, schedule="all-at-once"), ReferenceAllAtOnce(n, m, u)
    c = 4
    for i in range(u + n * (m + 1) + 6):
        x, y, w = random_step(gen, int(torch.randint(1, 6, (1,), generator=gen)), c)
        ex, ey, ew, k = ref(x, y, w)
        ox, oy, ow = mv(x, y, w)
        assert torch.equal(ox, ex) and torch.equal(oy, ey) and torch.equal(ow, ew), f"step {i}"
        assert mv.num_virtual_sets == k
        assert ow.shape[0] == mv.num_classes_at(i, c), f"step {i}"


def test_all_at_once_uses_every_set_from_the_warmup_end():
    """With a warm-up longer than N(M+1) steps, s(i) jumps from C straight to C(N+1) at i = U (hand-written)."""
    mv = MemVir(3, 2, warmup_steps=12, schedule="all-at-once")
    gen = torch.Generator().manual_seed(0)
    counts = [mv(*random_step(gen, 2, 5))[2].shape[0] for _ in range(15)]
    assert counts == [5] * 12 + [20] * 3
    assert [mv.num_classes_at(i, 5) for i in range(15)] == counts


def test_schedule_survives_state_dict_and_rejects_unknown():
    mv = MemVir(2, 1, warmup_steps=6, schedule="all-at-once")
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        mv(*random_step(gen, 3))
    restored = MemVir(2, 1, warmup_steps=6)
    restored.load_state_dict(mv.state_dict())
    assert restored.schedule == "all-at-once" and restored.num_stored == 3
    for _ in range(2):  # steps 5 (stored, unused) and 6 (the warm-up's end: both sets in use)
        x, y, w = random_step(gen, 3)
        out, expected = restored(x, y, w), mv(x, y, w)
        assert all(torch.equal(a, b) for a, b in zip(out, expected, strict=True))
    assert out[2].shape[0] == 3 * 5
    with pytest.raises(ValueError, match="schedule must be one of curriculum, all-at-once"):
        MemVir(1, 1, schedule="sudden")


def test_ring_bytes_counts_a_full_memory_before_allocating():
    from memvir.memory.size import ring_bytes

    # by hand: N(M+1) = 2 * 4 = 8 steps of (6 x 3 float32 embeddings + 6 int64 labels + 5 x 3 float32 weights)
    assert ring_bytes(2, 3, batch_size=6, num_classes=5, dim=3) == 8 * (6 * 3 * 4 + 6 * 8 + 5 * 3 * 4)
    assert ring_bytes(2, 3, 6, 5, 3, dtype=torch.float16) == 8 * (6 * 3 * 2 + 6 * 8 + 5 * 3 * 2)
    mv = MemVir(2, 3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(9):
        mv(*random_step(gen, 6))
    assert mv.memory_bytes() == ring_bytes(2, 3, 6, 5, 3)


def test_without_value_checks_the_shapes_are_still_checked():
    mv = MemVir(1, 0, check_values=False)
    one_label_a_row = r"MemVir: labels must be 1-D with one label per embedding row, got labels \(1,\) for embeddings"
    with pytest.raises(ValueError, match=one_label_a_row):
        mv(torch.zeros(2, 3), torch.tensor([0]), torch.zeros(2, 3))


class HostReads:
    """Counts every way Python reads a tensor's value back (item, tolist, bool, int, float): on a GPU each is a host
    sync."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("poison", ["embeddings", "class_weights", "labels"])
def test_without_value_checks_a_bad_step_is_stored_as_zeros_and_reported_later_without_a_host_read(
        monkeypatch, poison):
    """check_values=False (the Trainer on a GPU): no host read at any call, MemVir and loss together (both reductions,
    the kept pairs); the step with NaN or inf (or labels out of range) enters the memory as zeros, never as its
    values, and check_stored reports it once, in one read. The memory equals that of a MemVir that checks every call
    and was given zeros at that step."""
    from memvir import build_loss
    from memvir.memory.checks import NonFiniteError

    checked, deferred = MemVir(2, 0), MemVir(2, 0, check_values=False)
    losses = {classes_per_set: build_loss("norm-softmax") for classes_per_set in (None, 5)}
    for loss in losses.values():
        loss.check_values = False
    gen = torch.Generator().manual_seed(0)
    twins = []
    reads = HostReads(monkeypatch)
    for number in range(6):
        x, y, w = random_step(gen, 4)
        twin = (x, y, w)
        if number == 3:
            x = x * float("nan") if poison == "embeddings" else x
            w = w * float("inf") if poison == "class_weights" else w
            y = y + 5 if poison == "labels" else y
            twin = (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), torch.zeros(5, 3))
        out = deferred(x.requires_grad_(), y, w.requires_grad_())
        for classes_per_set, loss in losses.items():
            if number != 3:  # (the live batch's own NaN would reach the loss's gradient, and only that)
                loss(*out, classes_per_set, live=out.live).backward()
        twins.append(twin)
    assert reads.count == 0
    monkeypatch.undo()
    for twin in twins:
        checked(*twin)
    for saved, twin_saved in zip(deferred.state_dict().values(), checked.state_dict().values(), strict=True):
        for key in ("embeddings", "labels", "class_weights", "batch_sizes"):
            assert torch.equal(saved[key], twin_saved[key]), key
    error = NonFiniteError if poison != "labels" else ValueError
    with pytest.raises(error, match=r"the first refused: step 3\).*memory holds zeros in its place"):
        deferred.check_stored()
    deferred.check_stored()  # reported once
    checked.check_stored()  # nothing to report: it checked at every call
