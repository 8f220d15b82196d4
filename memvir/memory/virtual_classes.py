"""MemVir: the memory of past steps whose embeddings and class weights become virtual classes.

One call is one training step t. After the warm-up, the call looks up the steps t - j(M+1) for
j = 1..k, k = min(N, floor(L / (M+1))) with L the number of steps stored so far, appends their detached
embeddings (labels shifted by j*C) and class-weight matrices (as C new classes each) after the live ones, then
stores detached copies of this call's inputs, as docs/method.md ("Algorithm") describes.

The store is a ring buffer with room for N(M+1) steps, allocated once (grown once more only if a larger
batch arrives), so a full memory costs no allocation per step: the reference code's Python lists re-allocate
and can select the wrong steps. Its state travels in ``state_dict()`` so a resumed run continues the curriculum
where it stopped (memvir.memory.state), unlike the reference, which forgets the memory on resume.

Limits and failures: a ring larger than the memory limit (`max_memory_bytes`, else $MEMVIR_MAX_MEMORY_BYTES, else
16 GiB) is refused with a `MemoryLimitError` (memvir.memory.size) before anything is allocated. A step whose
embeddings or class weights hold NaN or inf is refused with a `NonFiniteError` (memvir.memory.checks, with the
other input checks): stored, such a step would poison the N(M+1) steps that follow. Without ``check_values`` (a GPU,
where the check's host sync would stall every step) such a step is stored as zeros, checked on the device, and
reported by `MemVir.check_stored` at the caller's cadence.
A refused or failed call (a bad input, the allocator saying no) is not a step: the counter and the stored steps stay
as they were.

Two schedules: "curriculum" (the paper's) adds the virtual sets one by one after the warm-up, s(i) rising as a
staircase; "all-at-once" (the paper's Fig. 3 ablation) starts storing N(M+1) steps before the warm-up ends, so all N
sets are in use from the first step after it.
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

import torch
from torch import nn

from memvir._validate import check_inputs
from memvir.memory.checks import DeferredChecks, check_count, check_values
from memvir.memory.size import check_ring, memory_limit
from memvir.memory.state import SavedMemory

SCHEDULES = ("curriculum", "all-at-once")


def virtual_sets_at(step: int, num_steps: int, margin: int, warmup_steps: int, schedule: str = "curriculum") -> int:
    """k(t): the virtual sets MemVir(N, M) with warm-up U uses at call `step` (0-based) of an uninterrupted run, the
    memory holding every step since it started storing: min(N, floor(L / (M+1))) with L the steps stored before
    `step` (docs/method.md, "Class count s(i)"). 0 during the warm-up and for N = 0."""
    if step < warmup_steps or num_steps == 0:
        return 0
    capacity = num_steps * (margin + 1)
    stored = min(step - _first_stored_step(warmup_steps, capacity, schedule), capacity)
    return min(stored // (margin + 1), num_steps)


def _first_stored_step(warmup_steps: int, capacity: int, schedule: str) -> int:
    """The first step that is stored: the warm-up's end, or for "all-at-once" N(M+1) steps before it."""
    return max(0, warmup_steps - capacity) if schedule == "all-at-once" else warmup_steps


class StoredSets(NamedTuple):
    """Which stored steps the virtual sets of one MemVir output are, so that a loss may keep what it computes from a
    pair of stored steps for the later calls that select the same pair again (memvir.losses, "Cache"). A step is
    named by the call that stored it (``MemVir.step`` then), not by its set's position j, which moves on every call."""

    memory: str  # the contents' identity: new whenever a step number may stand for other contents or values (MemVir)
    steps: tuple[int, ...]  # the call each virtual set j = 1..k was stored at
    rows: tuple[int, ...]  # each set's row count
    oldest: int  # the oldest step the memory holds: no later call selects an older one
    # the step this call's live inputs are stored as, where the memory keeps their values exactly (its dtype is
    # theirs): a loss may keep what it computes from them, with gradients, as the pairs of that stored step
    live_step: int | None = None
    # this call's step: a loss keeps nothing of a step at or past it (a memory loaded from an earlier state goes on
    # from that state's step, under the same identity, with other contents than a kept later step had)
    call: int | None = None


class LiveInputs(NamedTuple):
    """The live inputs of one MemVir call beside the output that holds them, so that a loss given the output itself
    takes its live rows and weight rows from the inputs rather than slicing them out of the concatenation: autograd
    then never writes a gradient as large as the whole output, the memory's part of it zeros (memvir.losses,
    "Blocks"). The output's versions say whether it was changed in place after the call. Given that output, a loss
    also knows where its labels lie: each stored row's in its own set (the memory stores labels in [0, C) only), and
    the live rows' in [0, C) where ``labels_checked`` (MemVir checked them at the call)."""

    embeddings: torch.Tensor  # MemVir's input [B, D]
    class_weights: torch.Tensor  # MemVir's input [C, D]
    output: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # the output's embeddings, labels and class weights
    versions: tuple[int, int, int]  # their versions at the call
    labels_checked: bool

    def of(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor) -> LiveInputs | None:
        """These live inputs when the loss was given this call's output unchanged, else None."""
        given = (embeddings, labels, class_weights)
        same = all(a is b for a, b in zip(given, self.output, strict=True))
        return self if same and tuple(t._version for t in given) == self.versions else None


class LiveBlock(tuple):
    """(B, C): how many of a MemVir output's rows and weight rows are live, the keyword ``live`` of a memvir.losses
    loss; ``stored_sets`` (a `StoredSets`, None without virtual sets) says which stored steps the rest are, and
    ``inputs`` (a `LiveInputs`, None when unknown) the call's live inputs themselves."""

    def __new__(cls, num_live_rows: int, num_live_classes: int, stored_sets: StoredSets | None = None,
                inputs: LiveInputs | None = None):
        block = super().__new__(cls, (num_live_rows, num_live_classes))
        block.stored_sets = stored_sets
        block.inputs = inputs
        return block

    def __getnewargs__(self):  # copy and pickle rebuild it through __new__
        return (*self, self.stored_sets)


class AugmentedBatch(tuple):
    """MemVir's output, the 3-tuple (embeddings, labels, class_weights) with the live rows and weight rows first, and
    how many of them there are: ``num_live_rows`` (B) and ``num_live_classes`` (C). Everything past them comes from
    the memory and carries no gradient, so a loss of memvir.losses given ``live=batch.live`` leaves it out of its
    gradient work (memvir.losses, "Blocks"); ``stored_sets`` says which stored steps the virtual sets are, so such a
    loss keeps what it computes from them for the calls that select them again (memvir.losses, "Cache")."""

    def __new__(cls, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                num_live_rows: int, num_live_classes: int, stored_sets: StoredSets | None = None):
        batch = super().__new__(cls, (embeddings, labels, class_weights))
        batch.num_live_rows, batch.num_live_classes = num_live_rows, num_live_classes
        batch.stored_sets = stored_sets
        batch.live_inputs = None  # set by MemVir (`LiveInputs`); a copy or a pickle goes without
        return batch

    def __getnewargs__(self):  # copy and pickle rebuild it through __new__
        return (*self, self.num_live_rows, self.num_live_classes, self.stored_sets)

    @property
    def live(self) -> LiveBlock:
        """(B, C), carrying ``stored_sets`` and the live inputs: the keyword ``live`` of a memvir.losses loss."""
        return LiveBlock(self.num_live_rows, self.num_live_classes, self.stored_sets, self.live_inputs)


class MemVir(nn.Module):
    """Memory-based virtual classes around any softmax-style or proxy-based loss.

    Args:
        num_steps: N, how many past steps are used as virtual classes (0 = the plain baseline).
        margin: M, the gap between used steps: steps t-(M+1), t-2(M+1), ... are used.
        warmup_steps: U, calls before this return their inputs unchanged and store nothing.
        store_dtype: dtype of the stored copies (torch.float16 or torch.bfloat16 halve the memory);
            None keeps the dtype of the inputs.
        schedule: "curriculum" (the paper's: one more virtual set every M+1 steps after the warm-up) or
            "all-at-once" (the steps before the warm-up's end are stored, so all N sets arrive together).
        max_memory_bytes: the largest ring allowed (see `memory_limit`): None reads MEMVIR_MAX_MEMORY_BYTES, else
            16 GiB. N and M past it are refused (MemoryLimitError) here, by `set_hparams` (and `check_hparams`),
            and at the first step, once the batch, class count and dimension are known, always before anything is
            allocated.
        expected_steps: (batch, classes, dimension) of the steps to come, when the caller knows them (`expect`):
            N and M are checked with them from the start, not with lower bounds until the first stored step.
        check_values: check every call's labels against the class count and what it stores for NaN/inf, refusing
            the call. The check costs a host sync per call (a GPU waits for it); a training loop that checks its
            labels on the CPU and its loss at its own cadence may turn it off. Then each stored step is checked on the
            device as it is stored, without a sync: a step with NaN, inf or labels out of range is stored as zeros
            (the memory never holds the values it refused), and `check_stored` reports it at the loop's cadence (the
            Trainer's: it stops the run and keeps its last good checkpoint).
        live_pairs: name the step each call's live inputs are stored as (``StoredSets.live_step``), so that a loss
            keeps what its live blocks give as that step's pairs and computes no stored block (memvir.losses,
            "Cache"). Those equal the stored computation to float32's last digits only: a run that resumes from a
            checkpoint reproduces the uninterrupted one bit for bit where the checkpoint holds the loss's state (its
            kept pairs) beside this memory's, as the Trainer's does (it turns them on). Off by default, so that a
            loop that saves only the memory still resumes bit for bit.

    Call: ``mv(embeddings[B, D], labels[B], class_weights[C, D]) -> (embeddings', labels', class_weights')`` with
    (k+1)B rows, labels in [0, (k+1)C) and (k+1)C weight rows, the live inputs first: an `AugmentedBatch`, a 3-tuple
    that also says how many rows and weight rows are live (``.live`` = (B, C); the rest are the memory's, detached).
    """

    def __init__(self, num_steps: int, margin: int, warmup_steps: int = 0, store_dtype: torch.dtype | None = None,
                 schedule: str = "curriculum", max_memory_bytes: int | None = None, check_values: bool = True,
                 expected_steps: tuple[int, int, int] | None = None, live_pairs: bool = False):
        super().__init__()
        if schedule not in SCHEDULES:
            raise ValueError(f"MemVir: schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        self.schedule = schedule
        if store_dtype is not None and not (isinstance(store_dtype, torch.dtype) and store_dtype.is_floating_point):
            raise ValueError(f"MemVir: store_dtype must be a floating torch dtype or None, got {store_dtype!r}")
        self.num_steps = check_count("num_steps (N)", num_steps)
        self.margin = check_count("margin (M)", margin)
        self.warmup_steps = check_count("warmup_steps (U)", warmup_steps)
        self.store_dtype = store_dtype
        self.max_memory_bytes = memory_limit(max_memory_bytes)
        self.check_values = check_values
        self.live_pairs = live_pairs
        self._deferred_checks = DeferredChecks()  # the stored steps' checks without check_values
        self.step = 0  # calls made so far; the next call is step `self.step`
        self.num_virtual_sets = 0  # k used by the last call
        # (batch, classes, dimension, dtype) of the steps to come, when told (`expect`)
        self._expected = None if expected_steps is None else (*expected_steps, torch.float32)
        self._reset_store()
        self._check_fits(self.num_steps, self.margin)

    def expect(self, batch_size: int, num_classes: int, dim: int, dtype: torch.dtype = torch.float32) -> None:
        """Say what the steps to come hold (a batch of `batch_size` rows, `num_classes` class weights, dimension `dim`,
        `dtype` before the store dtype), so that N and M are checked against the limit with them before the first
        step: now (MemoryLimitError), and by `set_hparams` and `check_hparams` until the memory exists. A training
        loop that knows its batch refuses a memory it could never hold before it trains, not at its first stored
        step."""
        self._expected = (batch_size, num_classes, dim, dtype)
        self._check_fits(self.num_steps, self.margin)

    # ----------------------------------------------------------------------------------------------- storage
    @property
    def capacity(self) -> int:
        """Steps the memory holds when full: N(M+1)."""
        return self.num_steps * (self.margin + 1)

    @property
    def num_stored(self) -> int:
        """L, the number of past steps stored now."""
        return self._count

    def _reset_store(self) -> None:
        self._embeddings: torch.Tensor | None = None  # [capacity, max_batch, D]
        self._labels: torch.Tensor | None = None  # [capacity, max_batch]
        self._weights: torch.Tensor | None = None  # [capacity, C, D]
        self._batch_sizes: list[int] = []  # per slot, kept in Python so reading it never syncs a GPU
        self._head = 0  # slot the next stored step goes to
        self._count = 0
        self._new_contents()

    def _new_contents(self) -> None:
        """A new identity of the memory's contents (`StoredSets.memory`): after a reset the step numbers start again
        with other contents; after a change of the stored dtype the same steps hold other values; a state loaded
        keeps the identity it was saved with (`set_extra_state`) when it holds the same values, so that a loss's
        pairs saved beside it still hold (memvir.losses, "Cache");
        after a change of N or M the set of pairs a loss kept for the old selection is discarded with it."""
        self._contents = uuid.uuid4().hex

    def _slot(self, age: int) -> int:
        """Ring slot of the step stored `age` calls ago (age 1 = the previous step)."""
        return (self._head - age) % len(self._batch_sizes)

    def _ordered_slots(self) -> list[int]:
        """Slots of the stored steps, oldest first."""
        return [self._slot(age) for age in range(self._count, 0, -1)]

    def _check_fits(self, num_steps: int, margin: int, max_batch: int | None = None) -> None:
        """MemoryLimitError when N(M+1) steps would pass the limit: with the ring's batch, class count and dimension
        once it exists (or `max_batch` rows for a batch about to arrive), else with lower bounds for them."""
        if self._embeddings is None and self._expected is not None:  # the steps `expect` announced
            batch, num_classes, dim, dtype = self._expected
            check_ring(num_steps, margin, max(batch, max_batch or 0), num_classes, dim, self.store_dtype or dtype,
                       self.max_memory_bytes)
            return
        if self._embeddings is None:  # the inputs' dtype is not known either: half precision is the least it takes
            check_ring(num_steps, margin, 1, 1, 1, self.store_dtype or torch.float16, self.max_memory_bytes,
                       at_least=True)
            return
        _, batch, dim = self._embeddings.shape
        check_ring(num_steps, margin, max(batch, max_batch or 0), self._weights.shape[1], dim, self._weights.dtype,
                   self.max_memory_bytes)

    def _new_ring(self, capacity: int, max_batch: int, like_embeddings: torch.Tensor, like_weights: torch.Tensor):
        """A zeroed ring (embeddings, labels, class weights) of `capacity` slots shaped like one step's inputs.

        Nothing of the memory changes here, so an allocation that fails leaves it as it was."""
        return (
            like_embeddings.new_zeros(capacity, max_batch, like_embeddings.shape[-1]),
            torch.zeros(capacity, max_batch, dtype=torch.long, device=like_embeddings.device),
            like_weights.new_zeros(capacity, *like_weights.shape[-2:]),
        )

    def _checked_ring(self, num_steps: int, margin: int, max_batch: int, like_embeddings: torch.Tensor,
                      like_weights: torch.Tensor):
        """A new ring for N(M+1) steps in the store dtype, once `check_ring` finds it within the memory limit."""
        if self.store_dtype is not None:
            like_embeddings, like_weights = like_embeddings.to(self.store_dtype), like_weights.to(self.store_dtype)
        check_ring(num_steps, margin, max_batch, *like_weights.shape, like_weights.dtype, self.max_memory_bytes)
        return self._new_ring(num_steps * (margin + 1), max_batch, like_embeddings, like_weights)

    def _install(self, ring: tuple, sizes: list[int]) -> None:
        """Make `ring`, holding len(sizes) steps oldest first from slot 0, the memory."""
        self._embeddings, self._labels, self._weights = ring
        capacity = ring[0].shape[0]
        self._batch_sizes = sizes + [0] * (capacity - len(sizes))
        self._count = len(sizes)
        self._head = self._count % capacity

    def _rebuild(self, capacity: int, max_batch: int) -> None:
        """Re-allocate the ring for a new capacity or batch size, keeping the newest steps that fit.

        The kept steps are copied straight from the old ring into the new one, so a rebuild holds the two rings at
        most, and the memory changes only once the new ring is complete."""
        if self._embeddings is None or capacity == 0:
            self._reset_store()
            return
        slots = self._ordered_slots()[-capacity:]
        ring = self._new_ring(capacity, max_batch, self._embeddings[0, 0], self._weights[0])
        _copy_steps(ring, (self._embeddings, self._labels, self._weights), slots)
        self._install(ring, [self._batch_sizes[s] for s in slots])

    def _store(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor) -> None:
        capacity = self.capacity
        if capacity == 0:
            return
        batch = embeddings.shape[0]
        if self._embeddings is None:
            self._install(self._checked_ring(self.num_steps, self.margin, batch, embeddings[0], class_weights), [])
        elif batch > self._embeddings.shape[1]:
            self._check_fits(self.num_steps, self.margin, max_batch=batch)
            self._rebuild(capacity, batch)
        slot = self._head
        with torch.no_grad():
            embeddings, labels, class_weights = embeddings.detach(), labels.detach(), class_weights.detach()
            if not self.check_values:  # checked here on the device, read later (check_stored): no host sync
                finite, in_range = DeferredChecks.storable(embeddings, labels, class_weights)
                self._deferred_checks.note(self.step, finite, in_range)
                storable = finite & in_range  # else the whole step is stored as zeros
                embeddings, class_weights = embeddings.where(storable, 0.0), class_weights.where(storable, 0.0)
                labels = labels.where(storable, 0)
            self._embeddings[slot, :batch].copy_(embeddings)
            self._labels[slot, :batch].copy_(labels)
            self._weights[slot].copy_(class_weights)
        self._batch_sizes[slot] = batch
        self._head = (slot + 1) % capacity
        self._count = min(self._count + 1, capacity)

    # ----------------------------------------------------------------------------------------------- the step
    def _validate(self, embeddings, labels, class_weights, storing: bool) -> None:
        """ValueError for wrong inputs; when the step is to be `storing`, NonFiniteError for NaN or inf in it."""
        check_inputs(embeddings, labels, class_weights, check_values=False, who="MemVir")
        if self.check_values:
            check_values(embeddings, labels, class_weights, storing)
        if self._embeddings is not None:
            dim, num_classes = embeddings.shape[1], class_weights.shape[0]
            stored_dim, stored_classes = self._weights.shape[2], self._weights.shape[1]
            if (dim, num_classes) != (stored_dim, stored_classes):
                raise ValueError(
                    f"MemVir: the memory holds {stored_classes} classes of dimension {stored_dim}, but this step has "
                    f"{num_classes} classes of dimension {dim}; call reset() before changing either"
                )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor):
        """One training step: this batch with the virtual classes of the selected stored steps, then this batch
        stored (docs/method.md).

        Args:
            embeddings: [B, D], this step's embeddings.
            labels: [B], integer classes in [0, C).
            class_weights: [C, D], the loss's class weights (or proxies).

        Returns:
            An `AugmentedBatch` (embeddings', labels', class_weights'): the live inputs first, then for each selected
            step j = 1..k its rows with labels y + jC and its class weights, detached; before the warm-up's end, the
            inputs unchanged (k = 0, `num_virtual_sets`).

        Raises:
            ValueError: wrong shapes or dtypes, labels out of range, or (with `check_values`) NaN or inf, saying which.
        """
        step = self.step
        storing = step >= self._store_from() and self.num_steps > 0
        self._validate(embeddings, labels, class_weights, storing)
        labels = labels.long()
        num_sets = 0
        out = AugmentedBatch(embeddings, labels, class_weights, embeddings.shape[0], class_weights.shape[0])
        if not storing:
            # Warm-up (or a warm-up raised past the current step): the plain baseline, and an empty memory so the
            # stored steps stay consecutive and the ages j(M+1) stay true.
            if self._count:
                self._reset_store()
        else:
            if self._embeddings is not None and self._embeddings.device != embeddings.device:
                self.to(embeddings.device)  # e.g. a memory restored on the CPU, resumed on a GPU
            if step >= self.warmup_steps:  # else all-at-once: the warm-up's last steps fill the memory, unused yet
                num_sets = min(self.num_steps, self._count // (self.margin + 1))
            if num_sets:
                out = self._augment(embeddings, labels, class_weights, num_sets)
            self._store(embeddings, labels, class_weights)
        # counted only now: a call that failed on the way (the allocator refusing the ring, say) was not a step
        self.step = step + 1
        self.num_virtual_sets = num_sets
        return out

    def _augment(self, embeddings, labels, class_weights, num_sets: int):
        num_classes = class_weights.shape[0]
        ages = [j * (self.margin + 1) for j in range(1, num_sets + 1)]
        slots = [self._slot(age) for age in ages]
        sizes = [self._batch_sizes[s] for s in slots]
        # the stored steps are the calls just before this one, one a call, so the step `age` calls ago is step - age
        # the live inputs are stored next (`_store`), as they are where the ring has their dtypes
        exact = self.live_pairs and self._embeddings.dtype == embeddings.dtype and (
            self._weights.dtype == class_weights.dtype)
        stored_sets = StoredSets(self._contents, tuple(self.step - age for age in ages), tuple(sizes),
                                 self.step - self._count, self.step if exact else None, self.step)
        # Views into the ring, concatenated once: gathering first and concatenating after would copy twice.
        embedding_views = [self._embeddings[s, :size] for s, size in zip(slots, sizes, strict=True)]
        weight_views = [self._weights[s] for s in slots]
        label_parts = [labels] + [
            self._labels[s, :size] + j * num_classes for j, (s, size) in enumerate(zip(slots, sizes, strict=True), 1)
        ]
        out = AugmentedBatch(
            _concat(embeddings, embedding_views),
            torch.cat(label_parts),
            _concat(class_weights, weight_views),
            embeddings.shape[0],
            num_classes,
            stored_sets,
        )
        out.live_inputs = LiveInputs(embeddings, class_weights, tuple(out), tuple(t._version for t in out),
                                     self.check_values)
        return out

    # ----------------------------------------------------------------------------------------------- control
    def check_hparams(self, num_steps: int | None = None, margin: int | None = None,
                      warmup_steps: int | None = None) -> tuple[int, int, int]:
        """What `set_hparams` would refuse, refused now without changing anything (ValueError, MemoryLimitError):
        a caller may ask before the step the change is for. Returns the (N, M, U) they make."""
        new_steps = self.num_steps if num_steps is None else check_count("num_steps (N)", num_steps)
        new_margin = self.margin if margin is None else check_count("margin (M)", margin)
        new_warmup = self.warmup_steps if warmup_steps is None else check_count("warmup_steps (U)", warmup_steps)
        self._check_fits(new_steps, new_margin)
        return new_steps, new_margin, new_warmup

    def set_hparams(self, num_steps: int | None = None, margin: int | None = None, warmup_steps: int | None = None):
        """Change N, M or U between two steps (live control). Capacity follows N(M+1); the oldest steps go first."""
        new_steps, new_margin, new_warmup = self.check_hparams(num_steps, margin, warmup_steps)
        new_capacity = new_steps * (new_margin + 1)
        if new_capacity != self.capacity and self._embeddings is not None:
            self._rebuild(new_capacity, self._embeddings.shape[1])  # changes nothing if it fails
        if (new_steps, new_margin) != (self.num_steps, self.margin):
            self._new_contents()
        self.num_steps, self.margin, self.warmup_steps = new_steps, new_margin, new_warmup

    def check_stored(self) -> None:
        """Without ``check_values``: NonFiniteError if a step stored since the last check held NaN or inf (a
        ValueError for labels out of range); it was stored as zeros. One host sync; nothing to do with
        ``check_values``, which refuses such a step at its call."""
        self._deferred_checks.check()

    def reset(self) -> None:
        """Forget every stored step and restart the step counter."""
        self._deferred_checks.clear()
        self._reset_store()
        self.step = 0
        self.num_virtual_sets = 0

    def _store_from(self) -> int:
        return _first_stored_step(self.warmup_steps, self.capacity, self.schedule)

    def num_classes_at(self, step: int, num_classes: int) -> int:
        """s(i), the class count at call `step` under the current N, M, U (for the curriculum: docs/method.md,
        "Class count s(i)")."""
        sets = virtual_sets_at(step, self.num_steps, self.margin, self.warmup_steps, self.schedule)
        return num_classes * (sets + 1)

    def memory_bytes(self) -> int:
        """Bytes held by the allocated ring (0 before the first stored step)."""
        if self._embeddings is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._embeddings, self._labels, self._weights))

    def extra_repr(self) -> str:
        return (
            f"num_steps={self.num_steps}, margin={self.margin}, warmup_steps={self.warmup_steps}, "
            f"store_dtype={self.store_dtype}, schedule={self.schedule}, stored={self._count}/{self.capacity}, "
            f"step={self.step}"
        )

    def _apply(self, fn, recurse=True):
        # Module.to(device) / .double() etc. move the ring with the module; stored copies keep store_dtype when set.
        super()._apply(fn, recurse)
        self._deferred_checks.to(fn)
        if self._embeddings is not None:
            dtypes = (self._embeddings.dtype, self._weights.dtype)
            stored = (self._embeddings, self._labels, self._weights)
            self._embeddings, self._labels, self._weights = (fn(t) for t in stored)
            if self.store_dtype is not None:
                self._embeddings = self._embeddings.to(self.store_dtype)
                self._weights = self._weights.to(self.store_dtype)
            # a move copies the values exactly (a loss keys what it kept by device itself); a new dtype changes them
            if (self._embeddings.dtype, self._weights.dtype) != dtypes:
                self._new_contents()
        return self

    def get_extra_state(self) -> dict:
        """The stored steps oldest first, the call counter and N, M, U (memvir.memory.state)."""
        slots = self._ordered_slots()
        stored = None
        if self._count:
            stored = tuple(t[slots].cpu() for t in (self._embeddings, self._labels, self._weights))
        return SavedMemory(self.num_steps, self.margin, self.warmup_steps, self.schedule, self.step,
                           self.num_virtual_sets, [self._batch_sizes[slot] for slot in slots], stored,
                           self._contents).to_state()

    def set_extra_state(self, state: dict) -> None:
        # The state is checked and the ring rebuilt before any attribute changes: a bad state leaves the memory as
        # it was.
        saved = SavedMemory.from_state(state, SCHEDULES)
        ring = None
        if saved.stored is not None:
            embeddings, _, weights = saved.stored
            ring = self._checked_ring(saved.num_steps, saved.margin, embeddings.shape[1], embeddings[0, 0],
                                      weights[0])
            _copy_steps(ring, saved.stored, range(len(saved.batch_sizes)))
        self.num_steps, self.margin, self.warmup_steps = saved.num_steps, saved.margin, saved.warmup_steps
        self.schedule, self.step, self.num_virtual_sets = saved.schedule, saved.step, saved.num_virtual_sets
        self._deferred_checks.clear()  # what the steps it replaces held is no longer in the memory
        self._reset_store()
        if ring is not None:
            self._install(ring, saved.batch_sizes)
        # the saved identity where the ring holds the saved values exactly (not converted to another store dtype)
        same_values = ring is None or (ring[0].dtype, ring[2].dtype) == (saved.stored[0].dtype, saved.stored[2].dtype)
        if saved.contents is not None and same_values:
            self._contents = saved.contents


def _copy_steps(ring: tuple, source: tuple, slots) -> None:
    """Copy the steps at `slots` of `source` (embeddings, labels, class weights) into the slots 0, 1, ... of `ring`,
    one slice copy per stretch of consecutive slots: a ring's steps in order are at most two stretches."""
    width = min(ring[0].shape[1], source[0].shape[1])
    position = 0
    for first, length in _stretches(slots):
        rows, taken = slice(position, position + length), slice(first, first + length)
        ring[0][rows, :width].copy_(source[0][taken, :width])
        ring[1][rows, :width].copy_(source[1][taken, :width])
        ring[2][rows].copy_(source[2][taken])
        position += length


def _stretches(indices) -> list[list[int]]:
    """[first, length] of each run of consecutive integers in `indices`, in order."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, 1])
    return runs


def _concat(live: torch.Tensor, stored: list[torch.Tensor]) -> torch.Tensor:
    """The live rows, then the stored ones, in the live dtype: every row is copied once, converting on the way."""
    if stored[0].dtype == live.dtype:
        return torch.cat([live, *stored])  # one parallel kernel over views of the ring
    out = live.new_empty(live.shape[0] + sum(t.shape[0] for t in stored), live.shape[1])
    row = live.shape[0]
    for part in stored:
        out[row : row + part.shape[0]].copy_(part)
        row += part.shape[0]
    out[: live.shape[0]] = live  # autograd records this copy: gradients reach the live rows, never the memory
    return out
