"""The on-disk cache for rendered data: `$MEMVIR_CACHE` or `~/.cache/memvir`, written atomically as .npz files."""

import os
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    """The cache folder, created if missing: `$MEMVIR_CACHE` when set, else `~/.cache/memvir`."""
    folder = Path(os.environ.get("MEMVIR_CACHE") or Path.home() / ".cache" / "memvir").expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_arrays(path: Path, **arrays: np.ndarray) -> None:
    """Write `arrays` to the compressed .npz file `path` so that readers never see a half-written file.

    The data goes to a temporary file in the same folder first and is then renamed over `path` (an atomic step on
    one file system), so two processes filling the cache at once each leave a complete file.
    """
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez_compressed(file, **arrays)  # glyph renders are mostly background: about 11x smaller
        os.chmod(temporary, 0o644)  # mkstemp creates it private; a cache is as readable as any file the user writes
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_arrays(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The arrays `names` from the .npz file `path`, or None when it is missing or unreadable (then rebuild it)."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in names}
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error):
        return None
