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

``build_loss(name, **hparams)`` builds one by name (``LOSSES`` lists the names); hyper-parameters are ``scale``,
``margin`` (radians for ArcFace and CurricularFace; delta for Proxy-Anchor) and ``alpha`` (Proxy-Anchor).
"""

import inspect
import math
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from memvir import _validate

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

_REGISTRY: dict[str, type["MetricLoss"]] = {}


def _register(name: str):
    """Class decorator: make a loss buildable as ``build_loss(name)``; registration order is the order of LOSSES."""

    def add(cls: type["MetricLoss"]) -> type["MetricLoss"]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def _cosine_matrix(embeddings: torch.Tensor, class_weights: torch.Tensor) -> torch.Tensor:
    """[B, C] cosine similarities between the L2-normalised rows of both inputs."""
    return F.normalize(embeddings, dim=1) @ F.normalize(class_weights, dim=1).T


def _target_cosines(cosines: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[B] cosine of each row to its own class."""
    return cosines.gather(1, labels[:, None]).squeeze(1)


def _with_target_logits(logits: torch.Tensor, labels: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """``logits`` with each row's target entry replaced (out of place, so autograd sees both parts)."""
    return logits.scatter(1, labels[:, None], target_logits[:, None])


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


class MetricLoss(nn.Module, ABC):
    """Base of every loss here: checks the uniform call, picks the compute dtype, delegates to ``compute``.

    Subclasses implement ``compute(embeddings, labels, class_weights)`` on validated inputs of one floating dtype
    (float32 or float64) and return a 0-dim tensor. Hyper-parameters are plain attributes; derived constants are
    computed per call, so a changed attribute (live control) takes effect at the next step.
    """

    name: str = ""
    # Whether the Trainer hands this loss the embedding head's raw output rather than unit vectors: only the paper's
    # Softmax (its eq. 2) uses the embeddings' norm; every other loss normalises or is meant for unit vectors.
    takes_raw_embeddings: bool = False
    # Checking the labels against the class count costs a host sync per call (a GPU waits for it); a training loop
    # that checks its labels on the CPU turns it off on its loss.
    check_values: bool = True

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                classes_per_set: int | None = None) -> torch.Tensor:
        """Loss of ``embeddings`` [B, D] with integer ``labels`` [B] in [0, C) against ``class_weights`` [C, D].

        ``classes_per_set``: None for the mean over all rows; C (a divisor of the number of weight rows) for the
        balanced reduction over MemVir's sets (module docstring).
        """
        _validate.check_inputs(embeddings, labels, class_weights, self.check_values)
        if classes_per_set is not None:
            _validate.check_classes_per_set(classes_per_set, class_weights.shape[0])
        # float16/bfloat16 exp/logsumexp at scale 64 overflow or lose the margin; float64 stays float64 so that
        # gradcheck and float64 reference tests see the exact computation.
        dtype = torch.promote_types(torch.promote_types(embeddings.dtype, class_weights.dtype), torch.float32)
        return self.compute(embeddings.to(dtype), labels.long(), class_weights.to(dtype), classes_per_set)

    @abstractmethod
    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                classes_per_set: int | None) -> torch.Tensor:
        """The loss on validated inputs: float32/float64 tensors of one dtype, int64 labels in range."""


class _CrossEntropyLoss(MetricLoss):
    """A loss that is a softmax cross-entropy over per-class logits; subclasses say how the logits are made."""

    @abstractmethod
    def logits(self, embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor) -> torch.Tensor:
        """[B, C] logits, each row's target entry already carrying its margin."""

    def compute(self, embeddings, labels, class_weights, classes_per_set):
        logits = self.logits(embeddings, labels, class_weights)
        if classes_per_set is None:
            return F.cross_entropy(logits, labels)
        per_row = F.cross_entropy(logits, labels, reduction="none")
        return _sum_of_set_means(per_row, labels // classes_per_set, class_weights.shape[0] // classes_per_set)


def _sum_of_set_means(values: torch.Tensor, sets: torch.Tensor, num_sets: int) -> torch.Tensor:
    """The sum over sets of the mean of ``values`` within each set (``sets``: each entry's set index); a set with no
    entry adds nothing. Shapes only, no host sync, so it costs a training step no wait on a GPU."""
    totals = values.new_zeros(num_sets).index_add(0, sets, values)
    counts = torch.bincount(sets, minlength=num_sets).to(values.dtype)
    return (totals / counts.clamp_min(1)).sum()


@_register("softmax")
class SoftmaxLoss(_CrossEntropyLoss):
    """Plain softmax cross-entropy, the paper's Softmax (its eq. 2): logits = x @ W^T on the un-normalised
    embeddings, no normalisation, no bias. The Trainer hands it the embedding head's raw output."""

    takes_raw_embeddings = True

    def logits(self, embeddings, labels, class_weights):
        return embeddings @ class_weights.T


@_register("norm-softmax")
class NormSoftmaxLoss(_CrossEntropyLoss):
    """Normalised softmax: logits = scale * cos(x, w) (the MemVir reference setting, scale 23)."""

    def __init__(self, scale: float = 23.0):
        super().__init__()
        self.scale = _validate.positive("scale", scale)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"

    def logits(self, embeddings, labels, class_weights):
        return self.scale * _cosine_matrix(embeddings, class_weights)


@_register("cosface")
class CosFaceLoss(_CrossEntropyLoss):
    """CosFace / large-margin cosine loss (Wang et al. 2018): target logit scale*(cos_y - margin)."""

    def __init__(self, scale: float = 64.0, margin: float = 0.35):
        super().__init__()
        self.scale = _validate.positive("scale", scale)
        self.margin = _validate.non_negative("margin", margin)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, margin={self.margin}"

    def logits(self, embeddings, labels, class_weights):
        cosines = _cosine_matrix(embeddings, class_weights)
        targets = _target_cosines(cosines, labels) - self.margin
        return self.scale * _with_target_logits(cosines, labels, targets)


@_register("arcface")
class ArcFaceLoss(_CrossEntropyLoss):
    """ArcFace / additive angular margin (Deng et al. 2019): target logit scale*cos(theta_y + margin)."""

    def __init__(self, scale: float = 64.0, margin: float = 0.5):
        super().__init__()
        self.scale = _validate.positive("scale", scale)
        self.margin = _validate.angular_margin(margin)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, margin={self.margin}"

    def logits(self, embeddings, labels, class_weights):
        cosines = _cosine_matrix(embeddings, class_weights)
        targets = _additive_angular_margin(_target_cosines(cosines, labels), self.margin)
        return self.scale * _with_target_logits(cosines, labels, targets)


@_register("curricularface")
class CurricularFaceLoss(_CrossEntropyLoss):
    """CurricularFace (Huang et al. CVPR 2020), following the authors' official code.

    Target logit as ArcFace (same fallback). A non-target class j is "hard" for a row when
    cos_j > cos(theta_y + m) (the raw margin cosine, as in the official code); its logit becomes cos_j * (t + cos_j),
    so hard negatives weigh more as training advances. ``t`` is a running mean of the target cosines, a buffer
    (so it is saved in ``state_dict`` and a resumed run keeps its curriculum) that starts at 0 and, in training mode
    only, is updated before use in the same call: t <- 0.01 * mean_i(cos_yi) + 0.99 * t. With MemVir the mean runs
    over all rows, virtual ones included (under either reduction). In eval mode t is used but not changed.

    Gradients (the official choice): t is a statistic and is detached; the hard-negative term passes gradient
    through both factors of cos_j * (t + cos_j), i.e. d/dcos_j = t + 2 cos_j. The hard/easy mask itself carries none.
    """

    def __init__(self, scale: float = 64.0, margin: float = 0.5):
        super().__init__()
        self.scale = _validate.positive("scale", scale)
        self.margin = _validate.angular_margin(margin)
        self.register_buffer("t", torch.zeros(()))

    def extra_repr(self) -> str:
        return f"scale={self.scale}, margin={self.margin}"

    def logits(self, embeddings, labels, class_weights):
        cosines = _cosine_matrix(embeddings, class_weights)
        target_cosines = _target_cosines(cosines, labels)
        if self.training:
            with torch.no_grad():
                self.t.copy_(0.01 * target_cosines.mean() + 0.99 * self.t.to(target_cosines.dtype))
        t = self.t.detach().to(device=cosines.device, dtype=cosines.dtype)
        hard = cosines > _cosine_of_angle_plus_margin(target_cosines, self.margin)[:, None]
        logits = torch.where(hard, cosines * (t + cosines), cosines)
        targets = _additive_angular_margin(target_cosines, self.margin)
        return self.scale * _with_target_logits(logits, labels, targets)


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

    def logits(self, embeddings, labels, class_weights):
        squared_distances = (2.0 - 2.0 * _cosine_matrix(embeddings, class_weights)).clamp_min(0.0)
        return -self.scale * squared_distances


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
    """

    def __init__(self, margin: float = 0.1, alpha: float = 32.0):
        super().__init__()
        self.margin = _validate.non_negative("margin", margin)
        self.alpha = _validate.positive("alpha", alpha)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, alpha={self.alpha}"

    def compute(self, embeddings, labels, class_weights, classes_per_set):
        cosines = _cosine_matrix(embeddings, class_weights)
        positive = F.one_hot(labels, cosines.shape[1]).bool()
        pull = torch.where(positive, -self.alpha * (cosines - self.margin), -math.inf)
        push = torch.where(positive, -math.inf, self.alpha * (cosines + self.margin))
        zero_row = cosines.new_zeros(1, cosines.shape[1])
        pull_per_proxy = torch.logsumexp(torch.cat([zero_row, pull]), dim=0)
        push_per_proxy = torch.logsumexp(torch.cat([zero_row, push]), dim=0)
        has_positives = positive.any(dim=0)
        if classes_per_set is None:
            return pull_per_proxy.sum() / has_positives.sum() + push_per_proxy.sum() / cosines.shape[1]
        num_sets = cosines.shape[1] // classes_per_set
        pull_per_set = pull_per_proxy.view(num_sets, classes_per_set).sum(1)
        with_positives_per_set = has_positives.view(num_sets, classes_per_set).sum(1)
        push_per_set = push_per_proxy.view(num_sets, classes_per_set).sum(1) / classes_per_set
        # a set whose proxies have no positive row (MemVir's sets always have some) adds no pull term
        pull = torch.where(with_positives_per_set > 0, pull_per_set / with_positives_per_set.clamp_min(1), 0.0)
        return (pull + push_per_set).sum()


LOSSES: tuple[str, ...] = tuple(_REGISTRY)


def loss_defaults(name: str) -> dict:
    """The hyper-parameters the loss registered as ``name`` takes, with their defaults: {"scale": 23.0} for
    norm-softmax, {} for a loss that takes none. ValueError for an unknown name."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(LOSSES)}")
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(_REGISTRY[name].__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.kind in named and p.name != "self"}


def build_loss(name: str, **hparams) -> MetricLoss:
    """The loss registered as ``name`` (one of ``LOSSES``) with the given hyper-parameters, others at defaults.

    Raises ValueError for an unknown name (listing the valid ones), a hyper-parameter that loss does not take
    (listing those it does), or an invalid value.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(LOSSES)}")
    # Named parameters only: a loss without its own __init__ shows nn.Module's (*args, **kwargs), which take none.
    accepted = list(loss_defaults(name))
    unknown = sorted(set(hparams) - set(accepted))
    if unknown:
        takes = f"accepted: {', '.join(accepted)}" if accepted else "it takes no hyper-parameters"
        raise ValueError(f"loss {name!r} got unknown hyper-parameter(s) {', '.join(unknown)}; {takes}")
    return _REGISTRY[name](**hparams)
