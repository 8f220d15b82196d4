"""The losses' blocked computation (memvir.losses, "Blocks") and its kept pairs ("Cache") against the plain one they
replaced, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_blocked_loss.py [--repeats 9] [--losses norm-softmax,...]
        [--n 45 --m 10] [--peak-classes 11318 --peak-dim 512 --peak-n 5,10,45 --plain-peak-n 5,10]
        [--kept-peak-losses norm-softmax,proxy-anchor]

Speed: each loss's forward+backward at the reference CARS196 geometry (B=128, C=98, D=512, N=45, M=10 with the memory
full: k=45, the loss sees 5,888 rows and 4,508 classes), on consecutive MemVir outputs, one new step per repeat: the
plain computation written here (the whole batch concatenated, the full logit matrix, F.cross_entropy or the
Proxy-Anchor formula, as every loss computed it before), the loss called with a plain ``live=(B, C)`` (blocked: every
stored block at every call) and with MemVir's own ``live`` (blocked and kept: a loss that has seen every step since
the memory filled computes only the pairs of stored steps that are new), interleaved over the repeats (the order
rotating), medians. The last column counts the stored blocks (one set's rows x one set's classes) the kept loss
computed at its last call, of k^2.

Peak memory: Norm-softmax forward+backward at a large geometry (SOP-like: C=11,318 by default), each in a fresh
process: the inputs are built, the process's peak resident set (VmHWM) is reset through /proc/self/clear_refs, the
loss runs once, and the peak's rise over the resident set before the call is the loss's peak. The plain computation
runs only at the N whose logit matrices fit in the machine's memory; the table also counts the largest logit block
each computation holds, analytically, at every N.

Peak memory with the kept pairs (``--kept-peak-losses norm-softmax,proxy-anchor``): each loss at each N in a fresh
process through a real MemVir(N, M) at that geometry, its memory filled without a loss call (the all-at-once schedule
stores N(M+1) steps before its warm-up ends), then M+1 untimed calls of the loss with MemVir's own ``live`` so that
the pairs it keeps are those of a long run, then the measured call: the peak's rise over the resident set before it
(the memory's ring, MemVir's output and the kept pairs already resident), the kept pairs' own size, the call's wall
and CPU seconds and the stored blocks it computed. The plain computation beside it where it fits
(``--plain-peak-n``), its peak fitted as a + b (N+1)^2 where it does not. A size whose ring and output do not fit in
the memory the machine has free is not run (said so).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memvir import LOSSES, MemVir, build_loss  # noqa: E402

ARC_MARGIN = 0.5


def plain_logits(name, embeddings, labels, class_weights, t):
    """[R, K] every row's logits over every class, targets with their margins, at the losses' default settings."""
    if name == "softmax":
        return embeddings @ class_weights.T
    cosines = F.normalize(embeddings, dim=1) @ F.normalize(class_weights, dim=1).T
    if name == "norm-softmax":
        return 23.0 * cosines
    if name == "proxy-nca":
        return -12.0 * (2.0 - 2.0 * cosines).clamp_min(0.0)
    rows = torch.arange(len(labels))
    target = cosines[rows, labels]
    if name == "cosface":
        return 64.0 * cosines.index_put((rows, labels), target - 0.35)
    sines = (1.0 - target * target).clamp_min(0.0).sqrt()
    with_margin = target * torch.cos(torch.tensor(ARC_MARGIN)) - sines * torch.sin(torch.tensor(ARC_MARGIN))
    arc = torch.where(target > -torch.cos(torch.tensor(ARC_MARGIN)), with_margin,
                      target - torch.sin(torch.tensor(torch.pi - ARC_MARGIN)) * ARC_MARGIN)
    if name == "arcface":
        return 64.0 * cosines.index_put((rows, labels), arc)
    hard = cosines > with_margin.detach()[:, None]
    return 64.0 * torch.where(hard, cosines * (t + cosines), cosines).index_put((rows, labels), arc)


def plain_loss(name, embeddings, labels, class_weights, t=0.0):
    """The loss as one matrix over the concatenated inputs (the official reduction)."""
    if name == "proxy-anchor":
        cosines = F.normalize(embeddings, dim=1) @ F.normalize(class_weights, dim=1).T
        positive = F.one_hot(labels, cosines.shape[1]).bool()
        zero_row = cosines.new_zeros(1, cosines.shape[1])
        pull = torch.logsumexp(torch.cat([zero_row, torch.where(positive, -32.0 * (cosines - 0.1), -torch.inf)]), 0)
        push = torch.logsumexp(torch.cat([zero_row, torch.where(positive, -torch.inf, 32.0 * (cosines + 0.1))]), 0)
        return pull.sum() / positive.any(0).sum() + push.sum() / cosines.shape[1]
    return F.cross_entropy(plain_logits(name, embeddings, labels, class_weights, t), labels)


class MemoryFull:
    """MemVir(N, M) on random steps of B rows, C classes, D dimensions, past the N(M+1) steps that fill its memory;
    ``next()`` makes one more step: live leaves (x, W) and MemVir's output (k = N)."""

    def __init__(self, batch, classes, dim, num_steps, margin, seed=0):
        self.generator = torch.Generator().manual_seed(seed)
        self.batch, self.classes, self.dim = batch, classes, dim
        self.mv = MemVir(num_steps, margin, live_pairs=True)
        for _ in range(num_steps * (margin + 1)):
            self.next()
        assert self.mv.num_stored == num_steps * (margin + 1)

    def next(self):
        x = F.normalize(torch.randn(self.batch, self.dim, generator=self.generator), dim=1).requires_grad_()
        w = torch.randn(self.classes, self.dim, generator=self.generator).requires_grad_()
        labels = torch.randint(0, self.classes, (self.batch,), generator=self.generator)
        return x, w, self.mv(x, labels, w)


def run_once(method, name, loss, x, w, out):
    x.grad = w.grad = None
    if method == "plain":
        value = plain_loss(name, *out, t=getattr(loss, "t", torch.zeros(())).item())
    elif method == "blocked":
        value = loss(*out, live=tuple(out.live))  # a plain (B, C): no stored step named, nothing kept
    else:
        value = loss(*out, live=out.live)
    value.backward()
    return value.item()


METHODS = ("plain", "blocked", "kept")


def speed(args):
    print(f"## Speed: loss forward+backward, B={args.batch} C={args.classes} D={args.dim} N={args.n} M={args.m} "
          f"(memory full), {args.repeats} interleaved repeats, one new MemVir step each\n")
    steps = MemoryFull(args.batch, args.classes, args.dim, args.n, args.m)
    _, _, out = steps.next()
    print(f"the loss sees {out[0].shape[0]} rows and {out[2].shape[0]} classes; "
          f"chunks of {build_loss('norm-softmax').chunk_rows} stored rows\n")
    print("| loss | plain (ms) | blocked (ms) | blocked + kept (ms) | plain / blocked | plain / kept "
          "| blocked / kept | CPU ms (plain, blocked, kept) | plain / kept, blocked / kept (CPU) "
          "| loss values (plain, blocked, kept) | stored blocks computed (kept) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|")
    for name in args.losses:
        losses = {method: build_loss(name).eval() for method in METHODS}  # CurricularFace's t fixed in eval mode
        for loss in losses.values():
            if name == "curricularface":
                loss.t.fill_(0.2)
        # the kept loss sees M+1 steps first, so that every step's pairs with the others are kept once
        for _ in range(args.m + 1):
            run_once("kept", name, losses["kept"], *steps.next())
        times = {method: [] for method in METHODS}
        cpu_times = {method: [] for method in METHODS}
        values = {}
        for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
            x, w, out = steps.next()
            order = METHODS[repeat % 3:] + METHODS[: repeat % 3]
            for method in order:
                started, cpu_started = time.perf_counter(), time.process_time()
                values[method] = run_once(method, name, losses[method], x, w, out)
                if repeat:
                    times[method].append(time.perf_counter() - started)
                    cpu_times[method].append(time.process_time() - cpu_started)
        plain, blocked, kept = (statistics.median(times[m]) * 1e3 for m in METHODS)
        cpu = [statistics.median(cpu_times[m]) * 1e3 for m in METHODS]
        computed = losses["kept"]._stored_pairs.computed
        computed = f"{computed:,} of {args.n ** 2:,}" if losses["kept"].keeps_stored_pairs else "keeps none"
        print(f"| {name} | {plain:.0f} | {blocked:.0f} | {kept:.0f} | {plain / blocked:.2f}x | {plain / kept:.2f}x "
              f"| {blocked / kept:.2f}x | {cpu[0]:.0f}, {cpu[1]:.0f}, {cpu[2]:.0f} "
              f"| {cpu[0] / cpu[2]:.1f}x, {cpu[1] / cpu[2]:.1f}x "
              f"| {values['plain']:.6f}, {values['blocked']:.6f}, {values['kept']:.6f} "
              f"| {computed} |", flush=True)


def rss_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_peak(method, batch, classes, dim, num_steps):
    """In this (fresh) process: the rise of the peak resident set over the resident set before one loss
    forward+backward, in bytes, on concatenated inputs built straight (no ring, so nothing else is resident)."""
    generator = torch.Generator().manual_seed(0)
    x = F.normalize(torch.randn(batch, dim, generator=generator), dim=1).requires_grad_()
    w = torch.randn(classes, dim, generator=generator).requires_grad_()
    sets = num_steps + 1
    stored_x = F.normalize(torch.randn(num_steps * batch, dim, generator=generator), dim=1)
    embeddings = torch.cat([x, stored_x])
    class_weights = torch.cat([w, torch.randn(num_steps * classes, dim, generator=generator)])
    labels = torch.cat([torch.randint(0, classes, (batch,), generator=generator) + j * classes for j in range(sets)])
    loss = build_loss("norm-softmax")
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from the current one
    before = rss_kib("VmRSS")
    started = time.perf_counter()
    if method == "plain":
        value = plain_loss("norm-softmax", embeddings, labels, class_weights)
    else:
        value = loss(embeddings, labels, class_weights, live=(batch, classes))
    value.backward()
    return {"peak_bytes": (rss_kib("VmHWM") - before) * 1024, "seconds": time.perf_counter() - started,
            "loss": value.item()}


def kept_bytes(loss):
    """Bytes of what ``loss`` keeps between calls (its pairs and own similarities), each storage counted once."""
    storages = {}

    def add(value):
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, (tuple, list)):
            for item in value:
                add(item)

    for columns in loss._stored_pairs.values.values():
        add(list(columns.values()))
    add(list(loss._stored_pairs.own.values()))
    return sum(storages.values())


def ring_bytes(batch, classes, dim, num_steps, margin):
    """MemVir(N, M)'s ring at this geometry in float32, and its output at k = N."""
    capacity = num_steps * (margin + 1)
    return capacity * ((batch + classes) * dim * 4 + batch * 8) + (num_steps + 1) * (batch + classes) * dim * 4


def available_bytes():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def measure_kept_peak(name, batch, classes, dim, num_steps, margin):
    """In this (fresh) process: one forward+backward of loss ``name`` on MemVir(N, M)'s output with its own ``live``,
    after M+1 calls that filled the kept pairs: the rise of the peak resident set over the resident set before it."""
    generator = torch.Generator().manual_seed(0)
    capacity = num_steps * (margin + 1)
    # stores before its warm-up ends; names its live steps, so the loss keeps the live blocks' pairs
    mv = MemVir(num_steps, margin, warmup_steps=capacity, schedule="all-at-once", live_pairs=True)
    loss = build_loss(name)

    def step():
        x = F.normalize(torch.randn(batch, dim, generator=generator), dim=1).requires_grad_()
        w = torch.randn(classes, dim, generator=generator).requires_grad_()
        return mv(x, torch.randint(0, classes, (batch,), generator=generator), w)

    for _ in range(capacity):
        step()
    for _ in range(margin + 1):
        out = step()
        loss(*out, live=out.live).backward()
    out = step()
    assert mv.num_virtual_sets == num_steps
    kept = kept_bytes(loss)
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_kib("VmRSS")
    started, cpu_started = time.perf_counter(), time.process_time()
    value = loss(*out, live=out.live)
    value.backward()
    return {"peak_bytes": (rss_kib("VmHWM") - before) * 1024, "seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu_started, "kept_bytes": kept,
            "computed": loss._stored_pairs.computed, "loss": value.item()}


def measure_plain_peak(name, batch, classes, dim, num_steps):
    """``measure_peak``'s plain computation for loss ``name``, CPU seconds too."""
    generator = torch.Generator().manual_seed(0)
    x = F.normalize(torch.randn(batch, dim, generator=generator), dim=1).requires_grad_()
    w = torch.randn(classes, dim, generator=generator).requires_grad_()
    stored_x = F.normalize(torch.randn(num_steps * batch, dim, generator=generator), dim=1)
    embeddings = torch.cat([x, stored_x])
    class_weights = torch.cat([w, torch.randn(num_steps * classes, dim, generator=generator)])
    labels = torch.cat([torch.randint(0, classes, (batch,), generator=generator) + j * classes
                        for j in range(num_steps + 1)])
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_kib("VmRSS")
    started, cpu_started = time.perf_counter(), time.process_time()
    value = plain_loss(name, embeddings, labels, class_weights)
    value.backward()
    return {"peak_bytes": (rss_kib("VmHWM") - before) * 1024, "seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu_started, "loss": value.item()}


def in_fresh_process(*options):
    """This script's JSON answer for ``options`` from a fresh process whose allocator gives freed memory back: glibc's
    mmap threshold fixed low (else it grows to 32 MB and the freed blocks of the untimed calls stay resident, hiding
    the measured call's peak) and the heap trimmed at every free."""
    command = [sys.executable, __file__, *map(str, options)]
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True, env=environment).stdout)


def kept_peaks(args):
    batch, classes, dim, margin = args.batch, args.peak_classes, args.peak_dim, args.m
    print(f"\n## Peak memory of the loss keeping its pairs: B={batch} C={classes} D={dim} M={margin}, float32, "
          f"MemVir's own live after M+1 calls, memory full (k = N), each in a fresh process\n")
    print("| loss | N | rows x classes | plain: peak | kept: peak of the call | kept pairs (held between calls) "
          "| MemVir's ring | plain / kept | kept: call s (wall, CPU) | plain: s (wall, CPU) | stored blocks computed |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---|---:|")
    for name in args.kept_peak_losses:
        plain = {}
        for n in args.peak_n:
            if n in args.plain_peak_n:
                plain[n] = in_fresh_process("--peak-of", "plain-of", "--peak-loss", name, "--batch", batch,
                                            "--peak-classes", classes, "--peak-dim", dim, "--peak-n", n)
        # the plain peak where it was not run: a + b (N+1)^2 through the two largest measured N
        measured = sorted(plain)
        fit = None
        if len(measured) >= 2:
            (n1, n2) = measured[-2:]
            b = (plain[n2]["peak_bytes"] - plain[n1]["peak_bytes"]) / ((n2 + 1) ** 2 - (n1 + 1) ** 2)
            fit = (plain[n2]["peak_bytes"] - b * (n2 + 1) ** 2, b)
        for n in args.peak_n:
            rows, columns = (n + 1) * batch, (n + 1) * classes
            needed = ring_bytes(batch, classes, dim, n, margin)
            if needed * 1.25 > available_bytes():
                print(f"| {name} | {n} | {rows:,} x {columns:,} | | not run: its ring and output need "
                      f"{needed / 1e9:.1f} GB, {available_bytes() / 1e9:.1f} GB free | | | | | | |", flush=True)
                continue
            kept = in_fresh_process("--peak-of", "kept", "--peak-loss", name, "--batch", batch, "--peak-classes",
                                    classes, "--peak-dim", dim, "--peak-n", n, "--m", margin)
            if n in plain:
                plain_peak = f"{plain[n]['peak_bytes'] / 1e9:.2f} GB"
                ratio = plain[n]["peak_bytes"] / kept["peak_bytes"]
                plain_seconds = f"{plain[n]['seconds']:.1f}, {plain[n]['cpu_seconds']:.1f}"
            elif fit:
                fitted = fit[0] + fit[1] * (n + 1) ** 2
                plain_peak, ratio, plain_seconds = f"about {fitted / 1e9:.1f} GB (fitted)", fitted / kept[
                    "peak_bytes"], "-"
            else:
                plain_peak, ratio, plain_seconds = "not run", None, "-"
            ratio = f"{'about ' if n not in plain else ''}{ratio:.0f}x" if ratio else "-"
            print(f"| {name} | {n} | {rows:,} x {columns:,} | {plain_peak} | {kept['peak_bytes'] / 1e9:.2f} GB "
                  f"| {kept['kept_bytes'] / 1e9:.3f} GB | {ring_bytes(batch, classes, dim, n, margin) / 1e9:.1f} GB "
                  f"| {ratio} | {kept['seconds']:.1f}, {kept['cpu_seconds']:.1f} | {plain_seconds} "
                  f"| {kept['computed']:,} of {n * n:,} |", flush=True)


def peaks(args):
    chunk_rows = build_loss("norm-softmax").chunk_rows
    print(f"\n## Peak memory of the loss: Norm-softmax, B={args.batch} C={args.peak_classes} D={args.peak_dim}, "
          f"float32, memory full (k = N), each in a fresh process\n")
    print("| N | rows x classes | plain: largest logit matrix | plain: measured peak | blocked: largest logit "
          "block | blocked: measured peak | plain / blocked | seconds (plain, blocked) |")
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    batch, classes = args.batch, args.peak_classes
    for n in args.peak_n:
        rows, columns = (n + 1) * batch, (n + 1) * classes
        plain_block = rows * columns * 4
        blocked_block = max(batch * n * classes, n * batch * classes, min(chunk_rows, n * batch) * n * classes) * 4
        measured = {}
        for method in (("plain", "blocked") if n in args.plain_peak_n else ("blocked",)):
            command = [sys.executable, __file__, "--peak-of", method, "--batch", str(batch),
                       "--peak-classes", str(classes), "--peak-dim", str(args.peak_dim), "--peak-n", str(n)]
            measured[method] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        plain = measured.get("plain")
        blocked = measured["blocked"]
        ratio = f"{plain['peak_bytes'] / blocked['peak_bytes']:.1f}x" if plain else "-"
        seconds = f"{plain['seconds']:.1f}, {blocked['seconds']:.1f}" if plain else f"-, {blocked['seconds']:.1f}"
        plain_peak = f"{plain['peak_bytes'] / 1e9:.2f} GB" if plain else "not run"
        print(f"| {n} | {rows:,} x {columns:,} | {plain_block / 1e9:.2f} GB | {plain_peak} "
              f"| {blocked_block / 1e9:.3f} GB | {blocked['peak_bytes'] / 1e9:.2f} GB | {ratio} | {seconds} |",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=98)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--n", type=int, default=45)
    parser.add_argument("--m", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--losses", type=lambda text: text.split(","), default=list(LOSSES))
    parser.add_argument("--peak-classes", type=int, default=11318)
    parser.add_argument("--peak-dim", type=int, default=512)
    parser.add_argument("--peak-n", type=lambda text: [int(n) for n in text.split(",") if n], default=[5, 10, 45])
    parser.add_argument("--plain-peak-n", type=lambda text: [int(n) for n in text.split(",") if n], default=[5, 10])
    parser.add_argument("--kept-peak-losses", type=lambda text: [name for name in text.split(",") if name],
                        default=[], help="the losses whose peak is measured keeping their pairs, e.g. "
                        "norm-softmax,proxy-anchor (at --peak-n, M = --m; the plain one at --plain-peak-n)")
    parser.add_argument("--peak-loss", default="norm-softmax", help=argparse.SUPPRESS)
    parser.add_argument("--peak-of", choices=["plain", "blocked", "kept", "plain-of"],
                        help=argparse.SUPPRESS)  # the fresh process
    args = parser.parse_args()
    if args.peak_of == "kept":
        print(json.dumps(measure_kept_peak(args.peak_loss, args.batch, args.peak_classes, args.peak_dim,
                                           args.peak_n[0], args.m)))
        return
    if args.peak_of == "plain-of":
        print(json.dumps(measure_plain_peak(args.peak_loss, args.batch, args.peak_classes, args.peak_dim,
                                            args.peak_n[0])))
        return
    if args.peak_of:
        print(json.dumps(measure_peak(args.peak_of, args.batch, args.peak_classes, args.peak_dim, args.peak_n[0])))
        return
    print("command: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_blocked_loss.py " + " ".join(sys.argv[1:]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    if args.repeats:
        speed(args)
    if args.kept_peak_losses:
        kept_peaks(args)
    elif args.peak_n:
        peaks(args)


if __name__ == "__main__":
    main()
