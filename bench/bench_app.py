"""The app's speed: page served after `python app.py`, the first search after a fresh start, first loss point after
Start, the poll handler, training speed with a page polling vs the CLI on the same configuration, the server's
memory, and a query on a 10,000+ image gallery.

Run: .venv/bin/python bench/bench_app.py [--epochs 2] [--rounds 3] [--starts 3] [--first-query-only]
[--server-priority low|idle|normal] [--noise-floor] (a CLI run in place of the app: the measure's own spread)
[--interleaved BLOCKS [--turn-s 30]] (a long app run and a long CLI run taking turns: both timed in the same minutes,
neither paying its start; with --noise-floor, two CLI runs) [--page-cost WINDOWS [--turn-s 30]] (one app run with and
without a page polling, in alternating windows: what the page costs the run, and where the CPU goes). Prints a
markdown table (for docs/benchmarks.md). Training speed is the trainer's own images/s (median of the logged steps) and
the wall time of the training loop; the app is polled once a second over HTTP, as an open page does (its poll, and
its second poll for the spread figures and the results when the first says they changed). App and CLI runs
alternate, `--rounds` of each, so that a machine's load drifting during the benchmark touches both alike: the ratio is
given as the median of the rounds' ratios, with their spread. The first search is timed from the moment the page is
served by a fresh `python app.py` to the answer of a search through gradio_client (the client's own connection
included), on the bundled MemVir checkpoint's gallery of 12,252 glyphs.
"""

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PYTHON = sys.executable

from demo.common.cores import SERVER_PRIORITIES  # noqa: E402 - after the repository is on the path
from memvir.checkpoint import RunFolder  # noqa: E402

# The training compared, in the app and on the command line: the app's defaults for glyphs where not named here, and
# no warm-up, so that the memory is full (N(M+1) = 55 steps) well before the timed second half of a run.
APP_SETTINGS = {"dataset": "glyphs", "batch_size": 128, "snapshot_every": 25, "eval_every": 1, "memvir_n": 5,
                "memvir_m": 10, "warmup_epochs": 0, "memvir_reduction": "balanced"}
CLI_FLAGS = ["--dataset", "glyphs", "--loss", "norm-softmax", "--batch-size", "128", "--memvir-n", "5",
             "--memvir-m", "10", "--warmup-epochs", "0", "--memvir-reduction", "balanced", "--seed", "0"]
SETTLE_STEPS = 50  # a block's first steps left out: the logged images/s is a moving average (weight 0.9 a step)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _step_records(run_dir: Path) -> list[dict]:
    """The step records of a run's metrics.jsonl; none before the run has written it."""
    return [record for record in RunFolder(run_dir).records() if record.get("type") == "step"]


def median_images_per_s(run_dir: Path) -> float:
    """Median logged images/s over the second half of the run: with no warm-up and N(M+1) = 55 steps, the memory is
    full and the step's cost steady there, so a shift between two runs' phases cannot move the median."""
    steps = _step_records(run_dir)
    last = steps[-1]["step"]
    return statistics.median(r["images_per_s"] for r in steps if r["step"] > last / 2)


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def _children(pid: int) -> list[int]:
    """The processes `pid` started (a run's training process), from /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process `pid`'s own threads (not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def start_app(data_dir: Path, **env_extra) -> tuple[subprocess.Popen, str, float, float]:
    """`python app.py` in a subprocess; (process, url, seconds until its starting page answered, seconds until the
    app's page is served). The starting page (demo.common.starting_page) answers 503 until the app takes the port."""
    port = free_port()
    env = {**os.environ, "MEMVIR_APP_DATA": str(data_dir), "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", **env_extra}
    started = time.perf_counter()
    server = subprocess.Popen([PYTHON, "app.py"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    starting_s = float("nan")
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return server, url, starting_s, time.perf_counter() - started
        except urllib.error.HTTPError as refused:
            if refused.code == 503 and starting_s != starting_s:  # the first answer of the starting page
                starting_s = time.perf_counter() - started
            time.sleep(0.05)
        except OSError:
            time.sleep(0.05)
        if time.perf_counter() - started > 120:
            server.terminate()
            raise RuntimeError("the page was not served within 120 s")


def first_search(data_dir: Path, query: Path, **env_extra) -> tuple[float, float]:
    """(seconds until a fresh `python app.py` serves the page, seconds from then to the answer of its first search:
    the bundled MemVir checkpoint, its test split, an uploaded glyph), as a visitor who searches at once waits."""
    from gradio_client import Client, handle_file

    server, url, _, page_s = start_app(data_dir, **env_extra)
    try:
        served = time.perf_counter()
        # The client API's search (the page's own event is private): the hits as values, without the result tiles'
        # images the page's answer carries inline.
        client = Client(url, verbose=False, download_files=False)
        found = client.predict(checkpoint=str(REPO / "checkpoints" / "glyphs-norm-softmax-memvir"), k=8,
                               query_image=handle_file(query), api_name="/search")
        answered = time.perf_counter() - served
    finally:
        server.terminate()
        server.wait(30)
    assert len(found["hits"]) == 8, found
    return page_s, answered


def first_searches(tmp: Path, starts: int) -> dict:
    """The first search after `starts` fresh starts with this machine's glyph cache, and as many with an empty one
    (a new machine, such as a Space's first start, renders the glyphs once: about 1.5 s on 2 cores)."""
    from memvir.data import load_dataset

    tmp.mkdir(parents=True, exist_ok=True)
    query = tmp / "query.png"
    load_dataset("glyphs").test.image(1234).save(query)
    warm = [first_search(tmp / f"warm-{i}", query) for i in range(starts)]
    cold = [first_search(tmp / f"cold-{i}", query, MEMVIR_CACHE=str(tmp / f"empty-cache-{i}")) for i in range(starts)]
    return {"warm": warm, "cold": cold}


def views_due(poll_answer: list) -> bool:
    """Whether a poll's answer starts the page's one-shot views timer (demo.train.views), whose tick sends the second
    poll: the poll's views key changed."""
    update = poll_answer[-1]
    return isinstance(update, dict) and update.get("active") is True


class PagePolls:
    """The polls of an open page, as its script sends them: each event a single POST to /gradio_api/run/NAME (the
    poll events are not queued, demo.train.views), in the session that started the run."""

    def __init__(self, url: str, session_hash: str):
        import httpx

        self.http = httpx.Client(timeout=120)  # a slow poll on a busy machine is a figure to record, not a failure
        self.url, self.session_hash = url, session_hash
        self.views_polls = 0  # second polls sent
        self.poll_ms = float("nan")

    def _post(self, name: str, data: list) -> list:
        response = self.http.post(f"{self.url}gradio_api/run/{name}",
                                  json={"data": data, "session_hash": self.session_hash})
        response.raise_for_status()
        return response.json()["data"]

    def poll(self) -> str:
        """The poll (state, picture "few", following, no browser key), and the second poll when the first says its
        views changed (`views_due`); the status line."""
        began = time.perf_counter()
        answer = self._post("poll", [None, "few", True, None])
        self.poll_ms = 1000 * (time.perf_counter() - began)  # the first poll's answer, as the page waits for it
        if views_due(answer):
            self.views_polls += 1
            self._post("poll_views", [None, None, None])
        return answer[1]


def app_round(data_dir: Path, epochs: int, server_priority: str) -> dict:
    """`python app.py` in a subprocess; time to the page, then a run started through gradio_client and watched as an
    open page does (a poll a second, each timed: `PagePolls`), with the server's memory and CPU time from /proc."""
    from gradio_client import Client

    server, url, _, page_s = start_app(data_dir, MEMVIR_SERVER_PRIORITY=server_priority)
    try:
        time.sleep(3)  # let the background import of the trainer finish, as for a visitor reading the page

        client = Client(url, verbose=False, httpx_kwargs={"timeout": 120})
        page = PagePolls(url, client.session_hash)
        server_idle_mb = _status_kb(server.pid, "VmRSS") / 1024
        clicked = time.perf_counter()
        client.predict(epochs=epochs, **APP_SETTINGS, api_name="/start_run")
        while "step 0 of" in (status := page.poll()) or "Training" not in status:
            time.sleep(0.02)
        first_loss_s = time.perf_counter() - clicked
        trained_from, cpu_from = time.perf_counter(), process_cpu_s(server.pid)
        poll_ms, server_mb, child_mb = [], [], []
        while not status.startswith("**Finished**"):
            time.sleep(1.0)  # an open page polls once a second: the status, curves and picture (and the spread views)
            status = page.poll()
            poll_ms.append(page.poll_ms)
            server_mb.append(_status_kb(server.pid, "VmRSS") / 1024)
            for child in _children(server.pid):
                with contextlib.suppress(OSError, RuntimeError):  # gone, or a zombie without memory, meanwhile
                    child_mb.append(_status_kb(child, "VmRSS") / 1024)
        wall_s = time.perf_counter() - trained_from
        server_cpu_share = (process_cpu_s(server.pid) - cpu_from) / wall_s
        time.sleep(2)  # the run's process has ended; what the server keeps of the run stays
        server_after_mb = _status_kb(server.pid, "VmRSS") / 1024
    finally:
        server.terminate()
        server.wait(30)
    run_dir = next((data_dir / "runs").iterdir())
    return {"page_s": page_s, "first_loss_s": first_loss_s, "app_images_per_s": median_images_per_s(run_dir),
            "app_wall_s": wall_s, "run_dir": run_dir, "poll_ms": poll_ms, "server_idle_mb": server_idle_mb,
            "server_training_mb": max(server_mb), "server_after_mb": server_after_mb,
            "child_mb": max(child_mb, default=float("nan")), "server_cpu_share": server_cpu_share,
            "views_polls": page.views_polls}


def _cli_command(out: Path, epochs: int) -> list[str]:
    return [PYTHON, "-m", "memvir", "train", *CLI_FLAGS, "--epochs", str(epochs), "--out", str(out)]


def cli_train(out: Path, epochs: int) -> dict:
    started = time.perf_counter()
    subprocess.run(_cli_command(out, epochs), cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return {"cli_images_per_s": median_images_per_s(out), "cli_process_s": time.perf_counter() - started}


def training_speed(tmp: Path, epochs: int, rounds: int, server_priority: str) -> dict:
    """App and CLI runs of the same settings, alternating (app first in odd rounds, the CLI in even ones)."""
    apps, clis = [], []
    for number in range(rounds):
        app_first = number % 2 == 0
        for which in (("app", "cli") if app_first else ("cli", "app")):
            if which == "app":
                apps.append(app_round(tmp / f"app-{number}", epochs, server_priority))
            else:
                clis.append(cli_train(tmp / f"cli-{number}", epochs))
    ratios = [app["app_images_per_s"] / cli["cli_images_per_s"] for app, cli in zip(apps, clis, strict=True)]
    return {"apps": apps, "clis": clis, "ratios": ratios}


def noise_floor(tmp: Path, epochs: int, rounds: int) -> list[tuple[str, str, str]]:
    """The same measure with the CLI in both arms: how far two identical runs, one after the other, differ on this
    machine, so that a round's app / CLI ratio can be read against it."""
    ratios, speeds = [], []
    for number in range(rounds):
        first, second = (cli_train(tmp / f"cli-{number}-{arm}", epochs)["cli_images_per_s"] for arm in "ab")
        ratios.append(second / first)
        speeds += [first, second]
    return [(f"training images/s, a CLI run / the CLI run before it ({epochs} epochs of glyphs), {rounds} rounds",
             f"median {statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})", ""),
            ("CLI images/s, in order", ", ".join(f"{v:,.0f}" for v in speeds), "")]


class _CliArm:
    """A long CLI run, held with SIGSTOP between its turns."""

    def __init__(self, out: Path):
        self.run_dir = out
        self.process = subprocess.Popen(_cli_command(out, 100), cwd=REPO, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)

    def steps(self) -> list[dict]:
        return _step_records(self.run_dir)

    def hold(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def take_turn(self, seconds: float) -> None:
        os.kill(self.process.pid, signal.SIGCONT)
        time.sleep(seconds)
        self.hold()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGCONT)
        self.process.terminate()
        self.process.wait(60)


class _AppArm:
    """A long app run, watched by a page that polls once a second during its turns and paused (its Pause) between
    them. UMAP is off (MEMVIR_UMAP=0): at each pause the app would lay out the latest snapshot, on the cores the other
    arm is timed on."""

    def __init__(self, tmp: Path, server_priority: str):
        from gradio_client import Client

        self.server, url, _, _ = start_app(tmp, MEMVIR_SERVER_PRIORITY=server_priority, MEMVIR_UMAP="0")
        time.sleep(3)
        self.client = Client(url, verbose=False, httpx_kwargs={"timeout": 120})
        self.page = PagePolls(url, self.client.session_hash)
        self.client.predict(epochs=100, **APP_SETTINGS, api_name="/start_run")
        self.run_dir = next((tmp / "runs").iterdir())

    def steps(self) -> list[dict]:
        self.page.poll()
        return _step_records(self.run_dir)

    def hold(self) -> None:
        self.client.predict(api_name="/pause_run")
        while "Paused" not in self.page.poll():
            time.sleep(0.2)

    def take_turn(self, seconds: float) -> None:
        self.client.predict(api_name="/resume_run")
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            time.sleep(1.0)
            self.page.poll()
        self.hold()

    def close(self) -> None:
        runs = _children(self.server.pid)
        self.server.terminate()
        self.server.wait(30)
        deadline = time.monotonic() + 60  # the run's process saves a checkpoint into the folder as the server goes
        while any(Path(f"/proc/{pid}").exists() for pid in runs) and time.monotonic() < deadline:
            time.sleep(0.2)


def _past_start(arm, past_step: int = 80) -> None:
    """Wait for the arm's run to pass its start (evaluation, the memory filling)."""
    while not (steps := arm.steps()) or steps[-1]["step"] < past_step:
        time.sleep(1.0)


def _full_memory(arm) -> None:
    """Wait for the arm's run to pass its start, then hold it."""
    _past_start(arm)
    arm.hold()


def interleaved(tmp: Path, blocks: int, block_s: float, server_priority: str,
                noise_floor: bool = False) -> list[tuple[str, str, str]]:
    """One long app run and one long CLI run of the same settings taking turns of `block_s` seconds, the one waiting
    held meanwhile (the app's by its Pause, the CLI's by SIGSTOP), the order swapped every block (app-CLI, CLI-app):
    both timed over the same minutes, in the steady state, with neither paying a start. A turn's images/s is the
    median of its logged steps, its first SETTLE_STEPS left out. With `noise_floor`, a second CLI run takes the app's
    place: the measure's own spread."""
    first = _CliArm(tmp / "cli-a") if noise_floor else _AppArm(tmp / "app", server_priority)
    arms = [first]
    try:
        _full_memory(first)
        arms.append(_CliArm(tmp / "cli"))
        _full_memory(arms[1])
        pairs = []
        for block in range(blocks):
            speeds = [0.0, 0.0]
            for which in ((0, 1) if block % 2 == 0 else (1, 0)):
                start = arms[which].steps()[-1]["step"]
                arms[which].take_turn(block_s)
                speeds[which] = statistics.median(record["images_per_s"] for record in arms[which].steps()
                                                  if record["step"] > start + SETTLE_STEPS)
            pairs.append((speeds[0], speeds[1]))
            print(f"block {block}: {pairs[-1][0]:.0f} vs CLI {pairs[-1][1]:.0f} images/s", file=sys.stderr, flush=True)
    finally:
        for arm in arms:
            arm.close()
    each = [a / b for a, b in pairs]
    name = "a CLI run / another" if noise_floor else "app / CLI"
    return [(f"training images/s, {name} in {blocks} turns of {block_s:.0f} s each, one run of each held while the "
             "other trains" + ("" if noise_floor else " (the app polled 1/s)"),
             f"median {statistics.median(each):.2f} ({', '.join(f'{r:.2f}' for r in each)})",
             "" if noise_floor else ">= 0.95"),
            ("images/s per turn, first; CLI", ", ".join(f"{a:,.0f}" for a, _ in pairs) + "; "
             + ", ".join(f"{c:,.0f}" for _, c in pairs), "")]


def page_cost(tmp: Path, windows: int, window_s: float, server_priority: str) -> list[tuple[str, str, str]]:
    """What a page watching a run costs it: one long app run, in alternating windows of `window_s` seconds with a page
    polling once a second and with none (`windows` of each), each window's CPU of the server, of the run's process
    and of this polling process, and the run's images/s (the median of the window's logged steps, its first
    SETTLE_STEPS left out)."""
    arm = _AppArm(tmp / "app", server_priority)
    windows_seen = {True: [], False: []}
    try:
        _past_start(arm)
        run_process = [pid for pid in _children(arm.server.pid) if process_cpu_s(pid) > 1.0]
        for window in range(2 * windows):
            polling = window % 2 == 0
            start = arm.steps()[-1]["step"]
            server_from, run_from = process_cpu_s(arm.server.pid), sum(process_cpu_s(pid) for pid in run_process)
            own_from, began = time.process_time(), time.perf_counter()
            while time.perf_counter() - began < window_s:
                time.sleep(1.0)
                if polling:
                    arm.page.poll()
            wall = time.perf_counter() - began
            speed = statistics.median(record["images_per_s"] for record in _step_records(arm.run_dir)
                                      if record["step"] > start + SETTLE_STEPS)
            windows_seen[polling].append((
                (process_cpu_s(arm.server.pid) - server_from) / wall,
                (sum(process_cpu_s(pid) for pid in run_process) - run_from) / wall,
                (time.process_time() - own_from) / wall, speed))
            print(f"window {window} ({'polled' if polling else 'no page'}): {speed:.0f} images/s", file=sys.stderr,
                  flush=True)
    finally:
        arm.close()

    def column(polling: bool, index: int, form: str) -> str:
        return ", ".join(form.format(values[index]) for values in windows_seen[polling])

    speeds = {polling: [values[3] for values in seen] for polling, seen in windows_seen.items()}
    return [(f"one app run, {windows} windows of {window_s:.0f} s with a page polling 1/s and {windows} with none: "
             "images/s, mean (each window)",
             f"{statistics.mean(speeds[True]):.0f} ({column(True, 3, '{:.0f}')}) with; "
             f"{statistics.mean(speeds[False]):.0f} ({column(False, 3, '{:.0f}')}) without", ""),
            ("server CPU (share of one core), each window, with; without",
             f"{column(True, 0, '{:.1%}')}; {column(False, 0, '{:.1%}')}", ""),
            ("the run's process CPU (share of one core), each window, with; without",
             f"{column(True, 1, '{:.0%}')}; {column(False, 1, '{:.0%}')}", ""),
            ("the polling page (this process: HTTP and JSON), each window with polls",
             column(True, 2, "{:.1%}"), "")]


def poll_handler_while_training(data_dir: Path) -> dict:
    """The poll handler called in-process, as pages call it, while a run trains in its own process: milliseconds per
    call, of the wall clock and of the calling thread's own CPU time (their gap is time spent waiting for a core or
    for the interpreter lock). This process keeps torch and faiss to one thread, as the server does."""
    from demo.common.cores import limit_server_threads
    from demo.common.settings import AppSettings
    from demo.page import build_app
    from demo.train.poll import PollState

    limit_server_threads()
    app = build_app(AppSettings(data_dir=data_dir, checkpoints_dir=data_dir / "none", umap=False))
    try:
        start, poll = handler(app.blocks, "start"), handler(app.blocks, "poll")
        start("glyphs", "convnet", "norm-softmax", 128, 50, 1e-3, 0, 5, 10, 0.0, 25, 1, visitor="bench")
        while "Training" not in (out := poll(PollState(), "age", True, visitor="bench"))[1]:
            time.sleep(0.05)
        wall_ms, cpu_ms, state = [], [], out[0]
        for count in range(600):  # as many open pages, each with its own view state, polling while it trains
            fresh = PollState() if count % 10 == 0 else state
            began, began_cpu = time.perf_counter(), time.thread_time()
            state = poll(fresh, "age", True, visitor="bench")[0]
            wall_ms.append(1000 * (time.perf_counter() - began))
            cpu_ms.append(1000 * (time.thread_time() - began_cpu))
            time.sleep(0.05)
    finally:
        app.close()
    return {"wall_ms": wall_ms, "cpu_ms": cpu_ms}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def speed_rows(speed: dict, polls: dict, epochs: int) -> list[tuple[str, str, str]]:
    """The table's rows for the training speed, the polls and the server's memory."""
    apps, clis, ratios = speed["apps"], speed["clis"], speed["ratios"]
    http_ms = [ms for app in apps for ms in app["poll_ms"]]

    def spread(values, form):
        return ", ".join(form.format(value) for value in values)

    return [
        (f"training images/s, app polled 1/s / CLI ({epochs} epochs of glyphs), median of {len(ratios)} rounds "
         "(each round's ratio)", f"{statistics.median(ratios):.2f} ({spread(ratios, '{:.2f}')})", ">= 0.95 each"),
        ("app images/s per round; CLI images/s per round",
         f"{spread([a['app_images_per_s'] for a in apps], '{:,.0f}')}; "
         f"{spread([c['cli_images_per_s'] for c in clis], '{:,.0f}')}", ""),
        ("training wall time: app loop vs CLI process, per round",
         ", ".join(f"{a['app_wall_s']:.0f} vs {c['cli_process_s']:.0f} s" for a, c in zip(apps, clis, strict=True)),
         ""),
        (f"poll handler in the server process while training ({len(polls['wall_ms'])} calls), median / p99 "
         "(its own CPU time, median / p99)",
         f"{statistics.median(polls['wall_ms']):.1f} / {percentile(polls['wall_ms'], 0.99):.1f} ms "
         f"({statistics.median(polls['cpu_ms']):.1f} / {percentile(polls['cpu_ms'], 0.99):.1f} ms)",
         "p99 < 50 ms"),
        (f"a page's poll over HTTP (POST /gradio_api/run/poll) while training ({len(http_ms)} polls), median / p99",
         f"{statistics.median(http_ms):.0f} / {percentile(http_ms, 0.99):.0f} ms", ""),
        ("second polls (POST /gradio_api/run/poll_views, sent when the poll's views key changed) per poll, per round",
         spread([a["views_polls"] / max(1, len(a["poll_ms"])) for a in apps], "{:.2f}"), ""),
        ("server CPU while training (share of one core), per round",
         spread([a["server_cpu_share"] for a in apps], "{:.0%}"), ""),
        ("server memory (RSS): before Start / training (max) / after the run, median of rounds",
         " / ".join(f"{statistics.median(a[key] for a in apps):,.0f} MB"
                    for key in ("server_idle_mb", "server_training_mb", "server_after_mb")), ""),
        ("the run's training process (RSS, max), median of rounds",
         f"{statistics.median(a['child_mb'] for a in apps):,.0f} MB", ""),
    ]


def handler(app, api_name: str):
    return next(block_fn.fn for block_fn in app.fns.values() if block_fn.api_name == api_name)


def in_process(data_dir: Path, checkpoint: Path) -> dict:
    """A query on the glyphs test split (12,252 images)."""
    from demo.common.settings import AppSettings
    from demo.page import build_app

    settings = AppSettings(data_dir=data_dir, checkpoints_dir=checkpoint.parent, umap=False)
    data_dir.mkdir(parents=True, exist_ok=True)
    app = build_app(settings)
    try:
        search = handler(app.blocks, "search_upload")
        query = data_dir / "query.png"
        from memvir.data import load_dataset

        load_dataset("glyphs").test.image(1234).save(query)
        began = time.perf_counter()
        search(str(checkpoint), "test split", 8, "", str(query))  # builds and caches the index
        index_s = time.perf_counter() - began
        query_ms = []
        for _ in range(30):
            began = time.perf_counter()
            about, tiles, _ = search(str(checkpoint), "test split", 8, "", str(query))
            query_ms.append(1000 * (time.perf_counter() - began))
        assert tiles.count("<figure class=\"result-tile") == 8, about
        gallery = app.retrieval_service.test_split_gallery(app.retrieval_service.load_checkpoint(str(checkpoint)))
    finally:
        app.close()
    return {"index_s": index_s, "query_median_ms": statistics.median(query_ms), "gallery_size": gallery.size}


def first_search_rows(searches: dict) -> list[tuple[str, str, str]]:
    def figures(starts, which):
        seconds = [start[which] for start in starts]
        return f"median {statistics.median(seconds):.2f} s ({', '.join(f'{s:.2f}' for s in seconds)})"

    return [
        (f"page served after `python app.py` ({len(searches['warm'])} starts)", figures(searches["warm"], 0),
         "a few seconds"),
        ("first search after a fresh start, page served -> answer", figures(searches["warm"], 1), "< 2 s"),
        ("the same on a new machine (empty glyph cache: the glyphs are rendered first)",
         figures(searches["cold"], 1), "< 2 s"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2, help="epochs of glyphs for the training comparison")
    parser.add_argument("--rounds", type=int, default=3, help="app runs and CLI runs compared, alternating")
    parser.add_argument("--starts", type=int, default=3, help="fresh starts timed for the first search")
    parser.add_argument("--first-query-only", action="store_true", help="time only the first search")
    parser.add_argument("--server-priority", choices=SERVER_PRIORITIES, default="low",
                        help="the app's MEMVIR_SERVER_PRIORITY in the training comparison")
    parser.add_argument("--noise-floor", action="store_true",
                        help="only the training comparison, with a CLI run in place of the app: the measure's noise")
    parser.add_argument("--interleaved", type=int, metavar="BLOCKS",
                        help="only the training comparison: a long app run and a long CLI run taking turns, "
                             "BLOCKS times each (with --noise-floor: two CLI runs)")
    parser.add_argument("--turn-s", type=float, default=30.0,
                        help="seconds of one turn in --interleaved, of one window in --page-cost")
    parser.add_argument("--page-cost", type=int, metavar="WINDOWS",
                        help="only what a page polling costs a run: one app run, WINDOWS windows with a page "
                             "polling and as many without, alternating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-app-") as tmp:
        tmp = Path(tmp)
        if args.page_cost:
            rows = page_cost(tmp, args.page_cost, args.turn_s, args.server_priority)
            flags = f"--page-cost {args.page_cost} --turn-s {args.turn_s:g} --server-priority {args.server_priority}"
        elif args.interleaved:
            rows = interleaved(tmp, args.interleaved, args.turn_s, args.server_priority, args.noise_floor)
            flags = (f"--interleaved {args.interleaved} --turn-s {args.turn_s:g}"
                     + (" --noise-floor" if args.noise_floor else f" --server-priority {args.server_priority}"))
        elif args.noise_floor:
            rows = noise_floor(tmp, args.epochs, args.rounds)
            flags = f"--noise-floor --epochs {args.epochs} --rounds {args.rounds}"
        else:
            rows = first_search_rows(first_searches(tmp / "first", args.starts))
            flags = ("--first-query-only" if args.first_query_only else
                     f"--epochs {args.epochs} --rounds {args.rounds} --server-priority {args.server_priority}")
            flags += f" --starts {args.starts}"
            if not args.first_query_only:
                speed = training_speed(tmp, args.epochs, args.rounds, args.server_priority)
                app = speed["apps"][0]
                inner = in_process(tmp / "inner", app["run_dir"])
                polls = poll_handler_while_training(tmp / "poll")  # last: it keeps this process to one thread
                rows += [
                    ("first loss point after Start (glyphs, batch 128)", f"{app['first_loss_s']:.1f} s", "< 5 s"),
                    *speed_rows(speed, polls, args.epochs),
                    (f"gallery index build ({inner['gallery_size']:,} images, once)", f"{inner['index_s']:.1f} s",
                     ""),
                    (f"query on the {inner['gallery_size']:,}-image gallery, index built, median",
                     f"{inner['query_median_ms']:.0f} ms", "< 150 ms"),
                ]
    print(f"Command: `{Path(PYTHON).name} bench/bench_app.py {flags}` on {os.cpu_count()} CPU cores "
          f"(load average {os.getloadavg()[0]:.1f} at the end)\n")
    print("| measure | result | target |\n|---|---|---|")
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")


if __name__ == "__main__":
    main()
