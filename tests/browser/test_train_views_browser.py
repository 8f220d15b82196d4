"""The Train tab's new views in a real headless chromium: a short glyphs-mini run whose few-class snapshot holds
virtual sets of two ages and whose spread curves fill in, and a run finished beside its baseline whose results table
holds both runs' final metrics as their metrics.jsonl files have them; a page at rest sends its poll and not the
second one (the spread figures and results, asked for when the poll's views key changes), and why a timer asks for
it: gradio fires no State's change after an unqueued event. Read from the page's plotly figures, table and requests;
waits are Playwright's, bounded; nothing asserts speed."""

import json
import re
import time

import numpy as np
import pytest
from test_page_fit_browser import CUT_CHART_TEXT
from train_page import pick_glyphs_mini

pytestmark = pytest.mark.browser

WAIT_MS = 240_000


def _start_glyphs_mini(page, epochs: int) -> str:
    """glyphs-mini with the settings the page suggests for it (N = 3, M = 10, warm-up 1 epoch); the run's id."""
    pick_glyphs_mini(page, WAIT_MS)
    page.get_by_label("Epochs", exact=True).fill(str(epochs))
    page.get_by_label("Epochs", exact=True).press("Tab")  # committed before Start reads it (issue 31's race)
    page.locator("#start").click()
    page.wait_for_function("() => document.querySelector('#notice').innerText.includes('Started run')",
                           timeout=WAIT_MS)
    return re.search(r"Started run `?([\w-]+)`?", page.locator("#notice").inner_text()).group(1)


def _traces(page, plot_id: str) -> list[dict]:
    """The plotly figure's traces in #plot_id as plotly drew them (numeric arrays decoded): name, meta and the
    number of points."""
    return page.evaluate(
        """(plotId) => {
            const chart = document.querySelector(`#${plotId} .js-plotly-plot`);
            if (!chart || !chart._fullData) return [];
            return chart._fullData.map(t => ({name: t.name || null, meta: t.meta || null,
                                         points: t.x ? Array.from(t.x).filter(v => v !== null).length : 0}));
        }""", plot_id)


# CUT_CHART_TEXT for the snapshot picture alone
CUT_PICTURE_TEXT = CUT_CHART_TEXT.replace("document.querySelectorAll('.js-plotly-plot')",
                                          "document.querySelectorAll('#embedding-plot .js-plotly-plot')")
assert CUT_PICTURE_TEXT != CUT_CHART_TEXT


def _drawn_points(page) -> dict:
    """The few-class picture as plotly drew it in #embedding-plot: each data trace's meta with its points' x, y and
    class, the legend's entries, the axes' ranges and the panel names (the drift picture's)."""
    return page.evaluate(
        """() => {
            const chart = document.querySelector('#embedding-plot .js-plotly-plot');
            const layout = chart._fullLayout;
            const axes = Object.keys(layout).filter(key => /^[xy]axis\\d*$/.test(key));
            return {
                traces: chart._fullData.filter(t => t.meta && t.meta.kind).map(t => ({
                    meta: t.meta, x: Array.from(t.x), y: Array.from(t.y),
                    classes: Array.from(t.customdata, row => row[0])})),
                legend: chart._fullData.filter(t => t.showlegend).map(t => t.name),
                ranges: Object.fromEntries(axes.map(key => [key, layout[key].range])),
                panels: (layout.annotations || []).filter(note => /domain$/.test(note.xref || ''))
                    .map(note => note.text),
            };
        }""")


def _weights_by_class_and_age(drawn: dict) -> dict[tuple[int, int], np.ndarray]:
    return {(int(label), trace["meta"]["age"]): np.array([x, y]) for trace in drawn["traces"]
            if trace["meta"]["kind"] == "weights" for x, y, label in zip(trace["x"], trace["y"], trace["classes"],
                                                                         strict=True)}


def _unit_weights(snapshot) -> dict[tuple[int, int], np.ndarray]:
    """(class, age) -> the snapshot's class weight of that age, as a unit vector, for its focus classes."""
    focus = set(snapshot.focus_classes.tolist())
    weights = snapshot.class_weights.double().numpy()
    return {(label, age): weights[row] / np.linalg.norm(weights[row]) for row, (label, age) in
            enumerate(zip(snapshot.class_weight_labels.tolist(), snapshot.class_weight_ages.tolist(), strict=True))
            if label in focus}


def _pca_of_all(snapshot) -> dict[tuple[int, int], np.ndarray]:
    """(class, age) -> where a numpy PCA of every point of the snapshot's few-class view (its focus images, their
    classes' weights of every age, their stored rows) puts that class weight."""
    focus = set(snapshot.focus_classes.tolist())
    weights = _unit_weights(snapshot)
    stored = [row for row, (label, age) in enumerate(zip(snapshot.labels.tolist(), snapshot.ages.tolist(),
                                                         strict=True)) if label in focus and age >= 1]
    unit = [rows / np.linalg.norm(rows, axis=1, keepdims=True) for rows in
            (snapshot.focus_embeddings.double().numpy(), snapshot.embeddings[stored].double().numpy())]
    points = np.concatenate([unit[0], np.array(list(weights.values())), unit[1]])
    mean = points.mean(axis=0)
    _, _, vt = np.linalg.svd(points - mean, full_matrices=False)
    return {key: (vector - mean) @ vt[:2].T for key, vector in weights.items()}


def test_a_short_run_shows_virtual_sets_of_two_ages_and_spread_curves(page, screenshot, _app_served):
    run_id = _start_glyphs_mini(page, epochs=6)  # 54 steps: sets arrive at 21, 32 and 43
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Finished')",
                           timeout=WAIT_MS)
    page.wait_for_function("() => /step 50 · PCA/.test(document.querySelector('#snapshot-caption').innerText)",
                           timeout=WAIT_MS)
    points = _traces(page, "embedding-plot")
    virtual_ages = {trace["meta"]["age"] for trace in points
                    if trace["meta"] and trace["meta"]["age"] >= 1 and trace["points"] > 0}
    assert len(virtual_ages) >= 2, points
    assert any(trace["meta"] == {"kind": "weights", "age": 0} and trace["points"] == 8 for trace in points)
    drift = [trace for trace in _traces(page, "drift-plot") if trace["points"] > 0]
    assert {"from 11 steps ago", "from 22 steps ago", "now (the live batch)"} <= {trace["name"] for trace in drift}
    spread = {trace["name"]: trace["points"] for trace in _traces(page, "spread-plot")}
    assert spread["mean cos between two classes"] >= 4 and spread["uniformity (lower: more even)"] >= 4
    screenshot("train-few-classes")

    # The map holds real positions: the distances between two class weights (live or stored) are in proportion to
    # those a numpy PCA of all the view's points gives (the picture is turned onto the previous one and scaled whole)
    snapshot = _app_served[0].run_manager.get(run_id).latest_raw_snapshot
    assert snapshot.step == 50
    drawn = _drawn_points(page)
    on_page, expected = _weights_by_class_and_age(drawn), _pca_of_all(snapshot)
    assert set(on_page) == set(expected) and len(expected) == 8 * 4  # 8 classes, the live weight and 3 stored ones
    keys = sorted(expected)
    ratios = [np.linalg.norm(on_page[first] - on_page[second]) / np.linalg.norm(expected[first] - expected[second])
              for index, first in enumerate(keys) for second in keys[index + 1:]]
    np.testing.assert_allclose(ratios, np.median(ratios), rtol=1e-4)
    # zoomed to the data: every point inside the axes' square, their wider extent all of it but the 5% margins; a
    # folded legend, one entry per kind
    xy = np.array([(x, y) for trace in drawn["traces"] for x, y in zip(trace["x"], trace["y"], strict=True)])
    low, high = xy.min(axis=0), xy.max(axis=0)
    assert drawn["ranges"]["xaxis"] == drawn["ranges"]["yaxis"] == [-1, 1]
    assert (-1 < low).all() and (high < 1).all() and (high - low).max() == pytest.approx(2 / 1.1, abs=1e-6)
    assert drawn["legend"] == ["images now", "stored images (virtual)", "class weights now",
                               "stored class weights (virtual)"]
    assert page.evaluate(CUT_PICTURE_TEXT) == []

    # The drift picture: one panel per class, each stored weight at its true angle in degrees from the live one
    page.get_by_label("a few classes, drift").check()
    page.wait_for_function("() => /true angles/.test(document.querySelector('#snapshot-caption').innerText)",
                           timeout=WAIT_MS)
    drift_drawn = _drawn_points(page)
    assert len(drift_drawn["panels"]) == 8
    weights, around = _unit_weights(snapshot), _weights_by_class_and_age(drift_drawn)
    assert set(around) == set(weights)
    for (label, age), offset in around.items():
        degrees = np.degrees(np.arccos(np.clip(weights[label, age] @ weights[label, 0], -1, 1)))
        assert np.linalg.norm(offset) == pytest.approx(degrees, abs=0.05)
    assert page.evaluate(CUT_PICTURE_TEXT) == []
    screenshot("train-few-classes-drift")

    # On a phone: both pictures whole, no chart text past the chart's edges
    page.set_viewport_size({"width": 390, "height": 844})
    for label, shown in (("a few classes, drift", "true angles"), ("a few classes, PCA", "step 50 · PCA")):
        page.get_by_label(label).check()
        page.wait_for_function(f"() => document.querySelector('#snapshot-caption').innerText.includes('{shown}')",
                               timeout=WAIT_MS)
        page.wait_for_timeout(500)  # plotly's resize after the viewport changed
        assert page.evaluate(CUT_PICTURE_TEXT) == [], label
    screenshot("train-few-classes-phone")


def _final_metrics(folder) -> dict:
    evals = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["type"] == "eval"]
    return evals[-1]


def test_the_results_table_holds_both_runs_final_metrics_and_the_baseline_trains_its_tuned_settings(
        page, app_root, screenshot, monkeypatch):
    """glyphs-mini has no tuned baseline of its own: given one here (as glyphs has the fair comparison's), Compare
    trains the baseline with that optimiser, not the run's, and the table names both arms' settings."""
    from dataclasses import replace

    from demo.train import presets

    tuned = presets.Optimiser(lr=0.002, class_lr=0.02, adam_eps=1e-4, scale=30.0)
    # tuned at the 3 epochs this run trains (a baseline is tuned for one budget: demo.train.presets.TUNED_AT)
    monkeypatch.setitem(presets.PRESETS, "glyphs-mini", replace(presets.PRESETS["glyphs-mini"], epochs=3,
                                                                 baseline=tuned, tuning="tuned for this test"))
    run_id = _start_glyphs_mini(page, epochs=3)  # 27 steps: the first virtual set arrives at step 21
    page.wait_for_function("() => document.querySelector('#run-status').innerText.includes('Finished')",
                           timeout=WAIT_MS)
    page.evaluate("""() => {  // every text the notice shows from now on
        const notice = document.querySelector('#notice');
        window.noticeTexts = [];
        new MutationObserver(() => window.noticeTexts.push(notice.innerText))
            .observe(notice, {subtree: true, childList: true, characterData: true});
    }""")
    clicked = time.time()
    page.locator("#baseline").click()  # the run rests: the baseline trains alone
    page.wait_for_function("() => document.querySelector('#notice').innerText.includes('on its own')",
                           timeout=WAIT_MS)
    shown = page.evaluate("() => window.noticeTexts")
    starting = [i for i, text in enumerate(shown) if text.startswith("Starting the baseline (N = 0)")]
    answered = [i for i, text in enumerate(shown) if "on its own" in text]
    assert starting and starting[0] < answered[0], shown  # said at once, then how it went
    page.wait_for_function("() => document.querySelector('#results-table').innerText.includes('Final results')",
                           timeout=WAIT_MS)
    runs = app_root / "data" / "runs"
    epochs = json.loads((runs / run_id / "train_config.json").read_text())["epochs"]  # the run's, as it trained

    def baselines():
        # this Compare's baseline: trained after the click (an earlier test's may share its name's pattern)
        return [folder for folder in runs.iterdir() if "-baseline-" in folder.name
                and (folder / "train_config.json").is_file()
                and (folder / "train_config.json").stat().st_mtime >= clicked - 1
                and json.loads((folder / "train_config.json").read_text())["epochs"] == epochs]

    deadline = time.monotonic() + WAIT_MS / 1000  # its folder, written by its own process, may trail the page
    while not baselines() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert baselines(), f"no {epochs}-epoch baseline folder among {sorted(folder.name for folder in runs.iterdir())}"
    baseline_folder = max(baselines(), key=lambda folder: folder.stat().st_mtime)
    run, baseline = _final_metrics(runs / run_id), _final_metrics(baseline_folder)
    cells = page.evaluate("""() => Array.from(document.querySelectorAll('#results-table tbody tr'))
                                  .map(row => Array.from(row.cells).map(cell => cell.innerText.trim()))""")
    expected = []
    for key, name in (("recall@1", "Recall@1"), ("r_precision", "R-Precision"), ("map@r", "MAP@R")):
        mine, theirs = f"{100 * run[key]:.2f}", f"{100 * baseline[key]:.2f}"
        points = round(float(mine) - float(theirs), 2)
        expected.append([f"{name} (test)", mine, theirs, "0.00" if points == 0 else f"{points:+.2f}"])
    assert cells == expected
    config = json.loads((baseline_folder / "train_config.json").read_text())
    assert (config["memvir_n"], config["lr"], config["class_lr"], config["adam_eps"], config["loss_params"]) == (
        0, 0.002, 0.02, 1e-4, {"scale": 30.0})
    table = page.locator("#results-table").inner_text()
    assert ("This run: MemVir(N = 3, M = 10), balanced reduction; lr 0.001, class-weight lr 0.01, Adam eps 0.01, "
            "scale 23. Baseline: N = 0; lr 0.002, class-weight lr 0.02, Adam eps 0.0001, scale 30. Both optimisers "
            "are the fair comparison's choices, tuned for this test.") in table
    screenshot("train-results-table")


def _posted(request) -> int | None:
    """The function an event the page sends names by number (its POST's fn_index); None for any other request."""
    try:
        return json.loads(request.post_data or "{}").get("fn_index")
    except (ValueError, AttributeError):
        return None


def test_a_page_at_rest_polls_every_second_but_asks_for_the_spread_views_only_when_they_change(page):
    posted = []  # each event the page sends, from its reload on
    page.on("request", lambda request: posted.append(_posted(request)))
    page.reload()
    # The page's first polls have drawn the empty spread figures (a second poll sent once, at the first views key)
    page.wait_for_function("() => document.querySelector('#run-status')?.innerText.includes('Ready')",
                           timeout=WAIT_MS)
    page.wait_for_function("() => document.querySelector('#drift-plot')?.innerText.includes('first snapshot')",
                           timeout=WAIT_MS)
    page.wait_for_timeout(1500)
    names = page.evaluate("() => Object.fromEntries(window.gradio_config.dependencies.map(d => [d.id, d.api_name]))")
    first = [names.get(str(number)) for number in posted if number is not None]
    # The second poll went by the views timer: stopped at its tick (views_due), then the second poll
    assert "poll_views" in first and first.count("views_due") == first.count("poll_views"), first
    assert page.locator("#views-key").count() == 0  # no hidden textbox carries the key
    settled = len(posted)
    page.wait_for_timeout(6000)
    sent = [names.get(str(number)) for number in posted[settled:] if number is not None]
    assert sent.count("poll") >= 4, sent  # the first poll, once a second
    assert set(sent) == {"poll"}, sent  # no second poll: nothing new for the spread figures and the results table


def test_gradio_fires_a_state_s_change_after_a_queued_event_only(open_page, serve):
    """Why the second poll's trigger is a timer (demo.train.views), not a gr.State's change: gradio 6.31 fires a State's
    change after a queued event that changed it, but not after one outside the queue, as the polls are. Should this
    fail, gradio now does, and a gr.State could carry the poll's views key."""
    import gradio as gr

    changes = {"queued": 0, "unqueued": 0}

    def counter(name):
        def count():
            changes[name] += 1
        return count

    with gr.Blocks() as app:
        for name, queued in (("queued", True), ("unqueued", False)):
            button = gr.Button(name, elem_id=f"set-{name}")
            value = gr.State(0)
            button.click(lambda number: number + 1, [value], [value], queue=queued, api_name=f"set_{name}")
            value.change(counter(name), None, None, api_name=f"{name}_changed")
    try:
        page = open_page(serve(app))
        for name in changes:
            page.locator(f"#set-{name}").click()
        page.wait_for_timeout(3000)
        assert changes == {"queued": 1, "unqueued": 0}
    finally:
        app.close()
