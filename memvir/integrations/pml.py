"""MemVir for pytorch-metric-learning (PML) losses: `MemVirLoss` wraps a PML proxy or classifier loss so that each
call runs `memvir.MemVir` on the batch and the loss's own class weights, then the PML loss, unchanged, on the
extended set (docs/method.md, "Losses from pytorch-metric-learning").

A PML loss keeps its class weights inside itself (``W`` [D, C] or ``proxies`` [C, D]) and reads them, and for some
a class count, from its attributes in ``compute_loss``. For one call the wrapper hands the loss the extended weights
in place of its parameter (``torch.func.functional_call``: the parameter itself is never written, so the gradient
reaches it through MemVir's concatenation) and widens the class count the loss reads to (k+1)C; afterwards both
are as they were. Where the weights live and which count is read differs by loss class, so only the classes in
``SUPPORTED_LOSSES`` are accepted, and by exact type: a subclass may read its classes elsewhere (PML's
SubCenterArcFaceLoss is an ArcFaceLoss with K centres a class).

pytorch-metric-learning is optional: it is imported when a MemVirLoss is built, never by ``import memvir``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from memvir.memory.virtual_classes import MemVir

__all__ = ["SUPPORTED_LOSSES", "MemVirLoss", "UnsupportedLossError"]

INSTALL_HINT = "pip install pytorch-metric-learning==2.9.0 (the 'pml' extra in pyproject.toml)"


@dataclass(frozen=True)
class _ClassWeights:
    """Where a supported PML loss keeps its class weights, and the attribute sized by its class count."""

    parameter: str  # the nn.Parameter's name in the loss
    classes_last: bool  # True for W [D, C], False for proxies [C, D]
    class_count: str | None = None  # an attribute compute_loss reads for the class count; None: it reads none
    count_as_labels: bool = False  # the attribute holds arange(C) (the proxies' labels) rather than C


# LargeMarginSoftmaxLoss and its subclasses build a [B, num_classes] target mask.
_W_WITH_TARGET_MASK = _ClassWeights("W", classes_last=True, class_count="num_classes")

_SUPPORTED: dict[str, _ClassWeights] = {
    "NormalizedSoftmaxLoss": _ClassWeights("W", classes_last=True),
    "CosFaceLoss": _W_WITH_TARGET_MASK,
    "ArcFaceLoss": _W_WITH_TARGET_MASK,
    "SphereFaceLoss": _W_WITH_TARGET_MASK,
    "LargeMarginSoftmaxLoss": _W_WITH_TARGET_MASK,
    # ProxyNCALoss fixes proxy_labels = arange(C) at construction; ProxyAnchorLoss one-hots the labels with
    # num_classes and divides the negatives' term by it.
    "ProxyNCALoss": _ClassWeights("proxies", classes_last=False, class_count="proxy_labels", count_as_labels=True),
    "ProxyAnchorLoss": _ClassWeights("proxies", classes_last=False, class_count="num_classes"),
}
SUPPORTED_LOSSES: tuple[str, ...] = tuple(_SUPPORTED)

_CROSS_BATCH_MEMORY = (
    "for a memory of past embeddings in a pair or tuple loss use PML's own "
    "pytorch_metric_learning.losses.CrossBatchMemory(loss, embedding_size, memory_size)"
)
_REFUSED: dict[str, str] = {
    "SubCenterArcFaceLoss": (
        "it keeps K sub-centres a class (W is [D, C*K]) and takes each class's closest one, while MemVir's virtual "
        "classes are one weight row each; use ArcFaceLoss"
    ),
    "SoftTripleLoss": (
        "it keeps K centres a class (fc is [D, C*K]) and pools over them per class, while MemVir's virtual classes "
        "are one weight row each; use NormalizedSoftmaxLoss or ProxyNCALoss"
    ),
    "P2SGradLoss": (
        "it rescales its weight in place (weight.data) on every call, which the live weight would not receive "
        "through the extended copy; use CosFaceLoss or NormalizedSoftmaxLoss"
    ),
    "ManifoldLoss": (
        "its K proxies are not one a class (it takes no labels), so there are no classes to make virtual; "
        "use ProxyAnchorLoss or ProxyNCALoss"
    ),
    "CrossBatchMemory": (
        "it is itself a memory of past embeddings, for pair and tuple losses; wrap a proxy or classifier loss "
        "directly"
    ),
    "MultipleLosses": "it combines several losses; wrap each proxy or classifier loss on its own",
}


class UnsupportedLossError(TypeError):
    """A loss MemVirLoss cannot give virtual classes to; the message says why and what to use instead."""


def _pml_losses():
    try:
        from pytorch_metric_learning import losses
    except ImportError as error:
        raise ImportError(f"memvir.integrations.pml needs pytorch-metric-learning: {INSTALL_HINT}") from error
    return losses


def _class_weights_of(loss) -> _ClassWeights:
    """The layout of a supported loss, or an UnsupportedLossError that names the loss, why, and what to use."""
    losses = _pml_losses()
    name = type(loss).__name__
    supported = ", ".join(SUPPORTED_LOSSES)
    if name in _SUPPORTED and type(loss) is getattr(losses, name):
        return _SUPPORTED[name]
    reason = None
    for base in type(loss).__mro__:  # the closest known PML class says what the loss is
        if base is not getattr(losses, base.__name__, None):
            continue
        if base.__name__ in _REFUSED:
            reason = _REFUSED[base.__name__]
        elif base.__name__ in _SUPPORTED:
            reason = (
                f"it is a subclass of {base.__name__}, and the wrapper knows how each listed class itself keeps "
                f"its class weights and class count, not how a subclass does; wrap {base.__name__} itself"
            )
        elif base is losses.BaseMetricLossFunction or base is losses.BaseLossWrapper:
            reason = ("it compares embeddings with each other and has no class weights to add virtual classes "
                      f"to; {_CROSS_BATCH_MEMORY}")
        if reason is not None:
            break
    else:
        raise UnsupportedLossError(
            f"MemVirLoss wraps a pytorch_metric_learning loss ({supported}), got {name}; for this project's own "
            "losses call memvir.MemVir and memvir.build_loss"
        )
    raise UnsupportedLossError(f"MemVirLoss does not support {name}: {reason}. Supported: {supported}")


def _refuse_per_class_reducers(loss) -> None:
    """ClassWeightedReducer indexes a weight per real class by label, and virtual labels lie past C."""
    from pytorch_metric_learning.reducers import ClassWeightedReducer

    if any(isinstance(module, ClassWeightedReducer) for module in loss.modules()):
        raise UnsupportedLossError(
            "MemVirLoss: the loss's ClassWeightedReducer holds one weight per real class, but virtual rows carry "
            "labels in [C, (k+1)C); use the loss's default reducer (or MeanReducer)"
        )


class MemVirLoss(nn.Module):
    """A pytorch-metric-learning proxy or classifier loss with memory-based virtual classes.

    Args:
        loss: the PML loss, one of ``SUPPORTED_LOSSES``; it keeps its class weights, which MemVir extends.
        num_steps: N, how many past steps are used as virtual classes (0 = the plain loss).
        margin: M, the gap between used steps.
        warmup_steps: U, calls before this run the plain loss and store nothing.
        miner: a PML miner run on the extended batch (live and virtual rows) before each call; indices mined on the
            live batch alone cannot be passed to the call (they would leave the virtual rows out).
        **memvir_options: passed to `memvir.MemVir` (store_dtype, schedule, max_memory_bytes, check_values).

    Call ``loss(embeddings[B, D], labels[B])`` once per training step, in training mode: each call is a MemVir step.
    In eval mode the wrapped loss runs on the live batch and the memory is left alone. The loss's parameter stays
    where it was, so an optimiser built over ``loss.parameters()`` (or this module's) trains it. ``state_dict()``
    holds the loss's parameters and the memory (under ``memvir.``), so a resumed run continues its curriculum.

    Raises:
        UnsupportedLossError: for a loss outside ``SUPPORTED_LOSSES``, saying why and what to use instead.
    """

    def __init__(self, loss: nn.Module, num_steps: int, margin: int, warmup_steps: int = 0, *,
                 miner: nn.Module | None = None, **memvir_options):
        super().__init__()
        self._layout = _class_weights_of(loss)
        _refuse_per_class_reducers(loss)
        self.loss = loss
        self.miner = miner
        self.memvir = MemVir(num_steps, margin, warmup_steps, **memvir_options)
        count = self._layout.class_count
        if count is not None:
            value = getattr(loss, count)
            value = len(value) if self._layout.count_as_labels else value
            if value != self.num_classes:
                raise ValueError(f"MemVirLoss: {type(loss).__name__}.{count} says {value} classes but its "
                                 f"{self._layout.parameter} holds {self.num_classes}")

    @property
    def num_classes(self) -> int:
        """C, the number of real classes the loss's weights hold."""
        weights = getattr(self.loss, self._layout.parameter)
        return weights.shape[1] if self._layout.classes_last else weights.shape[0]

    @property
    def num_virtual_sets(self) -> int:
        """k, the virtual sets the last call used."""
        return self.memvir.num_virtual_sets

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple=None, ref_emb=None,
                ref_labels=None) -> torch.Tensor:
        if indices_tuple is not None:
            raise ValueError(
                "MemVirLoss: indices_tuple mined on the live batch would leave the virtual rows out (PML weighs a "
                "row no index names by 0); pass the miner as MemVirLoss(..., miner=miner), which mines the "
                "extended batch"
            )
        if ref_emb is not None or ref_labels is not None:
            raise ValueError("MemVirLoss: ref_emb and ref_labels are not supported: the wrapped losses compare "
                             "embeddings with class weights, not with reference embeddings")
        if labels is None:
            raise ValueError("MemVirLoss: labels are required (the wrapped losses are supervised)")
        from pytorch_metric_learning.utils.common_functions import to_dtype

        labels = labels.to(embeddings.device)
        layout = self._layout
        weights = getattr(self.loss, layout.parameter)
        # MemVir takes [C, D]; the device follows the embeddings, as PML's own cast_types moves its weights.
        weights = (weights.T if layout.classes_last else weights).to(embeddings.device)
        if self.training:
            embeddings, labels, weights = self.memvir(embeddings, labels, weights)
        # PML casts its weights to the embeddings' dtype (outside autocast) by rewriting the parameter's data; the
        # extended copy is cast here instead, so that cast is a no-op and the parameter keeps its dtype.
        weights = to_dtype(weights, dtype=embeddings.dtype)
        indices_tuple = None if self.miner is None else self.miner(embeddings, labels)
        substituted = {layout.parameter: weights.T if layout.classes_last else weights}
        with self._class_count(weights.shape[0], labels.device):
            return functional_call(self.loss, substituted, (embeddings, labels, indices_tuple))

    @contextlib.contextmanager
    def _class_count(self, total: int, device: torch.device):
        """The loss's class-count attribute set to ``total`` classes for one call, and restored after it."""
        name = self._layout.class_count
        if name is None:
            yield
            return
        saved = getattr(self.loss, name)
        setattr(self.loss, name, torch.arange(total, device=device) if self._layout.count_as_labels else total)
        try:
            yield
        finally:
            setattr(self.loss, name, saved)
