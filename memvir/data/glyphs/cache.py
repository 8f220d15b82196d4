"""The on-disk cache for rendered data: `$MEMVIR_CACHE` or `~/.cache/memvir`, written atomically as .npz files."""

import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from memvir.checkpoint import atomic_write


def cache_dir() -> Path:
    """The cache folder, created if missing: `$MEMVIR_CACHE` when set, else `~/.cache/memvir`."""
    folder = Path(os.environ.get("MEMVIR_CACHE") or Path.home() / ".cache" / "memvir").expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_arrays(path: Path, **arrays: np.ndarray) -> None:
    """Write `arrays` to the compressed .npz file `path` so that readers never see a half-written file: two
    processes filling the cache at once each leave a complete file (`memvir.checkpoint.atomic_write`)."""
    # glyph renders are mostly background: compressed, about 11x smaller
    atomic_write(path, lambda handle: np.savez_compressed(handle, **arrays))


def load_arrays(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The arrays `names` from the .npz file `path`, or None when it is missing or unreadable (then rebuild it)."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in names}
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error):
        return None
