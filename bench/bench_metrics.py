"""Benchmark: ``retrieval_metrics`` against a bare torch ``normalize -> matmul -> topk`` of the same search.

Embeddings are random but clustered (class centres plus noise) so the metrics land mid-range, as on CARS196.
The baseline builds the full N x N similarity matrix, which ``retrieval_metrics`` never does; it only searches (no
metrics), so the ratio shows what the chunked search and the metric arithmetic cost over the bare search.
Everything runs in this one process on the same data, the methods interleaved in each repeat; the table shows
medians, and the ratios are what to compare (a shared machine moves the absolute times).

Also measured: each exact search backend alone (what "auto" chooses between, and the choice it made from its own
small timed search); the torch search on one thread and with other chunk sizes; the two backends on searches of
other shapes (square, a batch of queries against a large gallery, one query), the gallery prepared once as
GalleryIndex keeps it; and the k-means behind NMI, scikit-learn's (what ``retrieval_metrics`` uses) against
faiss's, in NMI and time over a few seeds.

Run: .venv/bin/python bench/bench_metrics.py [--n 10000] [--repeats 5]
"""

import argparse
import logging
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install

from memvir.retrieval.knn import (  # noqa: E402
    _PROBE_DIM,
    _PROBE_GALLERY,
    _PROBE_K,
    _PROBE_QUERIES,
    flat_inner_product_index,
    knn_search,
    l2_normalized,
    search_backend,
    search_unit_gallery,
)
from memvir.retrieval.metrics import _kmeans, normalized_mutual_info, retrieval_metrics  # noqa: E402

KS = (1, 2, 4, 8)
BASELINE = "bare torch: normalize -> N x N matmul -> topk (search only)"
AUTO = "retrieval_metrics, backend=auto"
FAISS_SEARCH = "search only, faiss"
TORCH_SEARCH = "search only, torch (64 MiB chunks, the default)"
BACKENDS = ("faiss", "torch")


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


def on_one_thread(function):
    def run():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return function()
        finally:
            torch.set_num_threads(threads)

    return run


def interleaved_medians(methods, repeats):
    """{name: median seconds} of ``repeats`` timed runs of each method, the methods alternating in every repeat."""
    times = {name: [] for name in methods}
    for _ in range(repeats):
        for name, method in methods.items():
            start = time.perf_counter()
            method()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in times.items()}


def searches_of(queries, gallery, k):
    """The two backends' searches of ``gallery`` kept as GalleryIndex keeps it (normalised, or in a faiss index)."""
    unit_gallery = l2_normalized(gallery)
    prepared = {"faiss": flat_inner_product_index(unit_gallery), "torch": unit_gallery}
    return {
        backend: lambda backend=backend: search_unit_gallery(queries, prepared[backend], k, backend=backend)
        for backend in BACKENDS
    }


def compare_shapes(repeats):
    """The two exact backends on searches of several shapes (random vectors), one table row per shape."""
    shapes = [  # (queries, gallery, dim, k, what it stands for)
        (10_000, 10_000, 512, 50, "retrieval_metrics, 10k x 512"),
        (10_000, 10_000, 128, 50, "retrieval_metrics, 10k x 128"),
        (500, 100_000, 128, 10, "a batch of queries, 100k gallery"),
        (1, 100_000, 128, 10, "one query, 100k gallery"),
        (_PROBE_QUERIES, _PROBE_GALLERY, _PROBE_DIM, _PROBE_K, "the probe auto times"),
    ]
    print()
    print("| search (faiss vs torch, exact) | queries x gallery x dim, k | faiss (ms) | torch (ms) | faiss / torch |")
    print("|---|---|---:|---:|---:|")
    for num_queries, gallery_size, dim, k, what in shapes:
        generator = torch.Generator().manual_seed(1)
        gallery = torch.randn(gallery_size, dim, generator=generator)
        queries = torch.randn(num_queries, dim, generator=generator)
        methods = searches_of(queries, gallery, k)
        for method in methods.values():
            method()
        median = interleaved_medians(methods, repeats)
        print(
            f"| {what} | {num_queries} x {gallery_size} x {dim}, {k} | {1000 * median['faiss']:.1f} | "
            f"{1000 * median['torch']:.1f} | {median['faiss'] / median['torch']:.2f} |"
        )


def compare_kmeans(embeddings, labels, seeds):
    """NMI and time of scikit-learn's k-means (as retrieval_metrics runs it, and without its BLAS limit) and of
    faiss's on the same points."""
    import faiss
    from sklearn.cluster import KMeans

    points = l2_normalized(embeddings).numpy()
    num_classes = int(labels.max()) + 1

    def sklearn_kmeans(seed):  # as retrieval_metrics runs it
        return _kmeans(torch.from_numpy(points), num_classes, seed)

    def sklearn_kmeans_blas_threads(seed):  # the same without limiting BLAS to one thread
        return KMeans(n_clusters=num_classes, init="k-means++", n_init=1, random_state=seed).fit_predict(points)

    def faiss_kmeans(seed):  # 20 iterations from a k-means++ start: faiss's Kmeans as this library ran it before
        kmeans = faiss.Kmeans(
            points.shape[1],
            num_classes,
            niter=20,
            seed=seed,
            init_method=faiss.ClusteringInitMethod_KMEANS_PLUS_PLUS,
            min_points_per_centroid=1,
            verbose=False,
        )
        kmeans.train(points)
        return kmeans.index.search(points, 1)[1][:, 0]

    implementations = {
        "scikit-learn KMeans, BLAS on 1 thread (used)": sklearn_kmeans,
        "scikit-learn KMeans, BLAS on all threads": sklearn_kmeans_blas_threads,
        "faiss Kmeans, 20 iterations (used before)": faiss_kmeans,
    }
    scores = {name: [] for name in implementations}
    times = {name: [] for name in implementations}
    for seed in seeds:  # the implementations alternate, as the searches do
        for name, cluster in implementations.items():
            start = time.perf_counter()
            clusters = cluster(seed)
            times[name].append(time.perf_counter() - start)
            scores[name].append(normalized_mutual_info(labels.numpy(), clusters))
    print()
    print(f"| k-means for NMI ({num_classes} clusters, {len(seeds)} seeds) | NMI mean | NMI range | time, median (s) |")
    print("|---|---:|---:|---:|")
    for name in implementations:
        low, high = min(scores[name]), max(scores[name])
        print(f"| {name} | {np.mean(scores[name]):.4f} | {low:.4f} - {high:.4f} | {np.median(times[name]):.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="number of embeddings (default 10000)")
    parser.add_argument("--dim", type=int, default=512, help="embedding dimension (default 512)")
    parser.add_argument("--per-class", type=int, default=50, help="items per class (default 50)")
    parser.add_argument("--noise", type=float, default=3.0, help="noise scale around the class centres (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per method, interleaved; the median counts")
    parser.add_argument("--shape-repeats", type=int, default=3, help="timed runs per backend and search shape")
    parser.add_argument("--kmeans-seeds", type=int, default=3, help="k-means runs per implementation (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("faiss").setLevel(logging.WARNING)
    executable = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else sys.executable
    print("command:", shlex.join([executable, *sys.argv]))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    chosen = search_backend("auto")  # the probe runs here, once, and logs its timings

    embeddings, labels = clustered_embeddings(args.n, args.dim, args.per_class, args.noise, args.seed)
    k = neighbours_fetched(labels)
    search = lambda backend, **options: knn_search(embeddings, embeddings, k, True, backend, **options)  # noqa: E731
    gallery_rows = embeddings.shape[0]
    methods = {
        BASELINE: lambda: torch_baseline(embeddings, k),
        AUTO: lambda: retrieval_metrics(embeddings, labels, KS),
        "retrieval_metrics, backend=torch": lambda: retrieval_metrics(embeddings, labels, KS, backend="torch"),
        "retrieval_metrics, backend=faiss": lambda: retrieval_metrics(embeddings, labels, KS, backend="faiss"),
        FAISS_SEARCH: lambda: search("faiss"),
        TORCH_SEARCH: lambda: search("torch"),
        "search only, torch, 16 MiB chunks": lambda: search("torch", chunk_size=2**22 // gallery_rows),
        "search only, torch, 256 MiB chunks": lambda: search("torch", chunk_size=2**26 // gallery_rows),
        "search only, torch, 1 thread": on_one_thread(lambda: search("torch")),
    }
    results = {name: method() for name, method in methods.items()}  # untimed: imports, thread pools, first touches
    median = interleaved_medians(methods, args.repeats)
    print()
    print(
        f"N={args.n}, D={args.dim}, {int(labels.max()) + 1} classes, k={k} neighbours, median of {args.repeats}, "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    print()
    print("| method | time (s) | vs bare torch |")
    print("|---|---:|---:|")
    for name, seconds in median.items():
        print(f"| {name} | {seconds:.3f} | {seconds / median[BASELINE]:.2f}x |")
    print()
    faster = "faiss" if median[FAISS_SEARCH] < median[TORCH_SEARCH] else "torch"
    print(f"retrieval_metrics (auto) / bare torch: {median[AUTO] / median[BASELINE]:.2f}")
    print(f"faiss search / torch search: {median[FAISS_SEARCH] / median[TORCH_SEARCH]:.2f}")
    print(f"auto chose {chosen}; the faster search on this data: {faster}")
    metrics = [value for name, value in results.items() if name.startswith("retrieval_metrics")]
    same = all(other == metrics[0] for other in metrics[1:])
    values = ", ".join(f"{key} {value:.4f}" for key, value in metrics[0].items())
    print(f"metrics identical across backends: {same}: {values}")
    bare_recall = float((labels[results[BASELINE][:, 0]] == labels).float().mean())
    print(f"bare torch recall@1 {bare_recall:.4f}")
    compare_shapes(args.shape_repeats)
    compare_kmeans(embeddings, labels, range(args.kmeans_seeds))


if __name__ == "__main__":
    main()
