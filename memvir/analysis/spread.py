"""How far the virtual classes have drifted from the real ones, and how much of the sphere the real classes use.

A virtual class is a stored copy of a real class from j(M+1) steps ago (docs/method.md, "Algorithm"). Early in
training, or with a small M, it is nearly a copy of the live class and adds little; as the network moves on, the
copies drift away and the live embeddings must be told apart from them. These numbers make that visible (the
paper's Fig. 7 shows it as a picture): the Trainer logs them with its step records at the snapshot cadence, from
the virtual sets the step actually used.

- ``virtual_weight_cos_j``: the mean, over classes, of the cosine between a class's stored weight of age j and its
  live weight. 1 means the virtual class is a copy of the real one.
- ``virtual_embedding_cos_j``: the mean, over the stored embeddings of age j, of the cosine between the embedding and
  its class's live weight (the live rows' own figure is the step record's ``mean_target_cosine``).
- ``weight_mean_cos``: the mean cosine between two different real class weights; near 0 when the classes spread
  over the sphere, near 1 when they crowd together. Logged for baselines too, so the two compare.
- ``weight_uniformity``: log of the mean of exp(-2 ||w_a - w_b||^2) over pairs of distinct unit class weights
  (Wang and Isola, ICML 2020); lower means more uniformly spread. Over at most UNIFORMITY_CLASSES classes (the
  first ones), so that it costs the same on SOP's 11,318 classes as on 100.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

UNIFORMITY_CLASSES = 1024


@torch.no_grad()
def class_weight_spread(class_weights: torch.Tensor) -> dict[str, float]:
    """``weight_mean_cos`` and ``weight_uniformity`` of real class weights [C, D] (C >= 2)."""
    units = F.normalize(class_weights.detach().float(), dim=1)
    count = units.shape[0]
    if count < 2:
        return {}
    total = units.sum(0)
    # sum over all ordered pairs of cosines is ||sum of units||^2; removing the C self-pairs leaves the distinct ones
    mean_cos = ((total @ total) - count) / (count * (count - 1))
    sample = units[:UNIFORMITY_CLASSES]
    squared_distances = (2 - 2 * sample @ sample.T).clamp_min(0)
    off_diagonal = ~torch.eye(sample.shape[0], dtype=torch.bool, device=sample.device)
    uniformity = torch.logsumexp(-2 * squared_distances[off_diagonal], 0) - torch.log(
        torch.tensor(float(off_diagonal.sum())))
    return {"weight_mean_cos": float(mean_cos), "weight_uniformity": float(uniformity)}


@torch.no_grad()
def virtual_spread(embeddings: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                   num_classes: int) -> dict[str, float]:
    """``virtual_weight_cos_j`` and ``virtual_embedding_cos_j`` for each virtual set j in one MemVir output.

    The arguments are what a MemVir call returned (the live rows and weights first, set j's labels shifted by jC),
    with C = ``num_classes``: the live weights are the first C rows, set j's weights rows jC to (j+1)C, set j's
    embeddings those whose label // C is j.
    """
    live = F.normalize(class_weights[:num_classes].detach().float(), dim=1)
    ages = labels // num_classes
    measures = {}
    for age in range(1, class_weights.shape[0] // num_classes):
        stored = F.normalize(class_weights[age * num_classes:(age + 1) * num_classes].detach().float(), dim=1)
        measures[f"virtual_weight_cos_{age}"] = float((stored * live).sum(1).mean())
        rows = ages == age
        stored_embeddings = F.normalize(embeddings[rows].detach().float(), dim=1)
        targets = live[labels[rows] - age * num_classes]
        measures[f"virtual_embedding_cos_{age}"] = float((stored_embeddings * targets).sum(1).mean())
    return measures
