"""AppSettings: where the app keeps its files and how much it allows, read from the environment.

Everything the app writes (run folders, unpacked uploads, checkpoint downloads, Gradio's upload cache) lives under
one data folder on the local disk, so a visitor's upload can never land anywhere else. Where a persistent folder is
mounted (a Space's Storage Bucket at /data, or MEMVIR_PERSIST_DIR), resting runs are copied there and found again
after a restart (demo.runs.persist): a bucket uploads files as they close and has no locking, no place for live runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from demo.common.cores import SERVER_PRIORITIES
from demo.common.hub_access import on_space

REPO_ROOT = Path(__file__).resolve().parents[2]
MB = 1024**2
# Where a Space mounts its persistent storage, a Storage Bucket (https://huggingface.co/docs/hub/spaces-storage).
SPACE_STORAGE = Path("/data")


def _int_from_env(name: str, default: int | None, minimum: int) -> int | None:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a whole number; set it to an integer >= {minimum}") from None
    if value < minimum:
        raise ValueError(f"{name}={value} is too small; set it to an integer >= {minimum}")
    return value


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _bytes_from_env(name: str) -> int | None:
    """A size such as 4000000000, 4GB or 3.5GiB; None when unset."""
    text = (os.environ.get(name) or "").strip()
    if not text:
        return None
    number = text.rstrip("BbIiKkMmGgTt ")
    unit = text[len(number):].strip().lower()
    try:
        value = float(number) * _BYTE_UNITS[unit]
    except (ValueError, KeyError):
        raise ValueError(f"{name}={text!r} is not a size; write bytes, or a number with kB, MB, GB, MiB or GiB "
                         "(e.g. 4GB)") from None
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be above 0")
    return int(value)


def _folders_from_env(name: str) -> tuple[Path, ...]:
    """Folders separated by os.pathsep (':' on Linux); none when unset."""
    return tuple(Path(part).expanduser() for part in (os.environ.get(name) or "").split(os.pathsep) if part.strip())


def default_data_dir() -> Path:
    """MEMVIR_APP_DATA when set, else runs/app: on the local disk, also on a Space (see default_persist_dir)."""
    if os.environ.get("MEMVIR_APP_DATA"):
        return Path(os.environ["MEMVIR_APP_DATA"]).expanduser()
    return REPO_ROOT / "runs" / "app"


def _is_mount(path: Path) -> bool:
    return os.path.ismount(path)


def default_persist_dir() -> Path | None:
    """MEMVIR_PERSIST_DIR when set (empty: none); else a folder in /data when a persistent volume is mounted there and
    writable (a Space's Storage Bucket); else None: runs last as long as the local disk."""
    text = os.environ.get("MEMVIR_PERSIST_DIR")
    if text is not None:
        return Path(text).expanduser() if text.strip() else None
    if _is_mount(SPACE_STORAGE) and os.access(SPACE_STORAGE, os.W_OK | os.X_OK):
        return SPACE_STORAGE / "memvir-studio"
    return None


def _flag_from_env(name: str, default: bool) -> bool:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    if text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if text.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={text!r} is not a yes/no value; set it to 1 or 0")


@dataclass(frozen=True)
class AppSettings:
    """The app's folders and limits.

    data_dir: the app's own folder: ``runs/`` (one folder per training run), ``uploads/`` (unpacked zips),
        ``downloads/`` (checkpoint zips), ``galleries/`` (test-split indexes the app rebuilt for checkpoints whose
        folders it does not write: bundled ones, Hub snapshots; demo.retrieve.index_builds) and ``gradio/``
        (Gradio's upload cache). checkpoints_dir: bundled checkpoints, one sub-folder each.
    max_active_runs: training runs allowed at once on this machine (one by default: runs share the device).
    umap: compute UMAP projections of snapshots in the background (PCA is always shown at once).
    max_gallery_uploads / max_training_images: images in a gallery upload / a training zip (counted before a zip is
        unpacked). max_uploads_bytes / max_upload_age_s: the unpacked zips kept in ``uploads/`` (the least recently
        used go first; a zip in use by a training run stays). max_downloads_bytes: the checkpoint zips kept in
        ``downloads/`` (the same age limit; the least recently used go first).
    memory_budget: bytes MemVir's memory may take; None: half of what the run's process may use at the time, the least
        of free memory, cgroup and address-space headroom (demo.runs.memory_budget).
    allowed_folders: folders of this machine whose checkpoints and class folders visitors may name by path, besides
        the bundled checkpoints and the app's runs (demo.common.allowed_paths); none by default.
    train_threads: torch's threads in each run's training process; None: OMP_NUM_THREADS where set, else the
        machine's cores less the server's share (demo.common.cores).
    run_memory_limit: bytes of address space each run's training process may take (RLIMIT_AS): a run that needs
        more fails alone, with a message, before the machine runs short; None: no limit. It counts reserved
        address space, more than the memory used, and suits CPU training (CUDA reserves address space far past it).
    """

    data_dir: Path
    checkpoints_dir: Path
    max_active_runs: int = 1
    umap: bool = True
    max_image_bytes: int = 20 * MB
    max_image_pixels: int = 40_000_000
    max_zip_bytes: int = 200 * MB
    max_unpacked_bytes: int = 1024 * MB
    max_gallery_uploads: int = 2_000
    max_training_images: int = 50_000
    max_uploads_bytes: int = 2048 * MB
    max_upload_age_s: float = 24 * 3600.0
    max_downloads_bytes: int = 512 * MB
    snapshot_history: int = 60
    memory_budget: int | None = None
    allowed_folders: tuple[Path, ...] = ()
    finished_runs_kept: int = 8
    train_threads: int | None = None
    run_memory_limit: int | None = None
    # how the server yields to its runs on small machines (demo.common.cores.yield_to_training)
    server_priority: str = "low"
    # serving a Hugging Face Space: every visitor acts on the Hub as themselves, never with the server's token
    # (demo.common.hub_access)
    space: bool = False
    # where resting runs are copied to outlive the local disk, and restored from at start (demo.runs.persist)
    persist_dir: Path | None = None

    def __post_init__(self):
        if self.max_active_runs < 1:
            raise ValueError(f"max_active_runs must be at least 1, got {self.max_active_runs}")
        if self.snapshot_history < 2:
            raise ValueError(f"snapshot_history must be at least 2, got {self.snapshot_history}")
        if self.server_priority not in SERVER_PRIORITIES:
            raise ValueError(f"MEMVIR_SERVER_PRIORITY={self.server_priority!r} is not one of "
                             f"{', '.join(SERVER_PRIORITIES)}; set it to one of them (default low)")

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @property
    def downloads_dir(self) -> Path:
        return self.data_dir / "downloads"

    @property
    def galleries_dir(self) -> Path:
        return self.data_dir / "galleries"

    @property
    def gradio_dir(self) -> Path:
        return self.data_dir / "gradio"

    @classmethod
    def from_env(cls) -> AppSettings:
        """MEMVIR_APP_DATA (default: `default_data_dir`), MEMVIR_CHECKPOINTS (default checkpoints/),
        MEMVIR_MAX_RUNS (1), MEMVIR_UMAP (1), MEMVIR_MEMORY_BUDGET (a size such as 4GB; default: see memory_budget),
        MEMVIR_ALLOWED_FOLDERS (folders separated by os.pathsep; default none), MEMVIR_TRAIN_THREADS (default:
        OMP_NUM_THREADS, else the cores less the server's share), MEMVIR_RUN_MEMORY_LIMIT (a size; default none),
        MEMVIR_SERVER_PRIORITY (idle, low or normal: how the server yields to its runs on a machine of up to 4 cores;
        default low), MEMVIR_PERSIST_DIR (default: see default_persist_dir); SPACE_ID (set by Spaces)."""
        return cls(
            data_dir=default_data_dir(),
            checkpoints_dir=Path(os.environ.get("MEMVIR_CHECKPOINTS") or REPO_ROOT / "checkpoints").expanduser(),
            max_active_runs=_int_from_env("MEMVIR_MAX_RUNS", 1, 1),
            umap=_flag_from_env("MEMVIR_UMAP", True),
            memory_budget=_bytes_from_env("MEMVIR_MEMORY_BUDGET"),
            allowed_folders=_folders_from_env("MEMVIR_ALLOWED_FOLDERS"),
            train_threads=_int_from_env("MEMVIR_TRAIN_THREADS", None, 1),
            run_memory_limit=_bytes_from_env("MEMVIR_RUN_MEMORY_LIMIT"),
            server_priority=(os.environ.get("MEMVIR_SERVER_PRIORITY") or "low").strip().lower(),
            space=on_space(),
            persist_dir=default_persist_dir(),
        )
