"""Benchmark: GalleryIndex's approximate kinds (IVF-Flat, HNSW) against its exact search on a large clustered gallery.

The gallery is synthetic but shaped like the embeddings of many images: unit vectors in groups (like a shop's
product categories), classes within each group, images around their class. The queries are other images of the
same classes, not in the gallery. Recall@10 is the fraction of the exact top 10 that the approximate search
returns, averaged over the queries; class Recall@1 shows what a miss costs a user (the nearest image found is of
the query's class). Build times are one build each; search times, for a batch of queries and for one query at a
time (as the app asks), are medians of interleaved repeats over all the indexes, in this one process.

Run: .venv/bin/python bench/bench_index.py [--n 1000000] [--kinds ivf hnsw] [--nprobe 32 64] [--ef-search 16 32]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install

from memvir.retrieval.index import GalleryIndex  # noqa: E402
from memvir.retrieval.knn import search_backend  # noqa: E402

K = 10


def clustered_gallery(args):
    """(gallery [n, dim], queries [queries, dim], their classes): groups -> classes -> items, each a Gaussian step.

    The steps are taken in a space of ``latent`` dimensions, mapped into ``dim`` by a fixed random linear map, with
    a little isotropic noise added: a trained model's embeddings vary along few directions, which is what makes
    approximate search work on them (isotropic noise in all 128 dimensions leaves every point about equally far
    from every other, and no index can do better than a full scan there). Steps are scaled so that a spread of 1
    moves a point about as far as group centres lie apart.
    """
    generator = torch.Generator().manual_seed(args.seed)
    scale = args.latent**-0.5
    num_classes = args.n // args.per_class
    groups = torch.randn(args.groups, args.latent, generator=generator) * scale
    class_group = torch.randint(args.groups, (num_classes,), generator=generator)
    steps = torch.randn(num_classes, args.latent, generator=generator)
    classes = groups[class_group] + args.class_spread * scale * steps
    mapping = torch.randn(args.latent, args.dim, generator=generator) * scale
    item_class = torch.cat(
        [torch.arange(args.n) % num_classes, torch.randint(num_classes, (args.queries,), generator=generator)]
    )
    items = torch.empty(len(item_class), args.dim)
    for start in range(0, len(items), 100_000):  # in blocks: the noise of a million rows at once doubles the peak
        block = item_class[start : start + 100_000]
        latent = classes[block] + args.item_spread * scale * torch.randn(len(block), args.latent, generator=generator)
        noise = torch.randn(len(block), args.dim, generator=generator) * args.dim**-0.5
        items[start : start + len(block)] = latent @ mapping + args.noise * noise
    return items[: args.n].numpy(), items[args.n :].numpy(), item_class[: args.n].numpy(), item_class[args.n :].numpy()


def recall_at_k(found, exact):
    return float(np.mean([len(set(row) & set(truth)) / K for row, truth in zip(found, exact, strict=True)]))


def timed(function):
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="gallery size (default 1000000)")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension (default 128, the models' own)")
    parser.add_argument("--per-class", type=int, default=10, help="gallery images per class (default 10)")
    parser.add_argument("--groups", type=int, default=1000, help="groups of classes (default 1000)")
    parser.add_argument("--latent", type=int, default=16, help="directions the embeddings vary along (default 16)")
    parser.add_argument("--class-spread", type=float, default=1.0, help="classes around their group (default 1)")
    parser.add_argument("--item-spread", type=float, default=0.6, help="images around their class (default 0.6)")
    parser.add_argument("--noise", type=float, default=0.1, help="isotropic noise in all dimensions (default 0.1)")
    parser.add_argument("--queries", type=int, default=1000, help="held-out query images (default 1000)")
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["ivf"],
        choices=["ivf", "hnsw"],
        help="approximate kinds to build (default ivf: HNSW on a million images takes ten minutes or more on 2 cores)",
    )
    parser.add_argument("--nprobe", type=int, nargs="*", default=[], help="more IVF nprobe values to measure")
    parser.add_argument("--ef-search", type=int, nargs="*", default=[], help="more HNSW ef_search values to measure")
    parser.add_argument("--single-queries", type=int, default=20, help="queries also timed one at a time (20)")
    parser.add_argument("--repeats", type=int, default=3, help="timed searches per index; the median counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("faiss").setLevel(logging.WARNING)
    executable = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else sys.executable
    print("command:", shlex.join([executable, *sys.argv]))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )

    seconds, (gallery, queries, gallery_classes, query_classes) = timed(lambda: clustered_gallery(args))
    print(
        f"data: {args.n:,} x {args.dim} gallery, {args.n // args.per_class:,} classes in {args.groups} groups, "
        f"{args.queries} queries ({seconds:.1f} s)"
    )

    # (name, options, build seconds, index, search options to try)
    built = []
    defaults = {}  # each approximate kind's search option as built
    seconds, exact = timed(lambda: GalleryIndex.build(gallery))
    built.append(("exact", f"backend={search_backend('auto')}", seconds, exact, [{}]))
    for kind in args.kinds:
        seconds, index = timed(lambda kind=kind: GalleryIndex.build(gallery, kind=kind))
        name = "nprobe" if kind == "ivf" else "ef_search"
        extra = args.nprobe if kind == "ivf" else args.ef_search
        default = index.options[name]
        sweep = [{name: value} for value in sorted({default, *extra})]
        options = ", ".join(f"{key}={value}" for key, value in index.options.items() if key != name)
        built.append((kind, options, seconds, index, sweep))
        defaults[kind] = {name: default}
        print(f"built {kind} ({options}) in {seconds:.1f} s", flush=True)

    configurations = [(entry, search) for entry in built for search in entry[4]]
    batch_times = {position: [] for position in range(len(configurations))}
    single_times = {position: [] for position in range(len(configurations))}
    results = {}
    for _ in range(args.repeats):
        for position, ((_, _, _, index, _), search) in enumerate(configurations):
            index.set_search_options(**search)
            seconds, (_, found) = timed(lambda index=index: index.search_arrays(queries, K))
            batch_times[position].append(seconds / len(queries))
            results[position] = found
            for query in queries[: args.single_queries]:  # one query at a time, as the app asks
                seconds, _ = timed(lambda index=index, query=query: index.search_arrays(query, K))
                single_times[position].append(seconds)
    exact_single = float(np.median(single_times[0]))

    def class_recall_at_1(found):  # how often the nearest image found is of the query's class
        return float(np.mean(gallery_classes[found[:, 0]] == query_classes))

    print(f"\nload average {os.getloadavg()[0]:.1f} at the end\n")
    print(
        f"| index | options | build (s) | batch of {len(queries)}: ms/query | one query: ms | one query: speed-up | "
        f"recall@{K} of exact | class Recall@1 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for position, ((kind, options, build_seconds, _, _), search) in enumerate(configurations):
        single = float(np.median(single_times[position]))
        default = " (default)" if search and kind != "exact" and search == defaults[kind] else ""
        shown = ", ".join([options, *(f"{key}={value}" for key, value in search.items())]) + default
        print(
            f"| {kind} | {shown} | {build_seconds:.1f} | {1000 * np.median(batch_times[position]):.2f} | "
            f"{1000 * single:.2f} | {exact_single / single:.1f}x | "
            f"{recall_at_k(results[position], results[0]):.3f} | {class_recall_at_1(results[position]):.3f} |"
        )


if __name__ == "__main__":
    main()
