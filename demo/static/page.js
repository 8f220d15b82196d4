// The page's script, run once it loads (demo/page.py passes it to launch()).
//
// Plotly writes an annotation on one line, so on a narrow screen a long one (the empty snapshot's message) runs past
// both edges of its chart. Whenever charts are drawn, such a line is broken at spaces to the chart's width with
// plotly's own line break (<br>), through Plotly.relayout, so the figure stays plotly's to redraw.
//
// A slider's number box (N, M, warm-up, the snapshot scrubber) applies what it shows on Enter, and only on Enter.
// Gradio's slider sends its "release" when the box loses focus, in the same moment, before the typed value has
// reached the page's state, so the server got the previous value (issue 31); and any Tab out of a box sent a live
// change. Here Enter hands the typed value to the slider's range input and releases that, the way a drag ends (gradio
// waits a tick there, so the new value goes out), and neither a blur of the box nor a click in it sends anything.
//
// A page that stops hearing its polls' answers (the server busy or unreachable, the connection lost) says so in a
// notice at the top, with how long it has been, and takes it down when the answers come again: the timer keeps
// asking meanwhile, and a run trains on whether or not a page watches it. "Stopped" is judged against the answers'
// own pace, which a crowd of watchers slows (demo.runs.audience): four of its gaps, and at least STALE_AFTER_MS.
//
// A click on a search's result tile (its gallery and item in data attributes), or on a point of the snapshot picture
// that is an image (its trace's meta names a "pick" set, the point's row last in its customdata), is sent to the
// server through two out-of-sight components: the click as JSON in a text box, and a button that sends it
// (demo.retrieve.tab.search_result_tile, demo.train.neighbours). gr.HTML and gr.Plot pass no such click themselves.
//
// Start and Compare with baseline bring the status line and the loss chart into view (the run's buttons stay in sight
// while the visitor scrolls through the settings, page.css): what the click started, or why it was refused, is there.
//
// On a phone the settings fold under Start and their one-line summary: their accordion (#train-settings, open as the
// page is built, for wide screens) is closed once, as it is first drawn on a screen as narrow as page.css's phone
// layout; a tap on its header opens it.
() => {
    const STALE_AFTER_MS = 10000;
    let lastHeard = Date.now();
    const gaps = [];
    const stale = document.createElement("div");
    stale.id = "stale-notice";
    stale.setAttribute("role", "status");
    stale.hidden = true;
    document.body.appendChild(stale);
    window.memvirHeard = () => {
        const now = Date.now();
        gaps.push(now - lastHeard);
        if (gaps.length > 5) gaps.shift();
        lastHeard = now;
        stale.hidden = true;
    };
    setInterval(() => {
        const silent = Date.now() - lastHeard;
        if (silent < Math.max(STALE_AFTER_MS, 4 * Math.max(0, ...gaps))) return;
        stale.textContent = `No update from the server for ${Math.round(silent / 1000)} s. This page keeps asking and ` +
            "catches up by itself when the answers come again; a run trains on meanwhile.";
        stale.hidden = false;
    }, 1000);

    // Gradio's dropdown opens its list when it takes focus, and left by Tab it stays open (every dropdown tabbed
    // through kept its list over the page), as does one that an answer redraws while focus is elsewhere: a dropdown
    // open without focus in its box or its list is closed as its Escape key closes it, when focus leaves it and
    // whenever the page changes.
    function closeLeftDropdowns() {
        for (const box of document.querySelectorAll('input[role="combobox"][aria-expanded="true"]')) {
            const list = document.getElementById(box.getAttribute("aria-controls") || "");
            if (box === document.activeElement || (list && list.contains(document.activeElement))) continue;
            box.dispatchEvent(new KeyboardEvent("keydown", {key: "Escape", bubbles: true}));
        }
    }
    document.addEventListener("focusout", () => setTimeout(closeLeftDropdowns, 0), true);

    // A click sent through an out-of-sight text box (#name) and the button beside it (#name-go)
    function sendClick(name, value) {
        const box = document.querySelector(`#${name} textarea, #${name} input`);
        const send = document.querySelector(`#${name}-go`);
        if (!box || !send) return;
        box.value = JSON.stringify(value);
        box.dispatchEvent(new Event("input", {bubbles: true}));
        send.click();
    }

    // A click on a search's result tile searches with that image (demo.retrieve.tab.search_result_tile)
    document.addEventListener("click", (event) => {
        const tile = event.target instanceof Element && event.target.closest("#results .result-tile[data-item]");
        if (tile) sendClick("tile-pick", {gallery: tile.dataset.gallery, item: Number(tile.dataset.item)});
    });

    document.addEventListener("click", (event) => {
        if (!(event.target instanceof Element) || !event.target.closest("#start, #baseline")) return;
        const status = document.querySelector("#run-status");
        const chart = document.querySelector("#curves-plot");
        if (!status) return;
        const top = status.getBoundingClientRect().top;
        const chartTop = chart ? chart.getBoundingClientRect().top : top;
        if (top < 0 || top > window.innerHeight / 2 || chartTop > window.innerHeight * 0.75) {
            status.scrollIntoView({block: "start", behavior: "smooth"});
        }
    });
    const rangeOf = (box) => box instanceof HTMLInputElement && box.matches('input[data-testid="number-input"]')
        ? box.closest(".wrap")?.querySelector('input[data-testid="range-input"]') : null;
    document.addEventListener("keydown", (event) => {
        if (event.key !== "Enter") return;
        const range = rangeOf(event.target);
        if (!range) return;
        event.preventDefault();
        range.value = event.target.value;  // the range input clamps it to the slider's bounds
        range.dispatchEvent(new Event("input", {bubbles: true}));
        range.dispatchEvent(new PointerEvent("pointerup", {bubbles: true}));
        event.target.value = range.value;
    });
    // Captured before the box's own listeners: neither a blur nor a click in the box sends a release
    for (const type of ["blur", "pointerup"]) {
        document.addEventListener(type, (event) => {
            if (rangeOf(event.target)) event.stopPropagation();
        }, true);
    }

    const margin = 24;

    function wrapped(text, perLine) {
        const lines = [];
        for (const word of text.split(" ")) {
            const last = lines.length - 1;
            if (last >= 0 && lines[last].length + 1 + word.length <= perLine) lines[last] += " " + word;
            else lines.push(word);
        }
        return lines.join("<br>");
    }

    function fit(chart) {
        const annotations = chart.layout && chart.layout.annotations;
        if (!annotations || !window.Plotly) return;
        const room = chart.clientWidth - margin;
        const edits = {};
        for (const group of chart.querySelectorAll(".annotation[data-index]")) {
            const index = Number(group.dataset.index);
            const text = annotations[index] && annotations[index].text;
            const drawn = group.querySelector(".annotation-text");
            if (typeof text !== "string" || text.includes("<br>") || !drawn || room <= 0) continue;
            const width = drawn.getBBox().width;
            if (width > room) edits[`annotations[${index}].text`] = wrapped(text, Math.floor(text.length * room / width));
        }
        if (Object.keys(edits).length) window.Plotly.relayout(chart, edits);
    }

    // The answers that appear beside what sent them (a live change's under the sliders, the classes box's beside it)
    // are scrolled to, the least that shows them, when they change: the slider typed into may sit far above.
    const besideNotices = ["#memvir-notice", "#classes-notice"];
    const shownNotices = new Map();

    function showNewNotices() {
        for (const selector of besideNotices) {
            const notice = document.querySelector(selector);
            // its Markdown's text only: gradio draws an event's progress timer ("0.6s") inside the block too, and a
            // changing timer scrolled a page just opened down to the sliders
            const shown = notice && (notice.querySelector(".prose") || notice);
            const text = shown ? shown.innerText.trim() : "";
            if (text && shownNotices.has(selector) && shownNotices.get(selector) !== text) {
                notice.scrollIntoView({block: "nearest"});
            }
            shownNotices.set(selector, text);
        }
    }

    function sendPick(event) {
        const point = event.points && event.points[0];
        const pick = point && point.data && point.data.meta && point.data.meta.pick;
        const chart = document.querySelector("#embedding-plot .js-plotly-plot");
        const data = point && point.customdata;  // a row of customdata: an array, or a typed one
        if (!pick || !chart || !data || !data.length) return;
        const step = chart.layout && chart.layout.meta && chart.layout.meta.step;
        sendClick("snapshot-pick", {step, set: pick, row: Number(data[data.length - 1])});
    }

    function listenForPicks() {
        const chart = document.querySelector("#embedding-plot .js-plotly-plot");
        // plotly replaces its event emitter when it draws a chart anew: listen again on each new one
        if (chart && chart._ev && chart._ev !== chart.memvirPicks) {
            chart.memvirPicks = chart._ev;
            chart.on("plotly_click", sendPick);
        }
    }

    const phone = window.matchMedia("(max-width: 600px)");  // page.css's phone layout
    let settingsSeen = false;

    function foldSettingsOnPhone() {
        const header = settingsSeen ? null : document.querySelector("#train-settings > .label-wrap");
        if (!header) return;
        settingsSeen = true;
        if (phone.matches && header.classList.contains("open")) header.click();
        header.parentElement.dataset.foldChecked = "yes";  // a script (the browser tests) may act on the fold now
    }

    foldSettingsOnPhone();
    let scheduled = false;
    new MutationObserver(() => {
        foldSettingsOnPhone();  // at once, not a frame later: the open settings are never drawn on a phone
        if (scheduled) return;
        scheduled = true;
        requestAnimationFrame(() => {
            scheduled = false;
            document.querySelectorAll(".js-plotly-plot").forEach(fit);
            showNewNotices();
            listenForPicks();
            closeLeftDropdowns();
        });
    }).observe(document.body, {childList: true, subtree: true});
}
