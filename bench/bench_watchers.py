"""Many watchers of one training run: what a crowd of open pages costs the page, the polls and the run.

Run: .venv/bin/python bench/bench_watchers.py [--watchers 40] [--seconds 60] [--quiet-s 30]

`python app.py` in a subprocess trains one run (bench_app's settings, started through gradio_client, its owner's page
polling once a second). Once its memory is full the run trains a quiet window (its owner only), then `--watchers`
visitors arrive within two seconds and stay `--seconds`, each as a browser tab does: it fetches the page, sends the
load event, then polls at the interval the server sets its timer to (a second at first; a crowd's pages are slowed,
demo.runs.audience) and sends the second poll when the first says the views changed; then another quiet window.
Each visitor is its own session. Printed as a markdown table (for docs/benchmarks.md): the page and
the load event as each visitor waited for them (median, p99), every poll's answer time (median, p99), and those of
the polls sent once the crowd's arrival is over, the polls answered against those due at each page's interval, the
run's steps a second while watched against the mean of the quiet windows before and after (the same run in the same
minutes: a machine's drifting load touches both; each rate timed between logged steps as they appear), and the CPU
of the server's main process and of this process (the visitors' client, which a real crowd runs elsewhere).
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_app import APP_SETTINGS, PagePolls, percentile, process_cpu_s, start_app, views_due  # noqa: E402 - bench/ is on the path now

from memvir.checkpoint import RunFolder  # noqa: E402 - bench_app put the repository on the path

ARRIVAL_S = 2.0  # the crowd arrives within this many seconds, as after a link is shared
SETTLE_S = 8.0  # after the arrivals, when the pages' opening no longer holds up a poll


def last_step(run_dir: Path) -> int:
    """The newest step the run's metrics.jsonl records (its logged steps: every few steps)."""
    # metrics.jsonl is written from the run's first logged step: none before
    steps = [record["step"] for record in RunFolder(run_dir).records() if record.get("type") == "step"]
    return steps[-1] if steps else 0


def steps_per_s(run_dir: Path, seconds: float, during=None) -> float:
    """The run's steps a second over `seconds` (while `during`, a callable started in a thread, runs): between the
    first and the last logged step seen in the window, each timed as it appears (read every 0.1 s), so that the
    rate does not depend on where the window cuts the logging's intervals of several steps."""
    worker = threading.Thread(target=during, daemon=True) if during else None
    if worker:
        worker.start()
    seen, ends = [], time.perf_counter() + seconds
    while time.perf_counter() < ends:
        step = last_step(run_dir)
        if not seen or step != seen[-1][1]:
            seen.append((time.perf_counter(), step))
        time.sleep(0.1)
    if worker:
        worker.join()
    if len(seen) < 3:
        raise RuntimeError(f"the run logged {len(seen) - 1} steps in {seconds:g} s: too few to time its rate")
    (first_at, first), (last_at, last) = seen[1], seen[-1]  # seen[0]: logged before the window began
    return (last - first) / (last_at - first_at)


def load_event(url: str) -> dict:
    """The page's load event as its config describes it: its index and whether the browser queues it."""
    import httpx

    config = httpx.get(f"{url}config", timeout=60).json()
    (load,) = [d for d in config["dependencies"] if d.get("api_name") == "load"]
    return {"fn_index": load["id"], "queued": load.get("queue") is not False}


class Visitor:
    """One open tab: the page, its load event, then a poll a second until `until` (perf_counter)."""

    def __init__(self, url: str, load: dict):
        self.page = PagePolls(url, uuid.uuid4().hex[:11])
        self.url, self.load = url, load
        self.page_s = self.load_s = float("nan")
        self.poll_s: list[float] = []
        self.poll_sent: list[float] = []  # when each poll was sent (perf_counter)
        self.interval = 1.0  # seconds between its polls, as the server last set its timer
        self.due = 0.0  # the polls its interval asked for

    def _load(self) -> None:
        """As the browser sends it: one POST where the event is not queued, else a place in the queue and its
        event stream until the answer."""
        if not self.load["queued"]:
            self.page._post("load", [None])
            return
        http, session = self.page.http, self.page.session_hash
        http.post(f"{self.url}gradio_api/queue/join", json={
            "data": [None], "fn_index": self.load["fn_index"], "session_hash": session, "event_data": None,
            "trigger_id": None}).raise_for_status()
        with http.stream("GET", f"{self.url}gradio_api/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                    return

    def visit(self, delay: float, until: float) -> None:
        time.sleep(delay)
        began = time.perf_counter()
        self.page.http.get(self.url).raise_for_status()
        self.page_s = time.perf_counter() - began
        began = time.perf_counter()
        self._load()
        self.load_s = time.perf_counter() - began
        watched_from = time.perf_counter()
        while (now := time.perf_counter()) < until:
            answer = self.page._post("poll", [None, "few", True, None])
            self.poll_s.append(time.perf_counter() - now)
            self.poll_sent.append(now)
            timer = answer[-2]  # the page's timer, where the server changes its interval (demo.runs.audience)
            if isinstance(timer, dict) and timer.get("value") is not None:
                self.interval = float(timer["value"])
            if views_due(answer):  # the page's second poll
                self.page._post("poll_views", [None, None, None])
            time.sleep(max(0.0, self.interval - (time.perf_counter() - now)))
        self.due = (until - watched_from) / self.interval


def crowd(url: str, watchers: int, seconds: float) -> list[Visitor]:
    load = load_event(url)
    visitors = [Visitor(url, load) for _ in range(watchers)]
    until = time.perf_counter() + ARRIVAL_S + seconds
    with ThreadPoolExecutor(watchers) as pool:
        for future in [pool.submit(v.visit, random.uniform(0, ARRIVAL_S), until) for v in visitors]:
            future.result()
    return visitors


def measure(watchers: int, seconds: float, quiet_s: float) -> dict:
    from gradio_client import Client

    random.seed(0)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:  # the run may write as it ends
        data = Path(tmp)
        server, url, _, _ = start_app(data)
        owner_polling = threading.Event()
        try:
            time.sleep(3)  # the background import of the trainer, as for a visitor reading the page
            client = Client(url, verbose=False, httpx_kwargs={"timeout": 120})
            owner = PagePolls(url, client.session_hash)
            client.predict(**{**APP_SETTINGS, "eval_every": 0}, epochs=50, api_name="/start_run")
            run_dir = next((data / "runs").iterdir())

            def owner_polls():
                while not owner_polling.is_set():
                    owner.poll()
                    time.sleep(1.0)

            threading.Thread(target=owner_polls, daemon=True).start()
            while last_step(run_dir) < 80:  # past the first steps and the memory filling (bench_app)
                time.sleep(0.5)
            before = steps_per_s(run_dir, quiet_s)
            visitors: list[Visitor] = []
            arrived, server_cpu, own_cpu = time.perf_counter(), process_cpu_s(server.pid), sum(os.times()[:2])
            watched = steps_per_s(run_dir, ARRIVAL_S + seconds,
                                  during=lambda: visitors.extend(crowd(url, watchers, seconds)))
            watched_s = time.perf_counter() - arrived
            server_cores = (process_cpu_s(server.pid) - server_cpu) / watched_s
            client_cores = (sum(os.times()[:2]) - own_cpu) / watched_s
            after = steps_per_s(run_dir, quiet_s)
            owner_polling.set()
            client.predict(api_name="/stop_run")
        finally:
            server.terminate()
            server.wait(30)
    polls = [s for v in visitors for s in v.poll_s]
    settled = arrived + ARRIVAL_S + SETTLE_S
    later = [s for v in visitors for s, sent in zip(v.poll_s, v.poll_sent, strict=True) if sent >= settled]
    return {"later_poll_s": later, "server_cores": server_cores, "client_cores": client_cores,
            "watchers": watchers, "seconds": seconds, "page_s": [v.page_s for v in visitors],
            "load_s": [v.load_s for v in visitors], "poll_s": polls, "polls_due": sum(v.due for v in visitors),
            "intervals": sorted({v.interval for v in visitors}),
            "speed_ratio": watched / statistics.mean([before, after]), "quiet": (before, after), "watched": watched}


def table(result: dict) -> str:
    def spread(values):
        return f"{statistics.median(values):.2f} s median, {percentile(values, 0.99):.2f} s p99"

    rows = [("page served (each visitor's GET /)", spread(result["page_s"])),
            ("load event answered", spread(result["load_s"])),
            ("poll answered", spread(result["poll_s"])),
            (f"poll answered, sent {ARRIVAL_S + SETTLE_S:.0f} s after the crowd began to arrive or later",
             spread(result["later_poll_s"])),
            ("polls answered / due at the pages' intervals", f"{len(result['poll_s'])} / {result['polls_due']:.0f}"),
            ("the pages' poll intervals at the end", ", ".join(f"{i:.0f} s" for i in result["intervals"])),
            ("run's steps/s watched / quiet",
             f"{result['speed_ratio']:.2f} ({result['watched']:.2f} against "
             f"{result['quiet'][0]:.2f} before, {result['quiet'][1]:.2f} after)"),
            ("CPU while watched: the server's main process / the visitors' client (this process), in cores",
             f"{result['server_cores']:.2f} / {result['client_cores']:.2f}")]
    head = f"| {result['watchers']} watchers for {result['seconds']:.0f} s | result |\n|---|---|\n"
    return head + "\n".join(f"| {name} | {value} |" for name, value in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--quiet-s", type=float, default=30.0)
    args = parser.parse_args()
    print(table(measure(args.watchers, args.seconds, args.quiet_s)))


if __name__ == "__main__":
    main()
