// The page's script, run once it loads (demo/page.py passes it to launch()).
//
// Plotly writes an annotation on one line, so on a narrow screen a long one (the empty snapshot's message) runs past
// both edges of its chart. Whenever charts are drawn, such a line is broken at spaces to the chart's width with
// plotly's own line break (<br>), through Plotly.relayout, so the figure stays plotly's to redraw.
//
// Enter in a slider's number box: Gradio sends a typed value when the box loses focus, so Enter did nothing. Blurring
// the box on Enter sends it (the N, M and warm-up sliders' live change, the scrub slider's snapshot).
() => {
    document.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && event.target.matches('input[data-testid="number-input"]')) event.target.blur();
    });

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

    let scheduled = false;
    new MutationObserver(() => {
        if (scheduled) return;
        scheduled = true;
        requestAnimationFrame(() => {
            scheduled = false;
            document.querySelectorAll(".js-plotly-plot").forEach(fit);
        });
    }).observe(document.body, {childList: true, subtree: true});
}
