"""The seven deep-metric-learning losses MemVir wraps, behind one call signature and a name registry.

Every loss is called as ``loss(embeddings[B, D], labels[B], class_weights[C, D]) -> 0-dim tensor``. The class
weights (proxies) live outside the loss because the Trainer owns them and MemVir appends past snapshots of them as
virtual classes: a loss sees (k+1)B rows, labels in [0, (k+1)C) and (k+1)C weight rows, and treats every weight row
as an ordinary class. Margins therefore apply to each row's own target, virtual targets included, and
cross-entropy-style losses average over all rows, as the MemVir reference code does.

How the rows are averaged (docs/method.md, "Reduction"): by default ("official") the mean over all (k+1)B rows, so
the live batch's share of the gradient is 1/(k+1). Passing ``classes_per_set=C`` groups the rows and the weight
rows into MemVir's sets (set j holds labels and weight rows in [jC, (j+1)C)), averages each set on its own and sums
the set means ("balanced"): the live batch keeps the weight it has without MemVir, and each virtual set adds a term.

Blocks (docs/method.md, "Blocks"): passing ``live=(B, C)`` (MemVir's output carries it as ``.live``) says that only
the first B rows and the first C weight rows may carry a gradient and that the rest, MemVir's memory, are constants.
The loss then never builds the whole (k+1)B x (k+1)C logit matrix: live rows x all classes and stored rows x live
classes are computed with autograd; stored rows x stored classes, which no gradient reaches and which enters only
each stored row's log-sum-exp (Proxy-Anchor: each stored proxy's sums over rows), is computed under ``no_grad``,
``chunk_rows`` stored rows at a time, and kept as one constant per row (per proxy). The value and the gradients are
those of the whole matrix. Without ``live`` every row and weight row is live, as for any plain call.

Cache (docs/method.md, "Blocks"): a stored row's constant is the log-sum-exp over the virtual sets' columns of the
log-sum-exps of one pair of stored steps, (rows of step a, weights of step b); a stored proxy's, over the row steps.
MemVir's selection moves by M+1 steps a call, so a pair recurs every M+1 calls while both steps stay selected and only
the pairs of the newest selected step are new (2k-1 of the k^2 blocks). Given MemVir's own ``live`` (a ``LiveBlock``
whose ``stored_sets`` names the stored steps), a loss whose stored logits are fixed functions of the stored data keeps
each pair's vector between calls and computes only the missing pairs: every loss but CurricularFace, whose running t
moves the logits at every call. Where MemVir names the step its live inputs are stored as (``stored_sets.live_step``,
``MemVir(live_pairs=True)``, where its memory keeps their values exactly) and the loss is given MemVir's output
unchanged, the live blocks computed with autograd at this call already hold that step's pairs with the selected steps
(live rows x each set's weights, each set's rows x live weights, live x live), which the calls that select it need:
they are kept from this call, so that in a run that calls the loss at every step no stored block is computed at all
(equal to the stored computation to float32's last digits; a resumed run takes them from the checkpoint, below, so
it reproduces the uninterrupted run). The kept pairs are dropped when the
memory's identity changes (a reset, a change of N or M or of the stored dtype), when the loss's settings, dtype or
device change, and when a step leaves the memory. They are saved with the loss's state (``state_dict``): a memory
loaded from a state keeps the identity it was saved with, so a run resumed from a checkpoint holding both takes them
up where it stopped (on a device: the first call's); a step at or past the loaded memory's step is dropped, as it will
be stored again with other contents. A plain ``(B, C)`` computes every stored block at every call.

Shares (docs/distributed.md): passing ``share=(part, parts)`` computes one of ``parts`` shares of the loss, whose
values and gradients summed over the parts are the whole loss's; under torchrun each rank computes share (rank, world
size) on the same gathered inputs, so each rank's logits are 1/G of the whole. A share holds a consecutive piece of
the live rows and one of each virtual set's rows (of all stored rows where the sets are unknown), against every
class; the reductions still divide by the counts of every row of the call (every share has all the labels), and
CurricularFace's t moves by the mean over every row, the same in every share. A set's piece is the same at every
call, so a share keeps the pairs of its own rows. Proxy-Anchor is a sum over proxies of logs of sums over all rows,
not a sum over rows: its shares take a piece of the live proxies and the same piece of each virtual set's, against
every row, its averages still over every proxy of the call; a share keeps the pairs of its own proxies.

``build_loss(name, **hparams)`` builds one by name (``LOSSES`` lists the names); hyper-parameters are ``scale``,
``margin`` (radians for ArcFace and CurricularFace; delta for Proxy-Anchor) and ``alpha`` (Proxy-Anchor).
"""

import copy
import functools
import inspect
import itertools
import math
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from memvir import _validate
from memvir._registry import Registry

__all__ = [
    "LOSSES",
    "ArcFaceLoss",
    "CosFaceLoss",
    "CurricularFaceLoss",
    "MetricLoss",
    "NormSoftmaxLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "SoftmaxLoss",
    "build_loss",
    "loss_defaults",
]

LOSS_REGISTRY: Registry[type["MetricLoss"]] = Registry("loss")
"""The losses ``build_loss`` builds, by name; registration order is the order of LOSSES."""


def _register(name: str):
    """Class decorator: make a loss buildable as ``build_loss(name)`` and tell it its name."""

    def add(cls: type["MetricLoss"]) -> type["MetricLoss"]:
        cls.name = name
        return LOSS_REGISTRY.register(name)(cls)

    return add


def _cosine_of_angle_plus_margin(target_cosines: torch.Tensor, margin: float) -> torch.Tensor:
    """cos(theta_y + m) for cos(theta_y) = ``target_cosines``, as cos*cos(m) - sin*sin(m).

    Not through acos, whose gradient is infinite at +-1. Where 1 - cos^2 is not positive (cos_y is exactly +-1, or
    rounding went past it) the sine is 0 with a zero gradient, by masking rather than by clamping: the sqrt's slope
    is infinite at 0, and whether a clamp passes a gradient *at* its bound differs between torch releases (2.11
    passes it, giving NaN; 2.14 does not).
    """
    squared_sines = 1.0 - target_cosines * target_cosines
    positive = squared_sines > 0
    # sqrt of 1 where masked, so its backward never sees the infinite slope that where() would multiply by 0
    sines = torch.where(positive, squared_sines.where(positive, 1.0).sqrt(), 0.0)
    return target_cosines * math.cos(margin) - sines * math.sin(margin)


def _additive_angular_margin(target_cosines: torch.Tensor, margin: float) -> torch.Tensor:
    """The ArcFace target cosine: cos(theta_y + m), with the insightface fallback past pi.

    Past theta_y + m = pi, cos(theta_y + m) would rise again as theta_y grows (the target would become *easier*
    the worse the row is); there the target is cos_y - sin(pi - m) * m instead, a CosFace-like penalty that keeps
    the target logit monotonic in theta_y (Deng et al. 2019, insightface).
    """
    with_margin = _cosine_of_angle_plus_margin(target_cosines, margin)
    fallback = target_cosines - math.sin(math.pi - margin) * margin
    return torch.where(target_cosines > math.cos(math.pi - margin), with_margin, fallback)


def _chunks(total: int, size: int) -> list[slice]:
    """Consecutive slices of at most ``size`` covering range(total)."""
    return [slice(start, start + size) for start in range(0, total, size)]


def _check_live(live, num_rows: int, num_classes: int) -> tuple[int, int]:
    """(B, C) from ``live`` (None: everything is live), or a ValueError that says what it must be."""
    if live is None:
        return num_rows, num_classes
    sizes = tuple(live) if isinstance(live, (tuple, list)) else ()
    valid = len(sizes) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in sizes)
    if not valid or not (1 <= sizes[0] <= num_rows and 1 <= sizes[1] <= num_classes):
        raise ValueError(
            f"live must be (live rows, live classes) with 1 <= rows <= {num_rows} and 1 <= classes <= {num_classes} "
            f"(MemVir's output gives it as .live), got {live!r}"
        )
    return sizes


def _live_inputs(live, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor):
    """MemVir's live inputs (memvir.memory.LiveInputs), where ``live`` is its output's and the call's inputs are that
    output unchanged; else None."""
    inputs = getattr(live, "inputs", None)
    return None if inputs is None else inputs.of(embeddings, labels, class_weights)


def _check_share(share) -> tuple[int, int]:
    """(part, parts) from ``share`` (None: the whole loss, (0, 1)), or a ValueError that says what it must be."""
    if share is None:
        return 0, 1
    sizes = tuple(share) if isinstance(share, (tuple, list)) else ()
    valid = len(sizes) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in sizes)
    if not valid or not 0 <= sizes[0] < sizes[1]:
        raise ValueError(f"share must be (part, parts) with 0 <= part < parts, under torchrun (rank, world size), "
                         f"got {share!r}")
    return sizes


def _part(total: int, part: int, parts: int) -> slice:
    """Piece ``part`` of range(total) cut into ``parts`` consecutive pieces whose sizes differ by one at most."""
    return slice(total * part // parts, total * (part + 1) // parts)


class _Blocks:
    """One call's inputs split at ``live`` = (B, C): the first B rows and C weight rows, which may carry gradient,
    and the rest (MemVir's memory), detached. For the losses that compare cosines the rows are L2-normalised here,
    once; the stored weight rows are not copied (a normalised copy would be as large as the memory's weights): their
    cosines are the products scaled by the weight rows' inverse norms. ``stored_sets``: which stored steps the
    virtual sets are (module docstring, "Cache"), None when unknown or when there is no stored class."""

    def __init__(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                 live: tuple[int, int], normalize: bool, stored_sets=None, live_inputs=None):
        num_rows, self.num_live_classes = live
        self.num_live_rows, self.num_classes = num_rows, class_weights.shape[0]
        self.labels, self.live_labels, self.stored_labels = labels, labels[:num_rows], labels[num_rows:]
        prepare = functools.partial(F.normalize, dim=1) if normalize else (lambda tensor: tensor)
        # MemVir's live inputs themselves where given (``live_inputs``): a slice of its concatenated output would make
        # autograd write a gradient as large as the whole output, the memory's part of it zeros
        if live_inputs is None:
            live_rows, live_columns = _first(embeddings, num_rows), _first(class_weights, self.num_live_classes)
        else:
            live_rows, live_columns = live_inputs.embeddings.to(embeddings.dtype), live_inputs.class_weights.to(
                embeddings.dtype)
        # where the labels are known to lie outside a block, its logits need no target put in (``_log_sum_exp``):
        # MemVir's output as it is has each stored row's label in its own set, and the live rows' among the live
        # classes where it checked them
        self.stored_targets_in_stored_sets = live_inputs is not None
        self.live_targets_in_live_classes = live_inputs is not None and live_inputs.labels_checked
        self.live_rows = prepare(live_rows)
        self.live_columns = prepare(live_columns)
        self._prepare, self._unprepared_stored_rows = prepare, embeddings[num_rows:].detach()
        self.num_stored_rows = self._unprepared_stored_rows.shape[0]
        with torch.no_grad():
            self.stored_columns = class_weights[self.num_live_classes :].detach()
            # F.normalize's divisor, max(norm, eps)
            self.stored_scales = 1.0 / self.stored_columns.norm(dim=1).clamp_min(1e-12) if normalize else None
        self.stored_sets = stored_sets if len(self.stored_columns) else None
        # the stored step the live rows and weight rows become (module docstring, "Cache"), where they are MemVir's
        # own inputs: what the live blocks give is then kept as that step's pairs with the stored ones
        self.live_step = None if self.stored_sets is None or live_inputs is None else self.stored_sets.live_step
        # every row's and class's blocks, and which share of the rows or classes these are (``share``)
        self.part = (0, 1)
        self._whole: _Blocks | None = None  # not self: a reference cycle would keep every step's blocks, and the
        # tensors they hold, until Python's cycle collector runs
        self.classes: torch.Tensor | None = None  # a class share's classes, by their numbers in the call; None: all

    @functools.cached_property
    def stored_rows(self) -> torch.Tensor:
        """The stored rows (normalised for the losses that compare cosines), made when first used: a share makes only
        its own."""
        with torch.no_grad():
            return self._prepare(self._unprepared_stored_rows)

    @property
    def whole(self) -> "_Blocks":
        """The blocks of every row and class of the call, of which these may be a share."""
        return self if self._whole is None else self._whole

    @property
    def num_all_rows(self) -> int:
        """The rows of the whole call, over every share: the official mean's divisor."""
        return self.whole.labels.shape[0]

    def share(self, part: int, parts: int) -> "_Blocks":
        """These blocks with share ``part`` of ``parts`` of the rows (module docstring, "Shares") against every class:
        a consecutive piece of the live rows and one of each virtual set's rows (of all stored rows where the sets are
        unknown), so that a set's piece, and what is kept of it between calls, is the same at every call. The blocks
        themselves for one part."""
        if parts == 1:
            return self
        share = copy.copy(self)
        share._whole, share.part = self, (part, parts)
        live = _part(self.num_live_rows, part, parts)
        share.num_live_rows = live.stop - live.start
        share.live_rows, share.live_labels = self.live_rows[live], self.live_labels[live]
        if self.stored_sets is None:
            pieces = [_part(self.num_stored_rows, part, parts)]
        else:
            set_rows = self.stored_set_rows()
            pieces = [slice(rows.start + piece.start, rows.start + piece.stop)
                      for rows in set_rows for piece in [_part(rows.stop - rows.start, part, parts)]]
            share.stored_sets = self.stored_sets._replace(rows=tuple(piece.stop - piece.start for piece in pieces))
        share.__dict__.pop("stored_rows", None)  # made from the share's own rows when first used
        share._unprepared_stored_rows = torch.cat([self._unprepared_stored_rows[piece] for piece in pieces])
        share.num_stored_rows = share._unprepared_stored_rows.shape[0]
        share.stored_labels = torch.cat([self.stored_labels[piece] for piece in pieces])
        share.labels = torch.cat([share.live_labels, share.stored_labels])
        return share

    def class_share(self, part: int, parts: int) -> "_Blocks":
        """These blocks with share ``part`` of ``parts`` of the classes (module docstring, "Shares") against every row:
        a consecutive piece of the live classes and the same piece of each virtual set's (of all stored classes where
        they are not sets of the live classes' count), so that a set's piece, and what is kept of it between calls, is
        the same at every call. The share numbers its classes from 0, live ones first (``classes`` holds their
        numbers in the call), and a label of a class outside it becomes -1, which matches none. The blocks themselves
        for one part."""
        if parts == 1:
            return self
        share = copy.copy(self)
        share._whole, share.part = self, (part, parts)
        live, num_stored = self.num_live_classes, self.stored_columns.shape[0]
        groups = [slice(0, live)] + ([slice(start, start + live) for start in range(live, live + num_stored, live)]
                                     if num_stored % live == 0 else [slice(live, live + num_stored)])
        pieces = [slice(group.start + piece.start, group.start + piece.stop)
                  for group in groups for piece in [_part(group.stop - group.start, part, parts)]]
        device = self.labels.device
        share.classes = torch.cat([torch.arange(piece.start, piece.stop, device=device) for piece in pieces])
        share.num_live_classes, share.num_classes = pieces[0].stop - pieces[0].start, share.classes.shape[0]
        share.live_columns = self.live_columns[pieces[0]]
        stored = [slice(piece.start - live, piece.stop - live) for piece in pieces[1:]] or [slice(0, 0)]
        share.stored_columns = torch.cat([self.stored_columns[piece] for piece in stored])
        if self.stored_scales is not None:
            share.stored_scales = torch.cat([self.stored_scales[piece] for piece in stored])
        numbers = self.labels.new_full((self.num_classes,), -1)
        numbers[share.classes] = torch.arange(share.num_classes, device=device)
        share.labels = numbers[self.labels]
        share.live_labels, share.stored_labels = share.labels[: self.num_live_rows], share.labels[self.num_live_rows :]
        return share

    def stored_set_rows(self) -> list[slice]:
        """Each virtual set's rows among the stored rows, j = 1..k."""
        ends = list(itertools.accumulate(self.stored_sets.rows))
        return [slice(end - rows, end) for end, rows in zip(ends, self.stored_sets.rows, strict=True)]

    def stored_set_columns(self, index: int) -> slice:
        """Virtual set ``index``'s (0-based) weight rows among the stored ones."""
        return slice(index * self.num_live_classes, (index + 1) * self.num_live_classes)

    def stored_similarities(self, rows: torch.Tensor, columns: slice = slice(None)) -> torch.Tensor:
        """[R, kC] the similarities of ``rows`` to the stored classes (or to the stored ``columns`` among them; a
        gradient reaches only ``rows``)."""
        products = rows @ self.stored_columns[columns].T
        # in place even under autograd: the product's backward keeps its inputs, not the product
        return products if self.stored_scales is None else products.mul_(self.stored_scales[columns])

    def target_columns(self, labels: torch.Tensor) -> torch.Tensor:
        """[R, D] each label's (normalised) weight row: a live one carries gradient, a stored one does not."""
        if not len(self.stored_columns):
            return self.live_columns[labels]
        live = self.num_live_classes
        stored = (labels - live).clamp(min=0)
        stored_columns = self.stored_columns[stored]
        if self.stored_scales is not None:
            stored_columns = stored_columns * self.stored_scales[stored, None]
        return torch.where((labels < live)[:, None], self.live_columns[labels.clamp(max=live - 1)], stored_columns)

    def target_similarities(self, stored: torch.Tensor | None = None) -> torch.Tensor:
        """[(k+1)B] each row's similarity (cosine, or dot product) to its own class, live rows first; ``stored``: the
        stored rows' where they are known already (kept: module docstring, "Cache")."""
        if stored is None:
            stored = (self.stored_rows * self.target_columns(self.stored_labels)).sum(1)
        return torch.cat([(self.live_rows * self.target_columns(self.live_labels)).sum(1), stored])

    def own_set_similarities(self, index: int) -> torch.Tensor:
        """[rows of the set] the similarity of virtual set ``index``'s (0-based) rows to their own classes, which are
        that set's stored weight rows: a constant."""
        rows = self.stored_set_rows()[index]
        targets = self.stored_labels[rows] - self.num_live_classes  # within the set's own weight rows
        with torch.no_grad():
            target_columns = self.stored_columns[targets]
            if self.stored_scales is not None:
                target_columns = target_columns * self.stored_scales[targets, None]
            return (self.stored_rows[rows] * target_columns).sum(1)


def _first(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` rows; the tensor itself when that is all of it (a slice's backward would write a gradient
    as large as the whole input)."""
    return tensor if count == tensor.shape[0] else tensor[:count]


def _with_targets(logits: torch.Tensor, local_labels: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """``logits`` of one block of columns with each row's target entry, where ``local_labels`` (the labels counted
    from the block's first column) puts it inside the block, replaced by the row's target logit; out of place, so
    autograd sees both parts."""
    width = logits.shape[1]
    index = local_labels.clamp(0, width - 1)[:, None]
    inside = (local_labels >= 0) & (local_labels < width)
    values = torch.where(inside, target_logits, logits.gather(1, index).squeeze(1))
    return logits.scatter(1, index, values[:, None])


@functools.cache
def _hyper_parameter_names(cls: type) -> tuple[str, ...]:
    """The named parameters of ``cls.__init__``, which a loss keeps as attributes of the same names."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in parameters if p.kind in named and p.name != "self")


# where the device lies in the settings the kept pairs hold for (`_StoredPairs.begin_call`)
_DEVICE = 4
_PAIRS_STATE_VERSION = 1


def _map_tensors(value, function):
    """`function` of each tensor of a kept value: a tensor, or Proxy-Anchor's (pull sums or None, push sums)."""
    if isinstance(value, tuple):
        return tuple(_map_tensors(part, function) for part in value)
    return None if value is None else function(value)


class _StoredPairs:
    """The per-pair constants of the stored x stored block kept between calls (module docstring, "Cache"):
    ``values[a][b]``, what the rows of stored step a give against the weights of stored step b, for the memory and
    the settings of ``settings``, and ``own[a]``, step a's rows' similarities to their own classes. A call first drops
    what no longer holds (``begin_call``), then looks pairs up and adds the missing ones; ``computed`` counts the
    blocks (one set's rows x one set's classes) the call computed."""

    def __init__(self):
        self.settings: tuple | None = None
        self.values: dict[int, dict[int, object]] = {}
        self.own: dict[int, torch.Tensor] = {}  # a step's rows' similarities to their own classes
        self.computed = 0

    def begin_call(self, sets, settings: tuple) -> None:
        settings = (sets.memory, *settings)
        if self.settings is not None and self.settings[_DEVICE] is None and (
                self.settings[:_DEVICE] + self.settings[_DEVICE + 1:] == settings[:_DEVICE] + settings[_DEVICE + 1:]):
            self._move_to(settings[_DEVICE])  # read from a state: on the device of the first call that uses them
        if settings != self.settings:
            self.values.clear()
            self.own.clear()
            self.settings = settings

        def gone(step):  # left the memory, or not yet stored again by a memory loaded from an earlier state
            return step < sets.oldest or (sets.call is not None and step >= sets.call)

        for kept in (self.values, self.own):
            for step in [step for step in kept if gone(step)]:
                del kept[step]
        for columns in self.values.values():
            for step in [step for step in columns if gone(step)]:
                del columns[step]
        self.computed = 0

    def _mapped(self, function) -> tuple[dict, dict]:
        """(own, values) with `function` applied to every tensor they hold."""
        return ({step: _map_tensors(value, function) for step, value in self.own.items()},
                {row: {column: _map_tensors(value, function) for column, value in columns.items()}
                 for row, columns in self.values.items()})

    def _move_to(self, device: torch.device) -> None:
        self.own, self.values = self._mapped(lambda tensor: tensor.to(device))
        self.settings = (*self.settings[:_DEVICE], device, *self.settings[_DEVICE + 1:])

    def to_state(self) -> dict | None:
        """The kept pairs as tensors and plain containers (a checkpoint loads them without unpickling code), each
        value a compact copy (a kept value may be a view into a larger block); None when nothing is kept."""
        if self.settings is None:
            return None
        memory, loss_type, hyper_parameters, dtype, _, part = self.settings
        own, values = self._mapped(lambda tensor: tensor.detach().clone())
        return {"version": _PAIRS_STATE_VERSION, "memory": memory, "loss": loss_type.__name__,
                "hyper_parameters": list(hyper_parameters), "dtype": str(dtype).removeprefix("torch."),
                "part": list(part), "own": own, "values": values}

    def load_state(self, state: dict | None, loss_type: type) -> None:
        """Keep the pairs of ``state`` (``to_state``) for the calls that name the same memory and settings (their
        device: that of the first such call). ValueError, changing nothing, for a state that is not such a dict."""
        if state is None:
            self.settings, self.values, self.own = None, {}, {}
            return
        fits = (isinstance(state, dict) and state.get("version") == _PAIRS_STATE_VERSION
                and isinstance(state.get("memory"), str) and isinstance(state.get("own"), dict)
                and isinstance(state.get("values"), dict) and all(isinstance(columns, dict) for columns in
                                                                   state["values"].values())
                and isinstance(getattr(torch, str(state.get("dtype")), None), torch.dtype))
        if not fits:
            raise ValueError("the loss's state holds its kept pairs in a form this version does not read: load a "
                             "state saved by this version, or drop its '_extra_state' entry to compute them again")
        if state.get("loss") != loss_type.__name__:  # another loss's pairs: nothing to keep
            self.settings, self.values, self.own = None, {}, {}
            return
        self.settings = (state["memory"], loss_type, tuple(state["hyper_parameters"]), getattr(torch, state["dtype"]),
                         None, tuple(state["part"]))
        self.own = dict(state["own"])
        self.values = {row: dict(columns) for row, columns in state["values"].items()}

    def missing(self, steps: tuple[int, ...]) -> tuple[list[int], dict[int, list[int]]]:
        """The missing pairs among ``steps`` (the virtual sets, by index): (row sets to compute against every set,
        {column set: the other row sets it lacks}). A row set that lacks most pairs (the newest selected step) is
        computed whole, in one product; the other row sets lack a pair with the newest step only, and those are
        computed column set by column set, each in one product over all the row sets that lack it."""
        lacking = [[b for b, column in enumerate(steps) if column not in self.values.get(row, {})]
                   for row in steps]
        whole = [a for a, columns in enumerate(lacking) if 2 * len(columns) > len(steps)]
        by_column: dict[int, list[int]] = {}
        for a, columns in enumerate(lacking):
            if a not in whole:
                for b in columns:
                    by_column.setdefault(b, []).append(a)
        return whole, by_column

    def keep(self, row_step: int, column_step: int, value, computed: bool = True) -> None:
        """Keep one pair's value; ``computed``: made for this (a stored block), not taken from the live blocks."""
        self.values.setdefault(row_step, {})[column_step] = value
        self.computed += computed


def _row_chunks(set_rows: list[slice], chosen: list[int], size: int):
    """The stored rows of the ``chosen`` sets (indices into ``set_rows``) in chunks of at most ``size`` rows: each
    chunk a list of pieces (set, first row, end row), a set cut where it does not fit in one chunk."""
    pieces = [(a, start, min(start + size, set_rows[a].stop))
              for a in chosen for start in range(set_rows[a].start, set_rows[a].stop, size)]
    chunk, count = [], 0
    for a, start, stop in pieces:
        if chunk and count + stop - start > size:
            yield chunk
            chunk, count = [], 0
        chunk.append((a, start, stop))
        count += stop - start
    if chunk:
        yield chunk


def _scatter_pieces(out: dict, pieces, set_rows: list[slice], values: torch.Tensor) -> None:
    """Write ``values`` [K, rows of ``pieces``] into ``out[set]`` [K, rows of the set] where each piece lies."""
    position = 0
    for a, start, stop in pieces:
        first = start - set_rows[a].start
        out[a][:, first : first + stop - start] = values[:, position : position + stop - start]
        position += stop - start


def _gather_rows(tensor: torch.Tensor, pieces) -> torch.Tensor:
    """The rows of ``tensor`` in ``pieces`` ((set, start, stop) each), one view where they are consecutive."""
    if all(previous[2] == following[1] for previous, following in itertools.pairwise(pieces)):
        return tensor[pieces[0][1] : pieces[-1][2]]
    return torch.cat([tensor[start:stop] for _, start, stop in pieces])


class MetricLoss(nn.Module, ABC):
    """Base of every loss here: checks the uniform call, picks the compute dtype, splits the inputs into their live and
    stored blocks, delegates to ``compute``.

    Subclasses implement ``compute(blocks, classes_per_set)`` on validated inputs of one floating dtype (float32 or
    float64) and return a 0-dim tensor. Hyper-parameters are plain attributes; derived constants are computed per
    call, so a changed attribute (live control) takes effect at the next step.
    """

    name: str = ""
    # Whether the Trainer hands this loss the embedding head's raw output rather than unit vectors: only the paper's
    # Softmax (its eq. 2) uses the embeddings' norm; every other loss normalises or is meant for unit vectors.
    takes_raw_embeddings: bool = False
    # Whether the logits are made of cosines (rows normalised) rather than of raw dot products.
    compares_cosines: bool = True
    # Checking the labels against the class count costs a host sync per call (a GPU waits for it); a training loop
    # that checks its labels on the CPU turns it off on its loss.
    check_values: bool = True
    # Stored rows per chunk of the stored x stored block: its temporaries hold chunk_rows x kC logits, whatever k.
    chunk_rows: int = 128
    # Whether the stored x stored block is a fixed function of the stored data and the loss's settings, so that its
    # per-pair constants may be kept between calls (module docstring, "Cache").
    keeps_stored_pairs: bool = True
    # What a share of the loss (``share``) takes a piece of: "rows" (against every class) for a loss that is a sum
    # over rows, "classes" (against every row) for one that is a sum over classes (module docstring, "Shares").
    shares_by: str = "rows"

    def __init__(self):
        super().__init__()
        self._stored_pairs = _StoredPairs()

    def get_extra_state(self) -> dict | None:
        """The kept pairs (module docstring, "Cache"), saved with the loss's state: a run resumed from a checkpoint
        that holds them and MemVir's memory (which keeps its identity) computes what the uninterrupted run does, to
        the last digit, where it would otherwise compute them again from the stored data."""
        return self._stored_pairs.to_state()

    def set_extra_state(self, state: dict | None) -> None:
        self._stored_pairs.load_state(state, type(self))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a state saved before the kept pairs were saved holds none: they are computed again
        state_dict.setdefault(prefix + "_extra_state", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                classes_per_set: int | None = None, *, live: tuple[int, int] | None = None,
                share: tuple[int, int] | None = None) -> torch.Tensor:
        """Loss of ``embeddings`` [B, D] with integer ``labels`` [B] in [0, C) against ``class_weights`` [C, D].

        ``classes_per_set``: None for the mean over all rows; C (a divisor of the number of weight rows) for the
        balanced reduction over MemVir's sets (module docstring).
        ``live``: (rows, classes), how many of the first rows and weight rows may carry a gradient; the rest are
        constants, and the loss spends no gradient work on them (module docstring, "Blocks"). None: all of them.
        ``share``: (part, parts), under torchrun (rank, world size): this call computes share ``part`` of the loss;
        the ``parts`` shares' values and gradients sum to the whole loss's (module docstring, "Shares"). None: the
        whole loss, as (0, 1).
        """
        _validate.check_inputs(embeddings, labels, class_weights, self.check_values)
        if classes_per_set is not None:
            _validate.check_classes_per_set(classes_per_set, class_weights.shape[0])
        part, parts = _check_share(share)
        stored_sets = getattr(live, "stored_sets", None) if self.keeps_stored_pairs else None
        live_block, live = live, _check_live(live, embeddings.shape[0], class_weights.shape[0])
        # float16/bfloat16 exp/logsumexp at scale 64 overflow or lose the margin; float64 stays float64 so that
        # gradcheck and float64 reference tests see the exact computation.
        dtype = torch.promote_types(torch.promote_types(embeddings.dtype, class_weights.dtype), torch.float32)
        live_inputs = _live_inputs(live_block, embeddings, labels, class_weights)
        blocks = _Blocks(embeddings.to(dtype), labels.long(), class_weights.to(dtype), live, self.compares_cosines,
                         stored_sets, live_inputs)
        if blocks.stored_sets is not None:
            self._check_stored_sets(blocks)
        blocks = blocks.share(part, parts) if self.shares_by == "rows" else blocks.class_share(part, parts)
        if blocks.stored_sets is not None:
            self._stored_pairs.begin_call(blocks.stored_sets, self._pair_settings(blocks))
        return self.compute(blocks, classes_per_set)

    def _check_stored_sets(self, blocks: _Blocks) -> None:
        """ValueError unless the stored rows and weight rows are the sets ``live.stored_sets`` names, each row's label
        in its own set (the label check, as the other value checks, only with ``check_values``: it costs a host
        sync): the kept pairs hold for MemVir's output as it is, not for one whose labels or weights were changed."""
        sets, live_classes = blocks.stored_sets, blocks.num_live_classes
        shapes_fit = (len(sets.steps) == len(sets.rows) and sum(sets.rows) == blocks.num_stored_rows
                      and len(sets.steps) * live_classes == len(blocks.stored_columns))
        labels_fit = True
        if shapes_fit and self.check_values:
            rows = torch.tensor(sets.rows, device=blocks.labels.device)
            own_sets = torch.arange(1, len(sets.rows) + 1, device=rows.device).repeat_interleave(rows)
            labels_fit = bool(torch.equal(blocks.stored_labels // live_classes, own_sets))
        if not (shapes_fit and labels_fit):
            raise ValueError(
                f"live names MemVir's stored sets (steps {list(sets.steps)}, rows {list(sets.rows)}) but the inputs "
                f"are not that output ({blocks.num_stored_rows} stored rows, {len(blocks.stored_columns)} stored "
                "weight rows, each row's label in its own set): pass MemVir's output as it is, or live as a plain "
                "(rows, classes) tuple for inputs changed after MemVir"
            )

    def _pair_settings(self, blocks: _Blocks) -> tuple:
        """What the kept pairs were computed under besides the stored data: the loss, its hyper-parameters (live
        control may change them), the compute dtype and device."""
        names = _hyper_parameter_names(type(self))
        return (type(self), tuple(getattr(self, name) for name in names), blocks.stored_rows.dtype,
                blocks.stored_rows.device, blocks.part)

    @abstractmethod
    def compute(self, blocks: _Blocks, classes_per_set: int | None) -> torch.Tensor:
        """The loss on validated inputs, split into their blocks: float32/float64 tensors of one dtype, int64 labels
        in range."""


class _CrossEntropyLoss(MetricLoss):
    """A loss that is a softmax cross-entropy over per-class logits; subclasses say how a similarity (cosine, or dot
    product for Softmax) becomes a logit, for each row's own class and for the others.

    Row i's loss is log sum_j exp(z_ij) - z_iy, its log-sum-exp taken block by block and the blocks joined by
    logaddexp. A stored row's log-sum-exp over the stored classes, and its target logit there, are constants.
    """

    @abstractmethod
    def target_logits(self, target_similarities: torch.Tensor) -> torch.Tensor:
        """[R] each row's target logit, margin applied, from its similarity to its own class."""

    @abstractmethod
    def other_logits(self, similarities: torch.Tensor, target_similarities: torch.Tensor) -> torch.Tensor:
        """[R, K] the logits of a block of similarities as classes other than the row's own (where a row's own class
        lies in the block, that entry is replaced by its target logit afterwards)."""

    def update_statistics(self, blocks: _Blocks, target_similarities: torch.Tensor) -> None:
        """Once per call, before any logit is made: where a loss moves a running statistic (CurricularFace's t).
        ``target_similarities``: those of the rows of ``blocks``, which may be a share of the call's rows."""

    def compute(self, blocks, classes_per_set):
        similarities = blocks.target_similarities(self._kept_own_similarities(blocks))
        self.update_statistics(blocks, similarities)
        targets = self.target_logits(similarities)
        live = slice(None, blocks.num_live_rows)
        stored = slice(blocks.num_live_rows, None)
        log_normalisers = torch.cat([
            self._log_normalisers(blocks, blocks.live_rows, blocks.live_labels, similarities[live], targets[live]),
            self._log_normalisers(blocks, blocks.stored_rows, blocks.stored_labels, similarities[stored],
                                  targets[stored], constant_stored_block=True),
        ])
        if blocks.live_step is not None:
            self._stored_pairs.own[blocks.live_step] = similarities[live].detach()
        per_row = log_normalisers - targets
        # the divisors count every row of the call, not only this share's (module docstring, "Shares")
        if classes_per_set is None:
            return per_row.sum() / blocks.num_all_rows
        return _sum_of_set_means(per_row, blocks.labels // classes_per_set, blocks.num_classes // classes_per_set,
                                 blocks.whole.labels // classes_per_set)

    def _kept_own_similarities(self, blocks):
        """[kB] the stored rows' similarities to their own classes, kept a step at a time (module docstring,
        "Cache"); None where nothing is kept (they are computed with the rest)."""
        if blocks.stored_sets is None:
            return None
        kept = self._stored_pairs.own
        for index, step in enumerate(blocks.stored_sets.steps):
            if step not in kept:
                kept[step] = blocks.own_set_similarities(index)
        return torch.cat([kept[step] for step in blocks.stored_sets.steps])

    def _log_normalisers(self, blocks, rows, labels, similarities, targets, constant_stored_block=False):
        """[R] log sum_j exp(z_ij) of ``rows`` over every class: the live classes' block, then the stored classes'
        (for stored rows a constant, made without autograd a chunk of rows at a time). Where the live rows become a
        stored step (``blocks.live_step``), each (row step, weight step) pair's log-sum-exps among these blocks are
        kept for the calls that select that step (module docstring, "Cache"): no stored block is computed for them
        again."""
        # a stored row's target is among the stored classes, a live row's (where known) among the live ones
        targets_in_live = not (constant_stored_block and blocks.stored_targets_in_stored_sets)
        targets_in_stored = constant_stored_block or not blocks.live_targets_in_live_classes
        # where the other logits are the similarities times a factor, the rows carry it into the products of the blocks
        # with gradients: a pass over each block, and one over its gradient, fewer
        factor = self.other_logit_factor()
        scaled_rows = rows if factor is None else rows * factor

        def logits_of(products):
            return products if factor is not None else self.other_logits(products, similarities)

        live_block = self._logits_log_sum_exp(logits_of(scaled_rows @ blocks.live_columns.T), labels, targets,
                                              targets_in_live)
        parts = [live_block]
        pairs, steps, live_step = self._stored_pairs, blocks.stored_sets and blocks.stored_sets.steps, blocks.live_step
        if live_step is not None and not constant_stored_block:  # the live rows against the live weights
            pairs.keep(live_step, live_step, live_block.detach(), computed=False)
        elif live_step is not None:  # each stored set's rows against the live weights
            kept = live_block.detach()
            for step, set_rows in zip(steps, blocks.stored_set_rows(), strict=True):
                pairs.keep(step, live_step, kept[set_rows], computed=False)
        if len(blocks.stored_columns):
            stored_labels = labels - blocks.num_live_classes
            if constant_stored_block and blocks.stored_sets is not None:
                parts.append(self._kept_log_sum_exp(blocks, stored_labels, similarities, targets))
            elif constant_stored_block:
                parts.append(self._chunked_log_sum_exp(blocks, rows, stored_labels, similarities, targets))
            elif live_step is not None:  # the live rows against each stored set's weights, one pair a set
                logits = logits_of(blocks.stored_similarities(scaled_rows))
                if targets_in_stored:
                    logits = _with_targets(logits, stored_labels, targets)
                per_set = torch.logsumexp(logits.view(rows.shape[0], len(steps), blocks.num_live_classes), dim=2)
                kept = per_set.detach()
                for index, step in enumerate(steps):
                    pairs.keep(live_step, step, kept[:, index], computed=False)
                parts.append(torch.logsumexp(per_set, dim=1))
            else:
                parts.append(self._logits_log_sum_exp(logits_of(blocks.stored_similarities(scaled_rows)),
                                                      stored_labels, targets, targets_in_stored))
        return functools.reduce(torch.logaddexp, parts)

    def other_logit_factor(self) -> float | None:
        """a where ``other_logits(s, ...)`` is a * s for every block of similarities, else None."""
        return None

    def _log_sum_exp(self, block, local_labels, similarities, targets):
        """[R] log-sum-exp of the logits of one block of similarities (rows x some classes, ``local_labels`` counted
        from its first class), each row's target entry, where it lies in the block, carrying its margin."""
        return self._logits_log_sum_exp(self.other_logits(block, similarities), local_labels, targets)

    def _logits_log_sum_exp(self, logits, local_labels, targets, may_hold_targets=True):
        """``_log_sum_exp`` of a block's logits. ``may_hold_targets`` False: no row's target lies in the block (known
        from where the labels come), so none is looked for (two passes over the block and two over its gradient
        fewer)."""
        if may_hold_targets:
            logits = _with_targets(logits, local_labels, targets)
        return torch.logsumexp(logits, dim=1)

    def _chunked_log_sum_exp(self, blocks, rows, local_labels, similarities, targets):
        """``_log_sum_exp`` of stored ``rows`` against the stored classes, a block no gradient reaches: made
        ``chunk_rows`` rows at a time, never whole."""
        out = rows.new_empty(rows.shape[0])
        with torch.no_grad():
            for part in _chunks(rows.shape[0], self.chunk_rows):
                out[part] = self._log_sum_exp(blocks.stored_similarities(rows[part]), local_labels[part],
                                              similarities[part], targets[part])
        return out

    def _kept_log_sum_exp(self, blocks, local_labels, similarities, targets):
        """``_chunked_log_sum_exp`` of the stored rows from the kept pairs (module docstring, "Cache"): each pair of
        stored steps gives every row of the first its log-sum-exp over the second's classes (the row's own target
        among them where the two are one step); the missing pairs are computed and kept, and each row's pairs joined
        by a log-sum-exp over the sets."""
        pairs, steps, width = self._stored_pairs, blocks.stored_sets.steps, blocks.num_live_classes
        set_rows = blocks.stored_set_rows()
        whole, by_column = pairs.missing(steps)
        with torch.no_grad():
            # a row set lacking most pairs: against every stored class, chunk_rows rows at a time
            per_pair = {a: blocks.stored_rows.new_empty(len(steps), set_rows[a].stop - set_rows[a].start)
                        for a in whole}
            for chunk in _row_chunks(set_rows, whole, self.chunk_rows):
                rows, labels, row_similarities, row_targets = (_gather_rows(tensor, chunk) for tensor in (
                    blocks.stored_rows, local_labels, similarities, targets))
                logits = self.other_logits(blocks.stored_similarities(rows), row_similarities)
                logits = _with_targets(logits, labels, row_targets)
                _scatter_pieces(per_pair, chunk, set_rows, torch.logsumexp(logits.view(len(rows), -1, width), 2).T)
            for a in whole:
                for b, column_step in enumerate(steps):
                    pairs.keep(steps[a], column_step, per_pair[a][b])
            # the other missing pairs, one set's classes at a time against every row set that lacks them
            for b, row_sets in by_column.items():
                columns = blocks.stored_set_columns(b)
                per_row_set = {a: blocks.stored_rows.new_empty(1, set_rows[a].stop - set_rows[a].start)
                               for a in row_sets}
                for chunk in _row_chunks(set_rows, row_sets, self.chunk_rows * len(steps)):
                    rows, labels, row_similarities, row_targets = (_gather_rows(tensor, chunk) for tensor in (
                        blocks.stored_rows, local_labels, similarities, targets))
                    logits = self.other_logits(blocks.stored_similarities(rows, columns), row_similarities)
                    logits = _with_targets(logits, labels - columns.start, row_targets)
                    _scatter_pieces(per_row_set, chunk, set_rows, torch.logsumexp(logits, 1)[None])
                for a in row_sets:
                    pairs.keep(steps[a], steps[b], per_row_set[a][0])
            per_row_and_set = torch.cat([torch.stack([pairs.values[row_step][column_step] for column_step in steps],
                                                     dim=1) for row_step in steps])
            return torch.logsumexp(per_row_and_set, dim=1)


def _sum_of_set_means(values: torch.Tensor, sets: torch.Tensor, num_sets: int,
                      all_sets: torch.Tensor) -> torch.Tensor:
    """The sum over sets of the mean of ``values`` within each set (``sets``: each entry's set index), each set's
    count taken over ``all_sets`` (the set index of every row of the call, of which ``values`` may be a share); a set
    with no entry adds nothing. Shapes only, no host sync, so it costs a training step no wait on a GPU."""
    totals = values.new_zeros(num_sets).index_add(0, sets, values)
    # not torch.bincount: on a GPU it reads the largest index back to the host to size its output
    counts = values.new_zeros(num_sets).index_add_(0, all_sets, values.new_ones(all_sets.shape))
    return (totals / counts.clamp_min(1)).sum()


@_register("softmax")
class SoftmaxLoss(_CrossEntropyLoss):
    """Plain softmax cross-entropy, the paper's Softmax (its eq. 2): logits = x @ W^T on the un-normalised
    embeddings, no normalisation, no bias. The Trainer hands it the embedding head's raw output."""

    takes_raw_embeddings = True
    compares_cosines = False

    def target_logits(self, target_similarities):
        return target_similarities

    def other_logits(self, similarities, target_similarities):
        return similarities


@_register("norm-softmax")
class NormSoftmaxLoss(_CrossEntropyLoss):
    """Normalised softmax: logits = scale * cos(x, w) (the MemVir reference setting, scale 23)."""

    def __init__(self, scale: float = 23.0):
        super().__init__()
        self.scale = _validate.positive("scale", scale)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"

    def target_logits(self, target_similarities):
        return self.scale * target_similarities

    def other_logit_factor(self):
        return self.scale

    def other_logits(self, similarities, target_similarities):
        return self.scale * similarities


@_register("cosface")
class CosFaceLoss(_CrossEntropyLoss):
    """CosFace / large-margin cosine loss (Wang et al. 2018): target logit scale*(cos_y - margin)."""

    def __init__(self, scale: float = 64.0, margin: float = 0.35):
        super().__init__()
        self.scale = _validate.positive("scale", scale)
        self.margin = _validate.non_negative("margin", margin)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, margin={self.margin}"

    def target_logits(self, target_similarities):
        return self.scale * (target_similarities - self.margin)

    def other_logit_factor(self):
        return self.scale

    def other_logits(self, similarities, target_similarities):
        return self.scale * similarities


@_register("arcface")
class ArcFaceLoss(_CrossEntropyLoss):
    """ArcFace / additive angular margin (Deng et al. 2019): target logit scale*cos(theta_y + margin)."""

    def __init__(self, scale: float = 64.0, margin: float = 0.5):
        super().__init__()
        self.scale = _validate.positive("scale", scale)
        self.margin = _validate.angular_margin(margin)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, margin={self.margin}"

    def target_logits(self, target_similarities):
        return self.scale * _additive_angular_margin(target_similarities, self.margin)

    def other_logit_factor(self):
        return self.scale

    def other_logits(self, similarities, target_similarities):
        return self.scale * similarities


@_register("curricularface")
class CurricularFaceLoss(_CrossEntropyLoss):
    """CurricularFace (Huang et al. CVPR 2020), following the authors' official code.

    Target logit as ArcFace (same fallback). A non-target class j is "hard" for a row when
    cos_j > cos(theta_y + m) (the raw margin cosine, as in the official code); its logit becomes cos_j * (t + cos_j),
    so hard negatives weigh more as training advances. ``t`` is a running mean of the target cosines, a buffer
    (so it is saved in ``state_dict`` and a resumed run keeps its curriculum) that starts at 0 and, in training mode
    only, is updated before use in the same call: t <- 0.01 * mean_i(cos_yi) + 0.99 * t. With MemVir the mean runs
    over all rows, virtual ones included (under either reduction), and the hard-negative rule applies to every row,
    stored ones included. In eval mode t is used but not changed.

    Gradients (the official choice): t is a statistic and is detached; the hard-negative term passes gradient
    through both factors of cos_j * (t + cos_j), i.e. d/dcos_j = t + 2 cos_j. The hard/easy mask itself carries none.
    """

    # its stored logits move with t at every call: nothing of them holds for the next
    keeps_stored_pairs = False

    def __init__(self, scale: float = 64.0, margin: float = 0.5):
        super().__init__()
        self.scale = _validate.positive("scale", scale)
        self.margin = _validate.angular_margin(margin)
        self.register_buffer("t", torch.zeros(()))

    def extra_repr(self) -> str:
        return f"scale={self.scale}, margin={self.margin}"

    def update_statistics(self, blocks, target_similarities):
        if self.training:
            with torch.no_grad():
                if blocks.whole is not blocks:  # a share: t moves by every row's mean, the same in every share
                    target_similarities = blocks.whole.target_similarities()
                self.t.copy_(0.01 * target_similarities.mean() + 0.99 * self.t.to(target_similarities.dtype))

    def target_logits(self, target_similarities):
        return self.scale * _additive_angular_margin(target_similarities, self.margin)

    def other_logits(self, similarities, target_similarities):
        t = self.t.detach().to(device=similarities.device, dtype=similarities.dtype)
        hard = similarities > _cosine_of_angle_plus_margin(target_similarities, self.margin)[:, None]
        return self.scale * torch.where(hard, similarities * (t + similarities), similarities)


@_register("proxy-nca")
class ProxyNCALoss(_CrossEntropyLoss):
    """Proxy-NCA as in the MemVir reference: logits = -scale * ||x^ - w^||^2 over normalised vectors, CE.

    For unit vectors ||x^ - w^||^2 = 2 - 2 cos, and softmax ignores the constant, so this equals Norm-softmax at
    scale 2*scale; it is computed through that identity (no [B, C, D] difference tensor). The clamp only removes
    rounding below zero.
    """

    def __init__(self, scale: float = 12.0):
        super().__init__()
        self.scale = _validate.positive("scale", scale)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"

    def _logits(self, cosines):
        return -self.scale * (2.0 - 2.0 * cosines).clamp_min(0.0)

    def target_logits(self, target_similarities):
        return self._logits(target_similarities)

    def other_logits(self, similarities, target_similarities):
        return self._logits(similarities)


@_register("proxy-anchor")
class ProxyAnchorLoss(MetricLoss):
    """Proxy-Anchor (Kim et al. CVPR 2020), following the authors' official code.

    With s = cos, P+ = proxies with at least one positive row in the batch, P = all C proxies:
    L = 1/|P+| sum_{p in P+} log(1 + sum_{x: y=p} exp(-alpha (s(x,p) - margin)))
      + 1/|P|  sum_{p in P}  log(1 + sum_{x: y!=p} exp( alpha (s(x,p) + margin))).
    Each log(1 + sum exp) is a logsumexp with an extra zero term, which is stable at alpha = 32 and makes a proxy
    without positives (or negatives) contribute exactly log(1 + 0) = 0 with a zero, not NaN, gradient.

    Balanced reduction (``classes_per_set=C``): this loss averages over proxies, not rows, so the sets are sets of
    proxies. Both averages are taken within each set, live proxies among the live ones and each virtual set's among
    its own, and the sets' terms summed: L = sum_j [pull_j / |P+_j| + push_j / C]. Every row still counts as a
    negative of every proxy of another class, virtual ones included, exactly as in the official reduction.

    In blocks, a live proxy's sums run over every row with autograd; a stored proxy's sums over the stored rows are
    constants (made without autograd a chunk of rows at a time, the extra zero term among them) and only its sums over
    the live rows carry a gradient. A share (``share``) computes its piece of the proxies against every row.
    """

    # a sum over proxies of logs of sums over all rows: a share takes a piece of the proxies
    shares_by = "classes"

    def __init__(self, margin: float = 0.1, alpha: float = 32.0):
        super().__init__()
        self.margin = _validate.non_negative("margin", margin)
        self.alpha = _validate.positive("alpha", alpha)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, alpha={self.alpha}"

    def compute(self, blocks, classes_per_set):
        pull_per_proxy, push_per_proxy = self._live_proxy_terms(blocks)
        if len(blocks.stored_columns):
            stored_pull, stored_push = self._stored_proxy_terms(blocks)
            pull_per_proxy = torch.cat([pull_per_proxy, stored_pull])
            push_per_proxy = torch.cat([push_per_proxy, stored_push])
        # the divisors count every proxy of the call, not only this share's (module docstring, "Shares")
        whole = blocks.whole
        num_proxies = whole.num_classes
        has_positives = whole.labels.new_zeros(num_proxies, dtype=torch.bool).index_fill_(0, whole.labels, True)
        if classes_per_set is None:
            return pull_per_proxy.sum() / has_positives.sum() + push_per_proxy.sum() / num_proxies
        num_sets = num_proxies // classes_per_set
        classes = torch.arange(num_proxies, device=whole.labels.device) if blocks.classes is None else blocks.classes
        sets = classes // classes_per_set
        pull_per_set = pull_per_proxy.new_zeros(num_sets).index_add(0, sets, pull_per_proxy)
        push_per_set = push_per_proxy.new_zeros(num_sets).index_add(0, sets, push_per_proxy)
        with_positives_per_set = has_positives.view(num_sets, classes_per_set).sum(1)
        push_per_set = push_per_set / classes_per_set
        # a set whose proxies have no positive row (MemVir's sets always have some) adds no pull term
        pull = torch.where(with_positives_per_set > 0, pull_per_set / with_positives_per_set.clamp_min(1), 0.0)
        return (pull + push_per_set).sum()

    def _exponents(self, cosines, local_labels):
        """[R, K] each entry's pull exponent (a row of the proxy's class) and push exponent (a row of any other
        class), -inf where the other applies; ``local_labels`` count from the block's first proxy."""
        positive = local_labels[:, None] == torch.arange(cosines.shape[1], device=cosines.device)
        pull = torch.where(positive, -self.alpha * (cosines - self.margin), -math.inf)
        push = torch.where(positive, -math.inf, self.alpha * (cosines + self.margin))
        return pull, push

    def _live_proxy_terms(self, blocks):
        """[C] log(1 + sum exp) of the pull and of the push terms of each live proxy, over every row."""
        cosines = torch.cat([blocks.live_rows @ blocks.live_columns.T, blocks.stored_rows @ blocks.live_columns.T])
        exponents = self._exponents(cosines, blocks.labels)
        if blocks.live_step is not None:  # each row step's sums over the live proxies, kept as its pair with them
            self._keep_live_pairs(blocks, exponents, columns_live=True)
        zero_row = cosines.new_zeros(1, cosines.shape[1])
        return tuple(torch.logsumexp(torch.cat([zero_row, exponent]), dim=0) for exponent in exponents)

    def _keep_live_pairs(self, blocks, exponents, columns_live):
        """Keep what the blocks with gradients give as the live step's pairs (module docstring, "Cache"), computed
        from their exponents without autograd: with ``columns_live``, every row step's (the live one's and each
        virtual set's) sums over the live proxies; else the live rows' sums over each virtual set's proxies."""
        pairs, live_step, steps = self._stored_pairs, blocks.live_step, blocks.stored_sets.steps
        with torch.no_grad():
            pull, push = (exponent.detach() for exponent in exponents)
            if columns_live:
                live = blocks.num_live_rows
                groups = [slice(0, live)] + [slice(live + rows.start, live + rows.stop)
                                             for rows in blocks.stored_set_rows()]
                for step, rows in zip((live_step, *steps), groups, strict=True):
                    own_step = step == live_step  # a row's positive proxy is in its own step's set
                    pairs.keep(step, live_step, (torch.logsumexp(pull[rows], dim=0) if own_step else None,
                                                 torch.logsumexp(push[rows], dim=0)), computed=False)
            else:
                for index, step in enumerate(steps):
                    columns = blocks.stored_set_columns(index)
                    pairs.keep(live_step, step, (None, torch.logsumexp(push[:, columns], dim=0)), computed=False)

    def _stored_proxy_terms(self, blocks):
        """[kC] the same for each stored proxy: its sums over the stored rows (and the zero term) as one constant."""
        offset, num_stored = blocks.num_live_classes, blocks.stored_columns.shape[0]
        if blocks.stored_sets is not None:
            constants = self._kept_constants(blocks)
        else:
            with torch.no_grad():
                constants = [blocks.stored_rows.new_zeros(1, num_stored), blocks.stored_rows.new_zeros(1, num_stored)]
                for part in _chunks(blocks.stored_rows.shape[0], self.chunk_rows):
                    exponents = self._exponents(blocks.stored_similarities(blocks.stored_rows[part]),
                                                blocks.stored_labels[part] - offset)
                    for constant, chunk in zip(constants, exponents, strict=True):
                        torch.logaddexp(constant, torch.logsumexp(chunk, dim=0, keepdim=True), out=constant)
        live_exponents = self._exponents(blocks.stored_similarities(blocks.live_rows), blocks.live_labels - offset)
        if blocks.live_step is not None:  # the live rows' sums over each virtual set's proxies, kept as their pairs
            self._keep_live_pairs(blocks, live_exponents, columns_live=False)
        return tuple(torch.logsumexp(torch.cat([constant, exponents]), dim=0)
                     for constant, exponents in zip(constants, live_exponents, strict=True))


    def _kept_constants(self, blocks):
        """The stored proxies' constants of ``_stored_proxy_terms`` from the kept pairs (module docstring, "Cache"):
        each pair of stored steps gives every proxy of the second its pull and push sums over the rows of the first
        (a pull only where the two are one step: a row's positive proxy is in its own set); the missing pairs are
        computed and kept, and each proxy's pairs joined by a log-sum-exp over the row sets, with the zero term."""
        pairs, steps, width = self._stored_pairs, blocks.stored_sets.steps, blocks.num_live_classes
        set_rows, labels = blocks.stored_set_rows(), blocks.stored_labels - width
        whole, by_column = pairs.missing(steps)
        with torch.no_grad():
            for chunks, columns, keep in (
                # a row set lacking most pairs: against every stored proxy, chunk_rows rows at a time
                *((_row_chunks(set_rows, [a], self.chunk_rows), slice(None), _keep_all(pairs, steps, width, a))
                  for a in whole),
                # the other missing pairs, one set's proxies at a time against every row set that lacks them
                *((_row_chunks(set_rows, row_sets, self.chunk_rows * len(steps)), blocks.stored_set_columns(b),
                   _keep_one(pairs, steps, b)) for b, row_sets in by_column.items()),
            ):
                sums = {}
                for chunk in chunks:
                    cosines = blocks.stored_similarities(_gather_rows(blocks.stored_rows, chunk), columns)
                    exponents = self._exponents(cosines, _gather_rows(labels, chunk) - (columns.start or 0))
                    position = 0
                    for a, start, stop in chunk:
                        rows = slice(position, position + stop - start)
                        part = torch.stack([torch.logsumexp(exponent[rows], dim=0) for exponent in exponents])
                        sums[a] = torch.logaddexp(sums[a], part) if a in sums else part
                        position += stop - start
                for a, (pull, push) in sums.items():
                    keep(a, pull, push)
            zeros = blocks.stored_rows.new_zeros(1, len(steps), width)
            pull = torch.stack([pairs.values[step][step][0] for step in steps])
            push = torch.stack([torch.stack([pairs.values[row_step][column_step][1] for column_step in steps])
                                for row_step in steps])
            return [torch.logaddexp(pull, zeros[0]).view(1, -1),
                    torch.logsumexp(torch.cat([zeros, push]), 0).view(1, -1)]


def _keep_all(pairs: _StoredPairs, steps: tuple[int, ...], width: int, row_set: int):
    """Keep a row set's sums over every stored proxy ([k C] each) as its k pairs."""
    def keep(_, pull, push):
        for b, column_step in enumerate(steps):
            columns = slice(b * width, (b + 1) * width)
            pairs.keep(steps[row_set], column_step, (pull[columns] if b == row_set else None, push[columns]))
    return keep


def _keep_one(pairs: _StoredPairs, steps: tuple[int, ...], column_set: int):
    """Keep a row set's sums over one set's proxies as one pair."""
    def keep(row_set, pull, push):
        pairs.keep(steps[row_set], steps[column_set], (pull if row_set == column_set else None, push))
    return keep


LOSSES: tuple[str, ...] = LOSS_REGISTRY.names()


def loss_defaults(name: str) -> dict:
    """The hyper-parameters the loss registered as ``name`` takes, with their defaults: {"scale": 23.0} for
    norm-softmax, {} for a loss that takes none. ValueError for an unknown name."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(LOSS_REGISTRY.get(name).__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.kind in named and p.name != "self"}


def build_loss(name: str, **hparams) -> MetricLoss:
    """The loss registered as ``name`` with the given hyper-parameters, the others at their defaults.

    Args:
        name: one of ``LOSSES``.
        **hparams: what that loss takes (``loss_defaults(name)`` lists them): ``scale``, ``margin`` (radians for
            ArcFace and CurricularFace; delta for Proxy-Anchor), ``alpha`` (Proxy-Anchor).

    Returns:
        The loss, an ``nn.Module``: ``loss(embeddings[B, D], labels[B], class_weights[C, D]) -> scalar``.

    Raises:
        ValueError: an unknown name (listing the valid ones and the nearest), a hyper-parameter that loss does not
            take (listing those it does), or an invalid value.
    """
    loss_class = LOSS_REGISTRY.get(name)
    # Named parameters only: a loss without its own __init__ shows nn.Module's (*args, **kwargs), which take none.
    accepted = list(loss_defaults(name))
    unknown = sorted(set(hparams) - set(accepted))
    if unknown:
        takes = f"accepted: {', '.join(accepted)}" if accepted else "it takes no hyper-parameters"
        raise ValueError(f"loss {name!r} got unknown hyper-parameter(s) {', '.join(unknown)}; {takes}")
    return loss_class(**hparams)
