"""Every kind of figure the app draws is valid plotly, as plotly's own validators see it.

The app builds its figures from plain dicts without plotly's validation (demo.train.figures.style.built says why);
these tests are where the validation happens instead. Each figure is rebuilt with validation on: a misspelt property or
a value of the wrong kind raises, and a value plotly would rewrite (a named colour scale for its colour stops, say)
makes the two JSONs differ.
"""

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from demo.runs.few_class_track import FewClassView
from demo.train.figures.curves import class_count_figure, curves_figure, target_cosine_figure
from demo.train.figures.embeddings import embedding_figure
from demo.train.figures.few_classes import few_class_drift_figure, few_class_figure
from demo.train.figures.spread import class_spread_figure, drift_figure
from demo.train.figures.style import built, scatter
from memvir.analysis.projection import FewClassProjection, ProjectedSnapshot


def step_record(step, k, warmup):
    record = {"type": "step", "step": step, "epoch": step // 50, "loss": 3.0 - 0.01 * step, "num_classes": 10 * (k + 1),
              "num_virtual_sets": k, "mean_target_cosine": 0.4 + 0.001 * step, "images_per_s": 500.0, "lr": 1e-4,
              "warmup": warmup}
    if step % 10 == 0:  # the spread measures, at the snapshot cadence, with one drift pair per virtual set in use
        record |= {"weight_mean_cos": -0.01, "weight_uniformity": -3.9}
        for age in range(1, k + 1):
            record |= {f"virtual_weight_cos_{age}": 1.0 - 0.01 * age, f"virtual_embedding_cos_{age}": 0.3}
    return record


def records(memvir: bool) -> list[dict]:
    """A run with warm-up to step 30, then (with MemVir) a virtual set every 11 steps up to 3; evaluations on test and
    validation classes, a live change and a status record."""
    steps = [step_record(step, min(max(0, (step - 30) // 11), 3) if memvir else 0, step <= 30)
             for step in range(1, 121)]
    evals = [{"type": "eval", "step": step, "epoch": 0, "recall@1": 0.3 + step / 1000, "val_recall@1": 0.2}
             for step in (40, 80, 120)]
    others = [{"type": "control", "step": 95, "message": "N 4 -> 3: applied at step 95", "memvir_n": 3},
              {"type": "status", "state": "running", "step": 0, "message": ""}]
    return steps + evals + others


RUN, BASELINE = records(memvir=True), records(memvir=False)


def projected() -> ProjectedSnapshot:
    ages = np.array([0, 1, 0, 2, 0, 1, 0, 2, 1, 0])
    return ProjectedSnapshot(
        step=70, margin=10, method="pca", xy=np.arange(20, dtype=float).reshape(10, 2),
        labels=np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]), ages=ages, weight_xy=-np.arange(18.0).reshape(9, 2),
        weight_labels=np.array([0, 1, 2] * 3), weight_ages=np.repeat([0, 1, 2], 3), probe_xy=np.ones((4, 2)),
        probe_labels=np.array([5, 5, 6, 6]))


def focus_view() -> FewClassView:
    projection = FewClassProjection(
        step=70, margin=10, method="umap", classes=np.array([7, 3]),
        embedding_xy=np.array([[0.0, 0.0], [0.1, 0.0], [1.0, 1.0]]), embedding_labels=np.array([3, 3, 7]),
        weight_xy=np.arange(12.0).reshape(6, 2), weight_labels=np.array([3, 7] * 3),
        weight_ages=np.repeat([0, 1, 2], 2), memory_xy=np.ones((3, 2)), memory_labels=np.array([3, 7, 3]),
        memory_ages=np.array([1, 1, 2]), embedding_angles=np.array([50.0, 55.0, 60.0]),
        weight_angles=np.array([0.0, 0.0, 7.0, 7.5, 14.0, 15.0]), memory_angles=np.array([70.0, 75.0, 80.0]),
        weight_drift=np.array([[0.0, 0.0], [0.0, 0.0], [7.0, 0.0], [0.0, 7.5], [14.0, 0.0], [9.0, 12.0]]))
    return FewClassView(projection, (-1.0, 12.0), (-1.0, 12.0), 3, 5, 70)


FIGURES = {
    "curves": lambda: curves_figure(RUN, BASELINE),
    "curves, no records": lambda: curves_figure([]),
    "class count": lambda: class_count_figure(RUN, BASELINE),
    "target cosine": lambda: target_cosine_figure(RUN, BASELINE),
    "drift": lambda: drift_figure(RUN, 10),
    "drift, no virtual set": lambda: drift_figure(BASELINE, 10),
    "class spread": lambda: class_spread_figure(RUN, BASELINE),
    "embeddings by age": lambda: embedding_figure(projected(), "age"),
    "embeddings by class": lambda: embedding_figure(projected(), "class"),
    "few classes": lambda: few_class_figure(focus_view()),
    "few classes, none yet": lambda: few_class_figure(None),
    "few classes' drift": lambda: few_class_drift_figure(focus_view()),
    "few classes' drift, none yet": lambda: few_class_drift_figure(None),
}


def as_plotly_validates_it(figure: go.Figure) -> go.Figure:
    """`figure` rebuilt from its JSON with every property validated (ValueError at the first invalid one)."""
    return go.Figure(json.loads(figure.to_json()))


@pytest.mark.parametrize("name", FIGURES)
def test_the_figure_is_valid_plotly_and_validation_changes_nothing(name):
    figure = FIGURES[name]()
    assert figure.data or figure.layout.annotations  # something to draw or a message to show
    assert json.loads(as_plotly_validates_it(figure).to_json()) == json.loads(figure.to_json())


def test_the_check_catches_a_misspelt_property_a_wrong_value_and_a_rewritten_one():
    with pytest.raises(ValueError, match="colr"):
        as_plotly_validates_it(built([scatter(x=[1, 2], y=[3, 4], line=dict(colr="red"))], {}))
    with pytest.raises(ValueError, match="mode"):
        as_plotly_validates_it(built([scatter(x=[1, 2], y=[3, 4], mode="dots")], {}))
    named = built([scatter(x=[1, 2], y=[3, 4], marker=dict(color=[0, 1], colorscale="Viridis"))], {})
    assert json.loads(as_plotly_validates_it(named).to_json()) != json.loads(named.to_json())
