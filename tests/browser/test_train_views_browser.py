"""The Train tab's new views in a real headless chromium: a short glyphs-mini run whose few-class snapshot holds
virtual sets of two ages and whose spread curves fill in, and a run finished beside its baseline whose results table
holds both runs' final metrics as their metrics.jsonl files have them; a page at rest sends its poll and not the
second one (the spread figures and results, asked for when the poll's views key changes), and why a timer asks for
it: gradio fires no State's change after an unqueued event. Read from the page's plotly figures, table and requests;
waits are Playwright's, bounded; nothing asserts speed."""

import json
import re
import time

import pytest
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


def test_a_short_run_shows_virtual_sets_of_two_ages_and_spread_curves(page, screenshot):
    _start_glyphs_mini(page, epochs=6)  # 54 steps: sets arrive at 21, 32 and 43
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
