"""The app's speed: page served after `python app.py`, the first search after a fresh start, first loss point after
Start, the poll handler, training speed with a page polling vs the CLI on the same configuration, and a query on a
10,000+ image gallery.

Run: .venv/bin/python bench/bench_app.py [--epochs 2] [--first-query-only]. Prints a markdown table (for
docs/benchmarks.md). Training speed is the trainer's own images/s (median of the logged steps) and the wall time of
the training loop; the app is polled once a second over HTTP, as an open page does. The first search is timed from
the moment the page is served by a fresh `python app.py` to the answer of a search through gradio_client (the
client's own connection included), on the bundled MemVir checkpoint's gallery of 12,252 glyphs.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def median_images_per_s(run_dir: Path) -> float:
    """Median logged images/s over the second half of the run: with no warm-up and N(M+1) = 55 steps, the memory is
    full and the step's cost steady there, so a shift between two runs' phases cannot move the median."""
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["type"] == "step"]
    last = steps[-1]["step"]
    return statistics.median(r["images_per_s"] for r in steps if r["step"] > last / 2)


def start_app(data_dir: Path, **env_extra) -> tuple[subprocess.Popen, str, float]:
    """`python app.py` in a subprocess; (process, url, seconds until the page is served)."""
    port = free_port()
    env = {**os.environ, "MEMVIR_APP_DATA": str(data_dir), "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", **env_extra}
    started = time.perf_counter()
    server = subprocess.Popen([PYTHON, "app.py"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return server, url, time.perf_counter() - started
        except OSError:
            time.sleep(0.05)
        if time.perf_counter() - started > 120:
            server.terminate()
            raise RuntimeError("the page was not served within 120 s")


def first_search(data_dir: Path, query: Path, **env_extra) -> tuple[float, float]:
    """(seconds until a fresh `python app.py` serves the page, seconds from then to the answer of its first search:
    the bundled MemVir checkpoint, its test split, an uploaded glyph), as a visitor who searches at once waits."""
    from gradio_client import Client, handle_file

    server, url, page_s = start_app(data_dir, **env_extra)
    try:
        served = time.perf_counter()
        # The answer carries the result tiles' URLs, which a browser then loads in parallel; the client would fetch
        # them one by one, which is not the page's wait.
        client = Client(url, verbose=False, download_files=False)
        about, tiles, _ = client.predict(checkpoint_choice=str(REPO / "checkpoints" / "glyphs-norm-softmax-memvir"),
                                         source="test split", k=8, query_class="", query_file=handle_file(query),
                                         api_name="/search_upload")
        answered = time.perf_counter() - served
    finally:
        server.terminate()
        server.wait(30)
    assert len(tiles) == 8, about
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


def serve_and_train(data_dir: Path, epochs: int) -> dict:
    """`python app.py` in a subprocess; a run driven and watched through gradio_client."""
    from gradio_client import Client

    server, url, _ = start_app(data_dir)
    try:
        time.sleep(3)  # let the background import of the trainer finish, as for a visitor reading the page

        client = Client(url, verbose=False)
        clicked = time.perf_counter()
        client.predict(dataset="glyphs", epochs=epochs, batch_size=128, snapshot_every=25, eval_every=1,
                       memvir_n=5, memvir_m=10, warmup_epochs=0, api_name="/start")  # the CLI run's settings
        while "step 0 of" in (status := client.predict(api_name="/poll")[0]) or "Training" not in status:
            time.sleep(0.02)
        first_loss_s = time.perf_counter() - clicked
        trained_from = time.perf_counter()
        while not status.startswith("**Finished**"):
            time.sleep(1.0)  # an open page polls once a second
            status = client.predict(api_name="/poll")[0]
        wall_s = time.perf_counter() - trained_from
    finally:
        server.terminate()
        server.wait(30)
    run_dir = next((data_dir / "runs").iterdir())
    return {"first_loss_s": first_loss_s, "app_images_per_s": median_images_per_s(run_dir),
            "app_wall_s": wall_s, "run_dir": run_dir}


def cli_train(out: Path, epochs: int) -> dict:
    started = time.perf_counter()
    subprocess.run([PYTHON, "-m", "memvir", "train", "--dataset", "glyphs", "--loss", "norm-softmax",
                    "--memvir-n", "5", "--memvir-m", "10", "--warmup-epochs", "0", "--epochs", str(epochs),
                    "--batch-size", "128", "--seed", "0", "--out", str(out)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"cli_images_per_s": median_images_per_s(out), "cli_process_s": time.perf_counter() - started}


def handler(app, api_name: str):
    return next(block_fn.fn for block_fn in app.fns.values() if block_fn.api_name == api_name)


def in_process(data_dir: Path, checkpoint: Path) -> dict:
    """The poll handler while a run trains, and a query on the glyphs test split (12,252 images)."""
    from demo.settings import AppSettings
    from demo.ui import build_app

    settings = AppSettings(data_dir=data_dir, checkpoints_dir=checkpoint.parent, umap=False)
    app = build_app(settings)
    try:
        start, poll = handler(app, "start"), handler(app, "poll")
        start({}, "glyphs", "convnet", "norm-softmax", 128, 50, 1e-3, 0, 5, 10, 1.0, 25, 1, visitor="bench")
        tab = {"run_id": None, "after": None}
        while "step 0 of" in (out := poll(tab, "age", True, visitor="bench"))[1] or "Training" not in out[1]:
            time.sleep(0.05)
        poll_ms = []
        for _ in range(120):  # as many open pages, each with its own view state, polling while it trains
            fresh = {"run_id": None, "after": None} if len(poll_ms) % 10 == 0 else out[0]
            began = time.perf_counter()
            out = poll(fresh, "age", True, visitor="bench")
            poll_ms.append(1000 * (time.perf_counter() - began))
            time.sleep(0.1)
        app.run_manager.close()

        search = handler(app, "search_upload")
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
        assert len(tiles) == 8, about
        gallery = app.retrieval_service.test_split_gallery(app.retrieval_service.load_checkpoint(str(checkpoint)))
    finally:
        app.figure_builder.close()
        app.run_manager.close()
    return {"poll_median_ms": statistics.median(poll_ms), "poll_p90_ms": sorted(poll_ms)[int(0.9 * len(poll_ms))],
            "index_s": index_s, "query_median_ms": statistics.median(query_ms), "gallery_size": gallery.size}


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
    parser.add_argument("--starts", type=int, default=3, help="fresh starts timed for the first search")
    parser.add_argument("--first-query-only", action="store_true", help="time only the first search")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-app-") as tmp:
        tmp = Path(tmp)
        searches = first_searches(tmp / "first", args.starts)
        if not args.first_query_only:
            app = serve_and_train(tmp / "app", args.epochs)
            cli = cli_train(tmp / "cli", args.epochs)
            inner = in_process(tmp / "inner", app["run_dir"])
    rows = first_search_rows(searches)
    if not args.first_query_only:
        ratio = app["app_images_per_s"] / cli["cli_images_per_s"]
        rows = [
            *rows,
            ("first loss point after Start (glyphs, batch 128)", f"{app['first_loss_s']:.1f} s", "< 5 s"),
            ("poll handler while training, median (p90)",
             f"{inner['poll_median_ms']:.1f} ms ({inner['poll_p90_ms']:.1f} ms)", "well under 50 ms"),
            (f"training images/s, app polled 1/s vs CLI ({args.epochs} epochs of glyphs)",
             f"{app['app_images_per_s']:,.0f} vs {cli['cli_images_per_s']:,.0f} (ratio {ratio:.2f})", ">= 0.9"),
            ("training wall time: app loop vs CLI process",
             f"{app['app_wall_s']:.1f} s vs {cli['cli_process_s']:.1f} s", ""),
            (f"gallery index build ({inner['gallery_size']:,} images, once)", f"{inner['index_s']:.1f} s", ""),
            (f"query on the {inner['gallery_size']:,}-image gallery, index built, median",
             f"{inner['query_median_ms']:.0f} ms", "< 150 ms"),
        ]
    flags = " --first-query-only" if args.first_query_only else f" --epochs {args.epochs}"
    print(f"Command: `{Path(PYTHON).name} bench/bench_app.py{flags} --starts {args.starts}` on {os.cpu_count()} CPU "
          "cores\n")
    print("| measure | result | target |\n|---|---|---|")
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")


if __name__ == "__main__":
    main()
