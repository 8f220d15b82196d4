"""The model card an `EmbeddingModel` saves as README.md: what it is, how it was made, its metrics, how to use it."""

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from numbers import Integral, Real
from pathlib import PurePath
from typing import Any

from huggingface_hub import EvalResult, ModelCardData

from memvir.data.hub.names import HUB_PREFIX, parse_hub_name
from memvir.data.registry import FOLDER_PREFIX
from memvir.events import ControlEvent

CARD_TAGS = ("metric-learning", "memvir", "image-retrieval")
"""Tags every card carries in its front matter: what the Hub lists and filters models by."""

MODEL_INDEX_TASK = ("image-feature-extraction", "Image retrieval")
"""The model-index task of the card's results: the Hub's task id (the card's pipeline tag) and its name for people."""

_METRIC_NAMES = {"precision@1": "Precision@1", "r_precision": "R-Precision", "map@r": "MAP@R", "nmi": "NMI"}
_RECALL = re.compile(r"recall@([1-9][0-9]*)")
_SPLITS = {"": "test", "val_": "validation"}
"""Metric key prefix -> the split the metric was measured on (memvir.train.Trainer.evaluate: val_* on the held-out
training classes)."""

MODEL_CARD_TEMPLATE = """---
{{ card_data }}
---

# MemVir embedding model: {{ config.backbone }} on {{ config.dataset }}

An image embedding model for retrieval, trained with deep metric learning and memory-based virtual classes
(MemVir; Ko, Gu and Kim, ICCV 2021) in MemVir Studio. It maps an image to a {{ config.embedding_dim }}-dimensional
L2-normalised vector: similar images have a large dot product (cosine similarity).

| | |
|---|---|
| Backbone | `{{ config.backbone }}` ({{ backbone_origin }}) |
| Embedding | {{ config.embedding_dim }}-d, L2-normalised |
| Dataset | `{{ config.dataset }}` |
| Input | {{ input_summary }} |
{% for name, value in extra_rows -%}
| {{ name }} | {{ value }} |
{% endfor %}
{%- if command %}
## How it was made

```bash
{{ command }}
```
{% endif %}
{%- if metric_rows %}
## Metrics

| metric | value |
|---|---|
{% for name, value in metric_rows -%}
| {{ name }} | {{ value }} |
{% endfor %}
{%- endif %}
## Use

```python
from memvir import EmbeddingModel

model = EmbeddingModel.from_pretrained("path/or/owner-name")  # a local folder or a Hub repo id
embeddings = model.embed(pil_images)  # [N, {{ config.embedding_dim }}], preprocessed as config.json says
```
"""


def metric_rows(metrics: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """`metrics` as (name, formatted value) rows for the model card: counts as they are, the rest to four decimals."""
    if metrics is None:
        return []
    if not isinstance(metrics, Mapping):
        raise ValueError(f"metrics must be a mapping of names to numbers, got {type(metrics).__name__}")
    rows = []
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, Real):
            raise ValueError(f"metrics[{name!r}] is {value!r} ({type(value).__name__}); metrics must be numbers")
        rows.append((str(name), str(int(value)) if isinstance(value, Integral) else f"{float(value):.4f}"))
    return rows


def card_cell(value: Any) -> str:
    """`value` as one markdown table cell: containers as inline JSON, pipes escaped so the table holds."""
    text = f"`{json.dumps(value, default=str)}`" if isinstance(value, (Mapping, list, tuple)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def memvir_summary(config, warmup_steps: int) -> str:
    """The card's MemVir row: N, M and the warm-up of a run's TrainConfig (in epochs and in `warmup_steps`), its
    schedule and reduction, or the baseline; and the loss scale after the warm-up where the run changed it."""
    scaled = (f"; loss x{config.loss_scale_after_warmup:g} after {warmup_steps} warm-up steps"
              if config.loss_scale_after_warmup != 1.0 else "")
    if config.memvir_n == 0:
        if config.loss_scale_schedule:
            scaled += (f"; loss x(k+1) after {warmup_steps} warm-up steps, k the virtual sets "
                       f"MemVir({config.loss_scale_schedule}, {config.memvir_m}) would use (step-schedule control)")
        return "off (baseline: N=0)" + scaled
    schedule = "" if config.memvir_schedule == "curriculum" else f", {config.memvir_schedule}"
    labels = "" if config.memvir_labels == "virtual" else ", stored embeddings keep their seen labels (control)"
    return (f"N={config.memvir_n}, M={config.memvir_m}, warm-up {config.warmup_epochs:g} epochs "
            f"({warmup_steps} steps){schedule}, {config.memvir_reduction} reduction{labels}{scaled}")


def live_changes(history) -> list[tuple[int, str, Any, Any]]:
    """(the first step trained with it, setting, old value, new value) of each live change a run's records
    (metrics.jsonl, memvir.events.ControlEvent's records) hold, in order; records written before they carried the
    values they replaced are left out."""
    changes = []
    for record in history or ():
        if record.get("type") == "control":
            event = ControlEvent.from_record(record)
            changes += [(event.step + 1, name, event.previous[name], value)
                        for name, value in event.changes.items() if name in event.previous]
    return changes


def started_with(config, changes: list[tuple[int, str, Any, Any]]):
    """The TrainConfig a run started with, given the one it has now and its `live_changes`."""
    first = {}
    for _, name, old, _ in changes:
        first.setdefault(name, old)
    return dataclasses.replace(config, **first)


def changes_summary(changes: list[tuple[int, str, Any, Any]]) -> str:
    """The card's row of live changes: 'memvir_n 4 -> 6 at step 522, memvir_m 10 -> 20 at step 700'."""
    return ", ".join(f"{name} {old} -> {new} at step {step:,}" for step, name, old, new in changes)


def dataset_id(dataset: str) -> str:
    """The name a card gives a run's dataset: the registry name (`glyphs`, `cub200`, ...), or a class folder's own
    name for `folder:PATH` (the path is this machine's, not the model's), or the Hub dataset's repo id for
    `hf:OWNER/NAME[@REVISION]` (what the Hub links a model card's `datasets:` to)."""
    if dataset.startswith(FOLDER_PREFIX):
        return PurePath(dataset.removeprefix(FOLDER_PREFIX)).name or "folder"
    if dataset.startswith(HUB_PREFIX):
        return parse_hub_name(dataset).repo_id
    return dataset


def metric_display_name(key: str) -> str | None:
    """A retrieval metric's name for people (`recall@4` -> `Recall@4`), None for what is not one (epoch, step)."""
    recall = _RECALL.fullmatch(key)
    return f"Recall@{recall.group(1)}" if recall else _METRIC_NAMES.get(key)


def eval_results(metrics: Mapping[str, Any] | None, dataset: str) -> list[EvalResult]:
    """The retrieval metrics among `metrics` as model-index results: one per metric, on the test classes or, for
    `val_*` keys, the held-out validation classes. Counts (epoch, step) and other numbers stay in the card's table."""
    results = []
    for key, value in (metrics or {}).items():
        prefix = "val_" if str(key).startswith("val_") else ""
        metric = str(key).removeprefix(prefix)
        name = metric_display_name(metric)
        if name is None or isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            continue
        results.append(EvalResult(
            task_type=MODEL_INDEX_TASK[0], task_name=MODEL_INDEX_TASK[1],
            dataset_type=dataset_id(dataset), dataset_name=dataset_id(dataset), dataset_split=_SPLITS[prefix],
            metric_type=metric, metric_name=name, metric_value=float(value),  # plain floats: YAML has no numpy
        ))
    return results


def describe_for_the_hub(card_data: ModelCardData, *, backbone: str, dataset: str,
                         metrics: Mapping[str, Any] | None, base_model: str | None = None) -> None:
    """Complete a card's front matter as the Hub reads it: the tags in CARD_TAGS, `datasets`, `metrics` (the names of
    those measured), a `model-index` holding the run's retrieval metrics (`eval_results`), and `base_model`, the Hub
    repo of the pretrained weights the model was fine-tuned from (a timm backbone's), where there is one."""
    card_data.tags = sorted({*(card_data.tags or ()), *CARD_TAGS})
    card_data.datasets = [dataset_id(dataset)]
    results = eval_results(metrics, dataset)
    card_data.metrics = list(dict.fromkeys(result.metric_type for result in results)) or None
    card_data.model_name = f"memvir-{backbone}-{dataset_id(dataset)}"
    if base_model:
        card_data.base_model = base_model
    card_data.eval_results = results or None
