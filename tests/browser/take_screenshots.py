"""The README's screenshots of the few-class view, taken from a default glyphs run in a real chromium (not a test:
run it by hand when the picture changes).

    .venv/bin/python tests/browser/take_screenshots.py [--out docs/screenshots] [--dataset glyphs-mini]

Serves the app on a free port (its own data folder, UMAP on) and presses Start with the page's opening settings
untouched: glyphs with its preset (demo.train.presets: batch 128, 12 epochs, N = 4, M = 10, warm-up 2 epochs,
balanced reduction; 95 steps an epoch, so the warm-up ends at step 190, the virtual sets arrive at steps 202, 213,
224 and 235 and the run ends at step 1,140) and a snapshot every 10 steps (the page's LIVE_SNAPSHOT_EVERY). It shoots
the few-class picture at three moments, computed from the preset (`moments`) and the run's own step count, not
written here: the first snapshot with a virtual set in use (step 210), the first with all N in use (step 240) and the
run's last snapshot (step 1,140). At the first two the run is paused, so that the snapshot gets its UMAP, and the
picture is shot in PCA and in UMAP before the run resumes; at the last, once the run has finished. The script checks
from the run's step records that each moment has the virtual sets it is named for, and that the pause came before
the next snapshot. Each PNG is quantised to a palette so it stays small. One run on a 2-core machine that other jobs
shared took 27 minutes, nearly all of them the run's 1,140 steps (about 0.7 a second there).

The page polls once a second and the run may take 10 steps (the next snapshot) in a few seconds on a fast machine,
so the script watches the run's step from the server's side, in the same process, and presses the page's Pause as
soon as the moment's step is done rather than when the page next shows it.

--dataset glyphs-mini picks that dataset in the page (its preset: batch 32, 8 epochs, N = 3, M = 10, warm-up 1 epoch;
moments at steps 30, 50 and 70) and names the files few-classes-glyphs-mini-*.png.
"""

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]  # the app, and the browser tests' chromium settings

# the file name stems of the three moments, in order
STEMS = ("1-first-virtual-set", "2-all-virtual-sets", "3-end")
# (file name suffix, the picture's choice on the page, what its caption says it shows)
PICTURES = (("pca", "a few classes, PCA", "PCA"), ("umap", "a few classes, UMAP", "UMAP"),
            ("drift", "a few classes, drift", "true angles"))
WAIT_MS = 1_800_000
WAIT_S = WAIT_MS / 1000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def moments(preset, total_steps: int, every: int) -> list[int]:
    """The snapshot steps to shoot in a run of `preset` with `total_steps` steps and a snapshot every `every` steps:
    the first snapshot with a virtual set in use, the first with all N in use, and the last snapshot."""
    from demo.train.presets import arrival_steps

    steps_per_epoch = total_steps // preset.epochs
    arrivals = arrival_steps(steps_per_epoch, preset.warmup_epochs, preset.memvir_n, preset.memvir_m)
    snapshots = range(every, total_steps + 1, every)
    steps = [next(step for step in snapshots if step >= arrivals[0]),
             next(step for step in snapshots if step >= arrivals[-1]), snapshots[-1]]
    if not steps[0] < steps[1] < steps[2]:
        raise SystemExit(f"the moments {steps} are not three distinct snapshots (arrivals {arrivals}, every {every})")
    return steps


def shoot(page, path: Path) -> None:
    from PIL import Image

    page.locator("#embedding-plot").screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(colors=128).save(path, optimize=True)


def caption(page) -> str:
    return " ".join(page.locator("#snapshot-caption").inner_text().split())


def wait_for_caption(page, pattern: str) -> None:
    page.wait_for_function("(pattern) => new RegExp(pattern).test(document.querySelector('#snapshot-caption')"
                           ".innerText.replace(/\\s+/g, ' '))", arg=pattern, timeout=WAIT_MS)


def wait_for_status(page, word: str) -> None:
    page.wait_for_function("(word) => document.querySelector('#run-status').innerText.includes(word)", arg=word,
                           timeout=WAIT_MS)


def wait_until(condition, what: str) -> None:
    """Poll `condition` every 5 ms (the run's step is read in this process, not through the page)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


def virtual_sets_at(run, step: int) -> int:
    """How many virtual sets the run used at `step` (from its step records: a snapshot's step is always logged)."""
    with run.lock:
        found = [record for record in run.records if record.get("type") == "step" and record["step"] == step]
    if not found:
        raise SystemExit(f"the run has no step record at step {step}")
    return found[-1]["num_virtual_sets"]


def main() -> None:
    from demo.train.presets import PAGE_DEFAULTS, PRESETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--dataset", choices=sorted(PRESETS), default=PAGE_DEFAULTS["dataset"],
                        help="the page's default (no pick) or another dataset with a preset, picked in the page")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    default = args.dataset == PAGE_DEFAULTS["dataset"]
    prefix = "few-classes-" if default else f"few-classes-{args.dataset}-"
    preset = PRESETS[args.dataset]

    from conftest import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    from demo.common.settings import AppSettings
    from demo.page import build_app
    from demo.train.tab import DATASET_CHOICES, LIVE_SNAPSHOT_EVERY

    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="screenshots-") as tmp:
        app = build_app(AppSettings(data_dir=Path(tmp) / "data", checkpoints_dir=Path(tmp) / "none", umap=True))
        port = free_port()
        app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")
                if not default:
                    label = next(label for label, value in DATASET_CHOICES if value == args.dataset)
                    page.get_by_label("Dataset").click()
                    page.get_by_role("option", name=label).click()
                    page.wait_for_function(
                        "(name) => document.querySelector('#notice').innerText.includes(`Settings for ${name}`)",
                        arg=args.dataset, timeout=WAIT_MS)
                page.locator("#start").click()
                started = time.monotonic()
                wait_until(lambda: any(run.total_steps for run in app.run_manager.runs()), "the run to start")
                run = app.run_manager.runs()[-1]
                config = run.config
                used = {name: getattr(config, name) for name in ("dataset", "batch_size", "epochs", "memvir_n",
                                                                  "memvir_m", "warmup_epochs", "memvir_reduction")}
                wanted = {"dataset": args.dataset, **{name: value for name, value in preset.settings().items()
                                                      if name in used}}
                if used != wanted or config.snapshot_every != LIVE_SNAPSHOT_EVERY:
                    raise SystemExit(f"the page started {used}, a snapshot every {config.snapshot_every} steps; "
                                     f"the preset is {wanted}, every {LIVE_SNAPSHOT_EVERY}")
                steps = moments(preset, run.total_steps, config.snapshot_every)
                print(f"{args.dataset}: {run.total_steps:,} steps, {run.total_steps // preset.epochs} an epoch; "
                      f"moments at snapshot steps {', '.join(f'{step:,}' for step in steps)}", flush=True)
                for stem, step in zip(STEMS, steps, strict=True):
                    last = step == steps[-1]
                    if last:
                        wait_for_status(page, "Finished")
                        print(f"the run took {time.monotonic() - started:.0f} s from Start, pauses included",
                              flush=True)
                    else:
                        wait_until(lambda step=step: run.last_step is not None and run.last_step.step >= step,
                                   f"step {step}")
                        page.locator("#pause").click()
                        wait_for_status(page, "Paused")
                        paused_at = run.last_step.step
                        if paused_at >= step + config.snapshot_every:
                            raise SystemExit(f"the run paused at step {paused_at}, past the next snapshot after "
                                             f"{step}: its UMAP would not be step {step}'s")
                    sets = virtual_sets_at(run, step)
                    before = virtual_sets_at(run, step - config.snapshot_every)
                    print(f"step {step:,}: virtual sets in use {sets} (at the snapshot before, {before})"
                          + ("" if last else f"; paused after step {paused_at:,}"), flush=True)
                    if stem == STEMS[0] and not (sets >= 1 and before == 0):
                        raise SystemExit(f"step {step} is not the first snapshot with a virtual set")
                    if stem == STEMS[1] and not (sets == preset.memvir_n and before < preset.memvir_n):
                        raise SystemExit(f"step {step} is not the first snapshot with all {preset.memvir_n} sets")
                    for method, label, shown in PICTURES:
                        page.get_by_label(label).check()
                        # the UMAP picture once the paused (or finished) run's snapshot has its layout; a poll may
                        # still replace a picture just chosen with "no snapshot yet" for a moment, so the caption
                        # must hold both before and after the shot
                        wanted_caption = f"step {step:,} · {shown} · training"
                        name = f"{prefix}{stem}-{method}.png"
                        for _ in range(10):
                            wait_for_caption(page, wanted_caption)
                            page.wait_for_timeout(3000)
                            if wanted_caption in caption(page):
                                shoot(page, args.out / name)
                                if wanted_caption in caption(page):
                                    break
                        else:
                            raise SystemExit(f"{name}: the caption never held '{wanted_caption}' around the shot")
                        print(f"{name}: {caption(page)}", flush=True)
                    page.get_by_label(PICTURES[0][1]).check()
                    if not last:
                        page.locator("#resume").click()
                        wait_for_status(page, "Training")
                browser.close()
        finally:
            app.close()
    print(f"{time.monotonic() - began:.0f} s in all", flush=True)


if __name__ == "__main__":
    main()
