"""What one visitor opening the page costs: chromium's CPU and the server's, for each page load of the app as
`python app.py` serves it (the bundled checkpoints).

Run (as root, where cgroup v1's cpuacct is mounted at /sys/fs/cgroup/cpuacct):
.venv/bin/python bench/bench_page_load.py [--loads 4] [--settle-s 3] [--chromium-arg=--some-flag ...]

Each load is a new browser context (a new visitor: nothing cached) at 1400 x 900, timed from `goto` to the Train
tab's Start button, then left `--settle-s` seconds for what the page does after its first screen (its load event,
the first poll, the plots it draws). Chromium's CPU is read from a cpuacct cgroup that this process moves into after
starting the app (so it holds this process, Playwright's driver and chromium's processes, exited ones included),
less this process's own; the server's from /proc. The browser is the one the browser tests drive, with their flags
(tests/browser/conftest.py), plus any `--chromium-arg`. Prints a markdown table (for docs/benchmarks.md).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests" / "browser"))

from bench_app import process_cpu_s, start_app  # noqa: E402 - bench/ is on the path now
from conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402 - the browser tests' chromium and flags

CGROUP = Path("/sys/fs/cgroup/cpuacct")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=4)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--chromium-arg", action="append", default=[])
    args = parser.parse_args()
    if not os.access(CGROUP, os.W_OK):
        sys.exit(f"{CGROUP} is not writable here: this benchmark reads chromium's CPU from a cgroup of its own (root)")
    from playwright.sync_api import sync_playwright

    server, url, _, _ = start_app(Path(tempfile.mkdtemp()) / "data", MEMVIR_UMAP="0")
    while True:  # until the server's warm-up is over: less than a tenth of a core for a second
        before = process_cpu_s(server.pid)
        time.sleep(1)
        if process_cpu_s(server.pid) - before < 0.1:
            break
    group = CGROUP / f"bench-page-load-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))

        def chromium_cpu_s() -> float:
            own = os.times()
            return int((group / "cpuacct.usage").read_text()) / 1e9 - own.user - own.system

        rows = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                                 args=CHROMIUM_ARGS + args.chromium_arg)
            for _ in range(args.loads):
                chromium, served = chromium_cpu_s(), process_cpu_s(server.pid)
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                began = time.perf_counter()
                page.goto(url)
                page.wait_for_selector("#start", timeout=120_000)
                first_screen_s, first_screen_cpu = time.perf_counter() - began, chromium_cpu_s() - chromium
                time.sleep(args.settle_s)
                rows.append((first_screen_s, first_screen_cpu, chromium_cpu_s() - chromium,
                             process_cpu_s(server.pid) - served))
                context.close()
            browser.close()
    finally:
        (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()
        server.terminate()
        server.wait(30)
    print(f"| load | Start shown (s) | chromium CPU-s to it | chromium CPU-s with {args.settle_s:g} s after | "
          "server CPU-s |")
    print("|---|---|---|---|---|")
    for number, (shown, to_shown, total, served) in enumerate(rows, 1):
        print(f"| {number} | {shown:.2f} | {to_shown:.2f} | {total:.2f} | {served:.2f} |")
    medians = [statistics.median(column) for column in zip(*rows, strict=True)]
    print("| median | " + " | ".join(f"{value:.2f}" for value in medians) + " |")


if __name__ == "__main__":
    main()
