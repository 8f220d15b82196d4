"""Benchmark: ``retrieval_metrics`` against a plain torch ``normalize -> matmul -> topk`` of the same search.

Embeddings are random but clustered (class centres plus noise) so the metrics land mid-range, as on CARS196.
The baseline builds the full N x N similarity matrix, which ``retrieval_metrics`` avoids; it only searches (no
metrics), so the ratio shows what the chunked search and the metric arithmetic cost over the bare search.
Each method runs in a fresh process, so its peak RSS is its own (the process's maximum resident memory, torch
included; "RSS before" is that process once torch is imported and the data made).

Run: .venv/bin/python bench/bench_metrics.py [--n 10000]
"""

import argparse
import multiprocessing
import os
import resource
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout, no install

from memvir.metrics import retrieval_metrics, search_backend  # noqa: E402

KS = (1, 2, 4, 8)
BASELINE = "torch normalize -> matmul -> topk (search only)"


def class_labels(n, per_class):
    """``per_class`` items per class in order; the last class also takes the remainder."""
    return (torch.arange(n) // per_class).clamp(max=max(1, n // per_class) - 1)


def neighbours_fetched(labels):
    """What retrieval_metrics fetches, max(max(ks), largest R); the baseline fetches as many."""
    return max(max(KS), int(torch.bincount(labels).max()) - 1)


def clustered_embeddings(n, dim, per_class, noise, seed):
    generator = torch.Generator().manual_seed(seed)
    labels = class_labels(n, per_class)
    centres = torch.randn(int(labels.max()) + 1, dim, generator=generator)
    return centres[labels] + noise * torch.randn(n, dim, generator=generator), labels


def torch_baseline(embeddings, k):
    """The plain search: every similarity at once, self masked, top-k."""
    unit = F.normalize(embeddings, dim=1)
    similarities = unit @ unit.T
    similarities.fill_diagonal_(float("-inf"))
    return similarities.topk(k, dim=1).indices


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(method, args):
    """Runs in a fresh process: (fastest of args.repeats runs in s, RSS before, peak RSS, {metric: value})."""
    embeddings, labels = clustered_embeddings(args.n, args.dim, args.per_class, args.noise, args.seed)
    k = neighbours_fetched(labels)
    if method == BASELINE:
        run = lambda data: torch_baseline(data[0], k)  # noqa: E731
    else:
        run = lambda data: retrieval_metrics(*data, KS, backend=method)  # noqa: E731
    run((embeddings[:200], labels[:200]))  # imports faiss and starts the BLAS threads outside the timings
    rss_before = peak_rss_mib()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = run((embeddings, labels))
        times.append(time.perf_counter() - start)
    if method == BASELINE:
        result = {"recall@1": float((labels[result[:, 0]] == labels).float().mean())}
    return min(times), rss_before, peak_rss_mib(), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="number of embeddings (default 10000)")
    parser.add_argument("--dim", type=int, default=512, help="embedding dimension (default 512)")
    parser.add_argument("--per-class", type=int, default=50, help="items per class (default 50)")
    parser.add_argument("--noise", type=float, default=3.0, help="noise scale around the class centres (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method; the fastest counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    executable = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else sys.executable
    print("command:", shlex.join([executable, *sys.argv]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")

    methods = [*dict.fromkeys([search_backend("auto"), "torch"]), BASELINE]
    results = {}
    for method in methods:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results[method] = pool.submit(measure, method, args).result()

    baseline_seconds = results[BASELINE][0]
    labels = class_labels(args.n, args.per_class)
    print()
    print(
        f"N={args.n}, D={args.dim}, {int(labels.max()) + 1} classes, k={neighbours_fetched(labels)} neighbours, "
        f"best of {args.repeats}"
    )
    print()
    print("| method | time (s) | vs baseline | peak RSS (MiB) | RSS before (MiB) |")
    print("|---|---:|---:|---:|---:|")
    for method, (seconds, rss_before, peak_rss, _) in results.items():
        name = method if method == BASELINE else f"retrieval_metrics (backend={method})"
        print(f"| {name} | {seconds:.3f} | {seconds / baseline_seconds:.2f}x | {peak_rss:.0f} | {rss_before:.0f} |")
    print()
    for method, (*_, metrics) in results.items():
        name = "baseline" if method == BASELINE else method
        print(f"{name}: " + ", ".join(f"{key} {value:.4f}" for key, value in metrics.items()))


if __name__ == "__main__":
    main()
