"""The charts' marks where the run's records put them: the warm-up's end and each virtual set's arrival at the steps
they happened (kept by the page even where the trainer's log skips them), live-change notes that never print over
each other, and a drift legend that names each stretch of a set's curve by the M it was trained with. Expectations
are written out by hand."""

from pathlib import Path

import numpy as np

from demo.runs.live_run import LiveRun
from demo.train.figures.curves import CONTROL_CHAR_PX, CONTROL_PLOT_PX, curves_figure
from demo.train.figures.spread import drift_figure, margins_at
from memvir.config import TrainConfig
from memvir.events import ControlEvent, StepEvent


def step_event(step: int, warmup: bool, k: int, logged: bool) -> StepEvent:
    return StepEvent(step=step, epoch=0, loss=3.0 - step / 100, num_classes=10 * (k + 1), num_virtual_sets=k,
                     mean_target_cosine=0.5, images_per_s=100.0, lr=1e-3, warmup=warmup, logged=logged)


def test_the_warm_up_end_and_an_arrival_between_logged_steps_are_marked_where_they_happened():
    """A log every 10 steps (and the first): the warm-up's 6 steps end at step 7 and the first virtual set arrives at
    step 21, neither a logged step. The marks stand at 7 and 21, not at the next logged steps, 10 and 30."""
    run = LiveRun("r1", "alice", Path("unused"), TrainConfig(dataset="glyphs-mini"))
    for step in range(1, 31):
        run._on_event(step_event(step, warmup=step <= 6, k=int(step >= 21), logged=step == 1 or step % 10 == 0))
    assert [record["step"] for record in run.records] == [1, 7, 10, 20, 21, 30]
    figure = curves_figure(run.records)
    warmup_line = [shape for shape in figure.layout.shapes if shape.name == "warm-up end"]
    assert [(line.x0, line.x1) for line in warmup_line] == [(7, 7)]
    arrivals = [trace for trace in figure.data if trace.name == "virtual set arrives"]
    assert list(arrivals[0].x) == [21] and list(arrivals[0].text) == ["k=1"]
    loss = [trace for trace in figure.data if trace.name == "loss"][0]
    np.testing.assert_allclose(loss.y, [3.0 - step / 100 for step in (1, 7, 10, 20, 21, 30)])


def test_a_live_change_is_kept_as_the_trainer_recorded_it_and_marked_from_its_fields():
    run = LiveRun("r1", "alice", Path("unused"), TrainConfig(dataset="glyphs-mini", memvir_n=2))
    run._on_event(step_event(1, warmup=False, k=0, logged=True))
    # the Trainer's sentence reworded: the mark is drawn from the record's fields, never from its words
    run._on_event(ControlEvent(428, {"memvir_n": 3}, "N went from two to three", previous={"memvir_n": 2}))
    assert run.records[-1] == {"type": "control", "step": 428, "message": "N went from two to three",
                               "memvir_n": 3, "previous": {"memvir_n": 2}}
    note = [note for note in curves_figure(run.records).layout.annotations if note.name == "control"][0]
    assert (note.text, note.x, note.hovertext) == ("N 2 -> 3 at step 429", 429, "N 2 -> 3: applied at step 429")


def test_a_record_from_before_records_said_what_they_replaced_is_marked_from_its_sentence():
    """Run folders written before `previous` hold only the Trainer's sentence for the old value: they still draw."""
    records = [{"type": "step", "step": step, "loss": 1.0, "num_virtual_sets": 0, "warmup": False} for step in (1, 500)]
    records.append({"type": "control", "step": 428, "message": "memvir_n 2 -> 3, class_lr 0.01 -> 0.02: applied at "
                    "step 429", "memvir_n": 3, "class_lr": 0.02})
    note = [note for note in curves_figure(records).layout.annotations if note.name == "control"][0]
    assert (note.text, note.x) == ("N 2 -> 3, class lr 0.… at step 429", 429)  # cut to 34 characters, never its step
    assert note.hovertext == "N 2 -> 3, class lr 0.01 -> 0.02: applied at step 429"


def _notes(figure, span: int) -> list[tuple[float, float, float, float]]:
    """(left, right, height, arrow) in pixels of each note with words, on CONTROL_PLOT_PX for `span` steps: its words
    start at its arrow (xanchor left), as wide as their characters; its arrow rises from the axis to `height`."""
    notes = []
    for note in figure.layout.annotations:
        if note.name == "control" and note.text:
            arrow = note.x * CONTROL_PLOT_PX / span
            notes.append((arrow, arrow + len(note.text) * CONTROL_CHAR_PX, -note.ay, arrow))
    return notes


def test_many_live_changes_close_together_never_print_over_each_other_nor_cross_each_other():
    """Twelve changes a few steps apart on a 1,000-step run, checked pair by pair: no two notes in a row overlap, and
    no note's arrow rises through the words of a lower note; the notes that find no row keep their arrow and hover."""
    records = [{"type": "step", "step": step, "loss": 1.0, "num_virtual_sets": 0, "warmup": False}
               for step in (1, 1000)]
    for index in range(12):
        records.append({"type": "control", "step": 100 + 7 * index,
                        "message": f"memvir_n {index} -> {index + 1}: applied at step {101 + 7 * index}",
                        "memvir_n": index + 1})
    figure = curves_figure(records)
    notes = _notes(figure, 1000)
    assert len(notes) == 6 and len({height for _, _, height, _ in notes}) == 6  # six rows
    for left, right, height, _ in notes:
        for other_left, other_right, other_height, other_arrow in notes:
            if (left, height) == (other_left, other_height):
                continue
            if height == other_height:
                assert right <= other_left or other_right <= left
            if other_height > height:  # its arrow rises past this note's row
                assert not left < other_arrow < right
    annotations = [note for note in figure.layout.annotations if note.name == "control"]
    assert [note.x for note in annotations] == [101 + 7 * index for index in range(12)]
    silent = [note for note in annotations if not note.text]
    # placed from the right: the last six have the rows, the first six an arrow each
    assert [note.x for note in silent] == [101 + 7 * index for index in range(6)]
    assert silent[0].hovertext == "N 0 -> 1: applied at step 101"


def spread_record(step: int, ages: dict[int, float]) -> dict:
    record = {"type": "step", "step": step, "loss": 1.0, "num_virtual_sets": len(ages), "warmup": False,
              "mean_target_cosine": 0.6, "weight_mean_cos": 0.1, "weight_uniformity": -1.0}
    for age, cosine in ages.items():
        record[f"virtual_weight_cos_{age}"] = cosine
        record[f"virtual_embedding_cos_{age}"] = cosine - 0.2
    return record


def test_the_m_of_each_step_follows_the_live_changes_from_the_step_they_applied_at():
    records = [{"type": "control", "step": 45, "message": "memvir_m 10 -> 20: applied at step 46", "memvir_m": 20},
               {"type": "control", "step": 70, "message": "memvir_n 2 -> 3: applied at step 71", "memvir_n": 3},
               {"type": "control", "step": 80, "message": "memvir_m 20 -> 5: applied at step 81", "memvir_m": 5}]
    steps = np.array([10, 45, 46, 70, 80, 81, 90])
    assert margins_at(records, steps, 10).tolist() == [10, 10, 20, 20, 20, 5, 5]


def test_the_drift_legend_keeps_the_age_each_curve_was_drawn_with_after_a_live_change_of_m():
    """M 10 until step 45, then 20: set 1 was 11 steps old at steps 30 and 40 and 21 steps old at 50 and 60; its
    earlier points are not relabelled with the M of now."""
    records = [spread_record(30, {1: 0.99}), spread_record(40, {1: 0.98}),
               {"type": "control", "step": 45, "message": "memvir_m 10 -> 20: applied at step 46", "memvir_m": 20},
               spread_record(50, {1: 0.97}), spread_record(60, {1: 0.96, 2: 0.95})]
    figure = drift_figure(records, margin=10)
    shown = [(trace.name, list(trace.x), [None if np.isnan(value) else value for value in trace.y])
             for trace in figure.data if trace.showlegend is not False and trace.name.startswith("from")]
    assert shown == [("from 11 steps ago (M = 10)", [30, 40], [0.99, 0.98]),
                     ("from 21 steps ago (M = 20)", [50, 60], [0.97, 0.96]),
                     ("from 42 steps ago (M = 20)", [50, 60], [None, 0.95])]
    # the embeddings' curves (dotted, below) are split alike
    dotted = [(trace.name, list(trace.x)) for trace in figure.data if trace.showlegend is False]
    assert dotted == [("from 11 steps ago (M = 10)", [30, 40]), ("from 21 steps ago (M = 20)", [50, 60]),
                      ("from 42 steps ago (M = 20)", [50, 60])]


def test_without_a_change_of_m_the_legend_names_ages_alone():
    records = [spread_record(30, {1: 0.99}), spread_record(40, {1: 0.98, 2: 0.97})]
    names = [trace.name for trace in drift_figure(records, margin=10).data if trace.showlegend is not False]
    assert names == ["from 11 steps ago", "from 22 steps ago", "now (the live batch)"]
