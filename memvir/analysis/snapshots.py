"""What an embedding snapshot shows besides the step's own rows: a fixed probe set of test images, for axes that stay
put from one snapshot to the next, and the few-class view of a handful of training classes (the paper's Fig. 7).

The Trainer makes a SnapshotEvent (memvir.events) every `snapshot_every` steps from the rows its MemVir call
returned (live batch first, then each virtual set, labels y + jC) and from what the SnapshotMaker embeds here with
the current model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memvir.config import FOCUS_CLASSES
from memvir.data.splits import without_augmentation
from memvir.events import SnapshotEvent
from memvir.retrieval import evaluation


class SnapshotMaker:
    """The probe set (`probe_classes` test classes drawn with `seed`) and the few-class view (`focus_classes`
    training classes, else FOCUS_CLASSES drawn with the seed) of a dataset's splits."""

    def __init__(self, data, seed: int, probe_classes: int, focus_classes: list, dataset_name: str):
        self.data = data
        self.seed = seed
        self.dataset_name = dataset_name
        self._focus_source = without_augmentation(data).train  # clean reads of the training images
        labels = torch.as_tensor(data.test.labels)
        drawn = torch.randperm(data.test.num_classes, generator=torch.Generator().manual_seed(seed))
        self._probe = torch.nonzero(torch.isin(labels, drawn[:probe_classes])).flatten().tolist()
        self.focus_classes, self._focus_items = self.focus(focus_classes)

    def focus(self, classes: list) -> tuple[torch.Tensor, list[int]]:
        """The few-class view's training classes (those asked for, else drawn) and the indices of their images;
        ValueError naming the range for a class the dataset lacks. Changes nothing: `set_focus` does."""
        count = self.data.info.num_train_classes
        if classes:
            outside = [c for c in classes if c >= count]
            if outside:
                raise ValueError(f"focus_classes {outside} are not training classes of {self.dataset_name}, which "
                                 f"has {count} (0 to {count - 1})")
            chosen = torch.tensor(classes, dtype=torch.long)
        else:
            generator = torch.Generator().manual_seed(self.seed + 2)
            chosen = torch.randperm(count, generator=generator)[:FOCUS_CLASSES].sort().values
        items = torch.nonzero(torch.isin(torch.as_tensor(self._focus_source.labels), chosen)).flatten().tolist()
        return chosen, items

    def set_focus(self, classes: list) -> None:
        self.focus_classes, self._focus_items = self.focus(classes)

    def make(self, model, step: int, margin: int, embeddings, labels, weights, num_classes: int) -> SnapshotEvent:
        """A snapshot of a step: its MemVir rows and class weights (C real classes, then each virtual set's), with
        the probe set and the few-class view embedded by `model` now."""
        probe_embeddings, probe_labels = evaluation.embed(model, self.data.test, self._probe)
        focus_embeddings, focus_labels = evaluation.embed(model, self._focus_source, self._focus_items)
        weight_rows = torch.arange(weights.shape[0])
        return SnapshotEvent(
            step=step, margin=margin,
            # unit vectors, as the probe and focus embeddings are, whatever the loss was handed (memvir.losses)
            embeddings=F.normalize(embeddings.detach().float(), dim=1).cpu(), labels=(labels % num_classes).cpu(),
            ages=(labels // num_classes).cpu(),  # MemVir's labels are y + j*C: the age is the quotient
            # a copy: with no virtual set in use (a baseline, the warm-up) `weights` is the trainer's own parameter,
            # which the optimiser changes in place after this step, and a float32 tensor on the CPU would share it
            class_weights=weights.detach().to("cpu", torch.float32, copy=True),
            class_weight_labels=weight_rows % num_classes,
            class_weight_ages=weight_rows // num_classes,
            probe_embeddings=probe_embeddings, probe_labels=probe_labels,
            focus_classes=self.focus_classes.clone(), focus_embeddings=focus_embeddings, focus_labels=focus_labels,
            probe_items=torch.tensor(self._probe, dtype=torch.long),
            focus_items=torch.tensor(self._focus_items, dtype=torch.long),
        )
