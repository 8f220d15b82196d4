"""The model card an `EmbeddingModel` saves as README.md: what it is, how it was made, its metrics, how to use it."""

import json
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

MODEL_CARD_TEMPLATE = """---
{{ card_data }}
---

# MemVir embedding model: {{ config.backbone }} on {{ config.dataset }}

An image embedding model for retrieval, trained with deep metric learning and memory-based virtual classes
(MemVir; Ko, Gu and Kim, ICCV 2021) in MemVir Studio. It maps an image to a {{ config.embedding_dim }}-dimensional
L2-normalised vector: similar images have a large dot product (cosine similarity).

| | |
|---|---|
| Backbone | `{{ config.backbone }}` ({{ "ImageNet-initialised" if config.pretrained else "trained from scratch" }}) |
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
        return "off (baseline: N=0)" + scaled
    schedule = "" if config.memvir_schedule == "curriculum" else f", {config.memvir_schedule}"
    labels = "" if config.memvir_labels == "virtual" else ", stored embeddings keep their seen labels (control)"
    return (f"N={config.memvir_n}, M={config.memvir_m}, warm-up {config.warmup_epochs:g} epochs "
            f"({warmup_steps} steps){schedule}, {config.memvir_reduction} reduction{labels}{scaled}")
