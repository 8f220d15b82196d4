"""`python -m memvir ...` in a process of its own that does not import torch again: forked from multiprocessing's
forkserver, which imported the CLI and the trainer once (as the app's runs are, demo.runs.process). The process runs
memvir's `__main__` with the arguments, the environment and the folder given, its stdout and stderr in files, and
ends with the CLI's exit status: the same `subprocess.CompletedProcess` a `subprocess.run` of the command gives,
without the interpreter's start and its imports (most of a refusal's time). The command itself, as a shell runs it,
is tested end to end in tests/test_cli.py."""

import functools
import multiprocessing
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOADED = ("memvir.cli", "memvir.train.trainer", "cli_process")


def _context():
    if sys.platform != "linux":  # as the app's runs (demo.runs.process): a fresh interpreter elsewhere
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))  # only read when this test process's forkserver starts
    return context


def _main(argv: list[str], environment: dict, cwd: str, out: str, err: str, before) -> None:
    """In the forked process: the environment, the folder and the output files of a fresh `python -m memvir`."""
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    if before is not None:
        before()
    sys.argv = [str(ROOT / "memvir" / "__main__.py"), *argv]
    runpy.run_module("memvir", run_name="__main__", alter_sys=True)  # ends in sys.exit(the CLI's status)


def run_memvir(*args, env: dict | None = None, before=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m memvir *args` with os.environ and `env` over it, in the repository's folder; `before` (picklable,
    e.g. `file_size_limit(n)`) runs in the process first, as subprocess's preexec_fn."""
    argv = [str(arg) for arg in args]
    environment = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    with tempfile.TemporaryDirectory(prefix="memvir-cli-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        process = _context().Process(target=_main, args=(argv, environment, str(ROOT), out, err, before))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["python", "-m", "memvir", *argv], timeout)
        return subprocess.CompletedProcess(["python", "-m", "memvir", *argv], process.exitcode,
                                           Path(out).read_text(), Path(err).read_text())


def _limit_file_size(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def file_size_limit(limit: int):
    """For `before`: files may not grow past `limit` bytes, and passing it fails the write with EFBIG instead of
    killing the process (SIGXFSZ ignored), as a full disk fails it with ENOSPC."""
    return functools.partial(_limit_file_size, limit)
