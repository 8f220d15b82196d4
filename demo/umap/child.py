"""The UMAP process's own side (`python -m demo.umap.child NICENESS SERVER_PID`, started by demo.umap.service).

It first has the kernel end it with the server (Linux), then says "alive" on its answer pipe: only then may the
server stop it between layouts (UmapProcess.hold), since a stopped process the server left behind would stay for
good. Then it lowers its priority, imports umap, pays numba's compile on a tiny layout, says "ready", and answers
each (points, seed, init, options) with (xy, error, CPU seconds), pickled on pipes. This module imports little, so
that the first two steps come within milliseconds of the start.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time

# Where the kernel ends the child with the server (prctl's PR_SET_PDEATHSIG), so that the child may be held stopped.
DIES_WITH_THE_SERVER = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1


def send(pipe, message) -> None:
    pickle.dump(message, pipe, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.flush()


def _die_with_the_server(server: int) -> None:
    """Have the kernel kill this process when the server's thread that started it ends: however the server ends,
    even killed, it leaves no child behind, compiling for a minute, or stopped for good while held."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # the server ended before that took effect
        os._exit(0)


def serve(requests, answers) -> None:
    """Compile, then answer each (points, seed, init, options: umap_layout's keywords) with (xy, error, CPU
    seconds)."""
    import numpy as np

    from memvir.analysis.projection import umap_layout  # torch: after "alive", which must come at once

    started = time.process_time()
    umap_layout(np.random.default_rng(0).normal(size=(24, 8)), 0)  # numba compiles here, not in the first real job
    send(answers, ("ready", None, time.process_time() - started))
    while True:
        try:
            job = pickle.load(requests)
        except EOFError:  # the app closed the pipe, or is gone
            return
        points, seed, init, options = job
        started = time.process_time()
        try:
            xy, error = umap_layout(points, seed, init, **options), None
        except Exception as exc:  # noqa: BLE001 - a failed layout is an answer; the child serves on
            xy, error = None, f"{type(exc).__name__}: {exc}"
        send(answers, (xy, error, time.process_time() - started))


if __name__ == "__main__":
    if DIES_WITH_THE_SERVER:
        _die_with_the_server(int(sys.argv[2]))
    # The answers go on the original stdout; anything a library prints goes to stderr, not into the pipe.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    send(answers, ("alive", None, 0.0))
    os.nice(int(sys.argv[1]))
    serve(sys.stdin.buffer, answers)
