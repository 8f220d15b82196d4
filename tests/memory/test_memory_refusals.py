"""MemVir under hostile settings and inputs: a memory past the limit is refused before anything is allocated, a
failed allocation or a bad step leaves the memory as it was, and a live M change holds two rings at most."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from memvir.losses import build_loss
from memvir.memory.checks import NonFiniteError
from memvir.memory.size import DEFAULT_MAX_MEMORY_BYTES, MemoryLimitError, format_bytes, memory_limit, ring_bytes
from memvir.memory.virtual_classes import MemVir

ROOT = Path(__file__).resolve().parents[2]


def step_inputs(seed, batch=4, num_classes=5, dim=3):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, dim, generator=gen), torch.randint(0, num_classes, (batch,), generator=gen),
            torch.randn(num_classes, dim, generator=gen))


def assert_same_outputs(a, b):
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


# ------------------------------------------------------------------------------------------------ the memory limit
def test_a_ring_past_the_limit_is_refused_at_construction_with_its_size_and_the_limit():
    with pytest.raises(MemoryLimitError) as refused:
        MemVir(num_steps=10**6, margin=10**6)
    message = str(refused.value)
    assert "N(M+1) = 1,000,001,000,000" in message
    assert "16.0 GiB (17,179,869,184 bytes)" in message and "MEMVIR_MAX_MEMORY_BYTES" in message


def test_a_float32_memory_past_the_limit_is_offered_in_half_precision_only_where_that_fits():
    """N 50, M 200 at batch 32, 24 classes, dimension 128: 10,050 steps of 32*128*4 + 32*8 + 24*128*4 = 28,928 bytes
    (277.3 MiB) in float32, of 32*128*2 + 32*8 + 24*128*2 = 14,592 bytes (139.9 MiB) in float16."""
    from memvir.memory.size import check_ring

    assert ring_bytes(50, 200, 32, 24, 128) == 10_050 * 28_928
    assert ring_bytes(50, 200, 32, 24, 128, torch.float16) == 10_050 * 14_592
    with pytest.raises(MemoryLimitError) as refused:
        check_ring(50, 200, 32, 24, 128, torch.float32, limit=200_000_000)
    assert ("over the memory limit of 190.7 MiB (200,000,000 bytes). Lower N or M, store the memory in "
            "float16/bfloat16 (139.9 MiB), or raise the limit") in str(refused.value)
    for dtype, limit in ((torch.float32, 100_000_000), (torch.float16, 100_000_000)):
        with pytest.raises(MemoryLimitError) as refused:
            check_ring(50, 200, 32, 24, 128, dtype, limit=limit)
        assert "Lower N or M, or raise the limit" in str(refused.value) and "float16/" not in str(refused.value)


def test_a_memory_told_its_steps_refuses_an_n_and_m_past_the_limit_before_its_first_step():
    """Told the batch, classes and dimension to come (`expect`), MemVir checks N and M with them at once and on every
    change (`check_hparams` changes nothing), not with lower bounds until its first stored step."""
    needed = ring_bytes(2, 1, batch_size=4, num_classes=5, dim=3)  # 4 steps of 4*3*4 + 4*8 + 5*3*4 = 140 bytes
    assert needed == 4 * 140
    mv = MemVir(2, 1, max_memory_bytes=needed)  # a lower bound passes: 4 steps of batch 1, one class, dimension 1
    mv.expect(4, 5, 3)
    with pytest.raises(MemoryLimitError, match=r"N=3, M=1 .*840 bytes\) at batch 4, 5 classes, dimension 3"):
        mv.check_hparams(num_steps=3)
    assert mv.check_hparams(margin=0, warmup_steps=2) == (2, 0, 2)
    assert (mv.num_steps, mv.margin, mv.warmup_steps) == (2, 1, 0)  # checked, not changed
    with pytest.raises(MemoryLimitError, match="batch 4, 5 classes, dimension 3"):
        MemVir(3, 1, max_memory_bytes=needed, expected_steps=(4, 5, 3))
    for seed in range(4):
        mv(*step_inputs(seed))
    assert mv.memory_bytes() == needed


def test_sizes_are_written_in_binary_units():
    """The one byte formatter: MemVir's limit here, and the app's memory budget and upload limits, in its words."""
    assert [format_bytes(count) for count in (0, 1023, 1024, 1536, 20 * 2**20, 16 * 2**30, 2**60)] == [
        "0 bytes", "1023 bytes", "1.0 KiB", "1.5 KiB", "20.0 MiB", "16.0 GiB", "1.0 EiB"]


def test_the_first_step_is_refused_before_allocating_when_the_full_ring_would_pass_the_limit():
    needed = ring_bytes(2, 1, batch_size=4, num_classes=5, dim=3)
    mv = MemVir(2, 1, max_memory_bytes=needed - 1)
    with pytest.raises(MemoryLimitError, match=rf"{needed} bytes.*batch 4, 5 classes, dimension 3.*limit of"):
        mv(*step_inputs(0))
    assert mv.step == 0 and mv.num_stored == 0 and mv.memory_bytes() == 0  # nothing allocated, no step counted

    exact = MemVir(2, 1, max_memory_bytes=needed)  # a ring of exactly the limit is allowed
    for seed in range(4):
        exact(*step_inputs(seed))
    assert exact.memory_bytes() == needed


def test_a_live_change_past_the_limit_is_refused_and_changes_nothing():
    mv, twin = MemVir(2, 1), MemVir(2, 1)
    for seed in range(3):
        mv(*step_inputs(seed))
        twin(*step_inputs(seed))
    with pytest.raises(MemoryLimitError, match="batch 4, 5 classes, dimension 3"):
        mv.set_hparams(num_steps=10**6, margin=10**6)
    assert (mv.num_steps, mv.margin, mv.num_stored) == (2, 1, 3)
    for seed in range(3, 6):
        assert_same_outputs(mv(*step_inputs(seed)), twin(*step_inputs(seed)))


def test_the_limit_comes_from_the_argument_else_the_environment_else_16_gib(monkeypatch):
    monkeypatch.delenv("MEMVIR_MAX_MEMORY_BYTES", raising=False)
    assert memory_limit() == DEFAULT_MAX_MEMORY_BYTES == 16 * 2**30
    monkeypatch.setenv("MEMVIR_MAX_MEMORY_BYTES", "100")
    mv = MemVir(2, 1)
    assert mv.max_memory_bytes == 100
    with pytest.raises(MemoryLimitError, match=r"limit of 100 bytes"):
        mv(*step_inputs(0))
    assert MemVir(2, 1, max_memory_bytes=10**6).max_memory_bytes == 10**6  # the argument wins
    monkeypatch.setenv("MEMVIR_MAX_MEMORY_BYTES", "lots")
    with pytest.raises(ValueError, match="MEMVIR_MAX_MEMORY_BYTES must be a whole number of bytes"):
        MemVir(2, 1)
    with pytest.raises(ValueError, match="max_memory_bytes must be a positive"):
        MemVir(2, 1, max_memory_bytes=0)


# ------------------------------------------------------------------------------------------------ failed allocations
class AllocatorSaysNo(RuntimeError):
    pass


def refuse_allocations(monkeypatch):
    """Make the ring's label tensor (allocated after the embeddings) fail, as an exhausted allocator would."""
    def zeros(*args, **kwargs):
        raise AllocatorSaysNo("out of memory")

    monkeypatch.setattr(torch, "zeros", zeros)


def test_a_failed_first_allocation_leaves_a_memory_that_works_afterwards(monkeypatch):
    mv, twin = MemVir(2, 0), MemVir(2, 0)
    with monkeypatch.context() as patch:
        refuse_allocations(patch)
        with pytest.raises(AllocatorSaysNo):
            mv(*step_inputs(0))
    assert mv.step == 0 and mv.num_stored == 0 and mv.memory_bytes() == 0
    mv.set_hparams(margin=1)
    twin.set_hparams(margin=1)
    for seed in range(5):
        assert_same_outputs(mv(*step_inputs(seed)), twin(*step_inputs(seed)))


def test_a_failed_rebuild_keeps_the_stored_steps_and_settings(monkeypatch):
    mv, twin = MemVir(2, 1), MemVir(2, 1)
    for seed in range(4):
        mv(*step_inputs(seed))
        twin(*step_inputs(seed))
    before = mv.state_dict()["_extra_state"]
    with monkeypatch.context() as patch:
        refuse_allocations(patch)
        with pytest.raises(AllocatorSaysNo):
            mv.set_hparams(margin=2)  # a live M change rebuilds the ring
        with pytest.raises(AllocatorSaysNo):
            mv(*step_inputs(9, batch=6))  # a larger batch rebuilds it too
    after = mv.state_dict()["_extra_state"]
    assert (mv.margin, mv.step) == (1, 4)
    assert all(torch.equal(before[key], after[key]) for key in ("embeddings", "labels", "class_weights"))
    for seed in range(4, 8):
        assert_same_outputs(mv(*step_inputs(seed)), twin(*step_inputs(seed)))


def test_a_state_that_does_not_fit_is_refused_and_leaves_the_memory_as_it_was():
    mv = MemVir(2, 0)
    for seed in range(3):
        mv(*step_inputs(seed))
    kept = mv.state_dict()
    bad = MemVir(2, 0)
    for seed in range(3):
        bad(*step_inputs(seed, num_classes=7))
    state = bad.state_dict()
    state["_extra_state"]["labels"] = state["_extra_state"]["labels"][:, :2]  # labels no longer match the rows
    with pytest.raises(ValueError, match="stored steps do not fit together"):
        mv.load_state_dict(state)
    assert torch.equal(mv.state_dict()["_extra_state"]["embeddings"], kept["_extra_state"]["embeddings"])
    huge = bad.state_dict()
    huge["_extra_state"]["num_steps"] = 10**9
    with pytest.raises(MemoryLimitError):
        mv.load_state_dict(huge)
    assert mv.num_steps == 2 and mv.num_stored == 2


REBUILD_PEAK = textwrap.dedent("""
    import torch
    from memvir import MemVir
    from memvir.memory.size import ring_bytes

    def peak_resident_kib():  # this process's own peak: unlike ru_maxrss, it does not count the parent's before exec
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

    batch, classes, dim, slots = 256, 64, 512, 300
    mv = MemVir(1, slots - 1)
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(batch, dim, generator=gen), torch.randn(classes, dim, generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    for _ in range(slots):
        mv(x, y, w)
    before = peak_resident_kib()
    mv.set_hparams(margin=slots - 2)  # a live M change: a new ring of slots - 1 steps
    after = peak_resident_kib()
    print((after - before) * 1024 / ring_bytes(1, slots - 1, batch, classes, dim))
""")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak resident memory from /proc")
def test_a_live_m_change_holds_the_old_and_the_new_ring_at_most():
    """The peak resident memory a rebuild adds, in rings (about 200 MB each): the new ring (about 1), not a gathered
    copy of the kept steps besides (about 2)."""
    result = subprocess.run([sys.executable, "-c", REBUILD_PEAK], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    extra_rings = float(result.stdout.strip().splitlines()[-1])
    assert 0.8 < extra_rings < 1.4, extra_rings


# ------------------------------------------------------------------------------------------------ bad steps
def test_bool_labels_are_refused_as_the_losses_refuse_them():
    embeddings, labels, weights = step_inputs(0)
    flags = labels > 1
    mv = MemVir(2, 0)
    with pytest.raises(ValueError, match=r"MemVir: labels must be an integer tensor.*torch.bool"):
        mv(embeddings, flags, weights)
    assert mv.step == 0
    with pytest.raises(ValueError, match=r"labels must be an integer tensor.*torch.bool"):
        build_loss("norm-softmax")(embeddings, flags, weights)


@pytest.mark.parametrize("poisoned", ["embeddings", "class_weights"])
def test_a_non_finite_step_is_refused_and_never_poisons_the_memory(poisoned):
    mv, twin = MemVir(2, 0), MemVir(2, 0)
    for seed in range(3):
        mv(*step_inputs(seed))
        twin(*step_inputs(seed))
    embeddings, labels, weights = step_inputs(3)
    if poisoned == "embeddings":
        embeddings[1, 0] = float("nan")
    else:
        weights[2, 1] = float("inf")
    with pytest.raises(NonFiniteError, match="NaN or inf.*refused and nothing is stored"):
        mv(embeddings, labels, weights)
    assert mv.step == 3 and mv.num_stored == 2
    for seed in range(4, 10):  # the following N(M+1) steps and more: as if the bad call never happened
        out = mv(*step_inputs(seed))
        assert_same_outputs(out, twin(*step_inputs(seed)))
        assert all(torch.isfinite(part).all() for part in out)


@pytest.mark.parametrize("poisoned", ["embeddings", "class_weights"])
def test_large_finite_values_are_stored_and_an_inf_among_them_refused(poisoned):
    """Values near float32's largest, whose sum overflows, are finite: stored as they are. An inf among them, or a
    -inf beside a +inf, is still refused."""
    mv = MemVir(1, 0)
    embeddings, labels, weights = step_inputs(0)
    large = embeddings if poisoned == "embeddings" else weights
    large.fill_(3e38)
    mv(embeddings, labels, weights)
    assert mv.num_stored == 1 and torch.equal(mv(*step_inputs(1))[2 if poisoned == "class_weights" else 0][
        -large.shape[0]:], large)
    for bad in (float("inf"), float("-inf")):
        large[0, 0] = bad
        with pytest.raises(NonFiniteError, match="NaN or inf"):
            mv(embeddings, labels, weights)


def test_a_non_finite_step_during_the_warmup_passes_through_since_nothing_is_stored():
    mv = MemVir(2, 0, warmup_steps=5)
    embeddings, labels, weights = step_inputs(0)
    embeddings[0, 0] = float("nan")
    out = mv(embeddings, labels, weights)
    assert out[0] is embeddings and mv.num_stored == 0 and mv.step == 1
