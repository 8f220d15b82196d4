"""Safe extraction of an uploaded zip of class folders (for `folder:PATH` datasets built in the app).

An uploaded archive is untrusted. Before anything is written, every entry header is checked: no path may leave the
destination (absolute paths, drive letters, `..`), no symlinks or device files, no encryption, at most `max_files`
entries, at most `max_bytes` uncompressed and at most `max_ratio` times the compressed size (a zip bomb). While
extracting, the bytes actually written are counted against the same limits, since headers can lie. Entries are
written into a private staging folder and moved into place only when all succeeded, so a rejected archive leaves
nothing behind.
"""

import re
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from memvir.data.errors import DatasetError
from memvir.data.folder import IMAGE_EXTENSIONS

DEFAULT_MAX_BYTES = 1024**3  # 1 GiB uncompressed
DEFAULT_MAX_FILES = 50_000
DEFAULT_MAX_RATIO = 200.0  # images barely compress; a bomb compresses a thousandfold and more
_CHUNK_BYTES = 1024**2
_DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
NAME_MAX_BYTES = 255  # a file or folder name, on Linux's file systems and most others
_QUOTED_CHARS = 60


def _quoted(name: str) -> str:
    """An entry's name as a message quotes it: cut short, so that a refusal never hands back a name whole."""
    return repr(name if len(name) <= _QUOTED_CHARS else name[: _QUOTED_CHARS - 1] + "…")


def _check_entry(entry: zipfile.ZipInfo, zip_path: Path) -> None:
    """Reject an entry whose name could escape the destination or that is not a plain file or folder."""
    name = entry.filename
    # Zip names use "/", but archives made on Windows may carry "\"; treat both as separators.
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or _DRIVE_LETTER.match(name):
        raise DatasetError(f"{zip_path}: entry {name!r} has an absolute path; only relative paths are allowed")
    if ".." in parts:
        raise DatasetError(f"{zip_path}: entry {name!r} points outside the destination ('..'); rejected")
    file_type = stat.S_IFMT(entry.external_attr >> 16)
    if file_type == stat.S_IFLNK:
        raise DatasetError(f"{zip_path}: entry {name!r} is a symbolic link; only files and folders are allowed")
    if file_type not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise DatasetError(f"{zip_path}: entry {name!r} is a special file; only files and folders are allowed")
    if entry.flag_bits & 0x1:
        raise DatasetError(f"{zip_path}: entry {name!r} is encrypted; upload an unencrypted zip")
    # Refused here rather than by the file system, whose error names the folder it was unpacking into.
    longest = max((len(part.encode("utf-8", "surrogateescape")) for part in parts), default=0)
    if longest > NAME_MAX_BYTES:
        raise DatasetError(f"{zip_path}: entry {_quoted(name)} has a file or folder name of {longest} bytes; at most "
                           f"{NAME_MAX_BYTES} are allowed: rename it and zip again")


def _check_headers(
    entries: list[zipfile.ZipInfo], zip_path: Path, max_bytes: int, max_files: int, max_ratio: float
) -> None:
    """The limits as the headers declare them: entry count, total size, compression ratio; and each entry's path."""
    if len(entries) > max_files:
        raise DatasetError(f"{zip_path} holds {len(entries)} entries; at most {max_files} are allowed")
    for entry in entries:
        _check_entry(entry, zip_path)
    total_bytes = sum(entry.file_size for entry in entries)
    if total_bytes > max_bytes:
        raise DatasetError(f"{zip_path} would unpack to {total_bytes:,} bytes; at most {max_bytes:,} are allowed")
    compressed_bytes = sum(entry.compress_size for entry in entries)
    if total_bytes > max_ratio * max(compressed_bytes, 1):
        raise DatasetError(
            f"{zip_path} unpacks {total_bytes:,} bytes from {compressed_bytes:,} compressed, a ratio above the "
            f"allowed {max_ratio:g}: rejected as a possible zip bomb"
        )


def _extract_entries(
    archive: zipfile.ZipFile, entries: list[zipfile.ZipInfo], staging: Path, zip_path: Path, byte_budget: int
) -> None:
    """Write the entries under `staging`, counting the bytes really written against `byte_budget`."""
    staging_root = staging.resolve()
    written = 0
    for entry in entries:
        target = staging.joinpath(*PurePosixPath(entry.filename.replace("\\", "/")).parts)
        if not target.resolve().is_relative_to(staging_root):
            raise DatasetError(f"{zip_path}: entry {entry.filename!r} points outside the destination; rejected")
        try:
            if entry.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(entry) as source, open(target, "xb") as destination:
                while chunk := source.read(_CHUNK_BYTES):
                    written += len(chunk)
                    if written > byte_budget:
                        raise DatasetError(
                            f"{zip_path}: unpacking exceeded {byte_budget:,} bytes at entry {entry.filename!r}, "
                            "more than its headers declared or allowed: rejected as a possible zip bomb"
                        )
                    destination.write(chunk)
        except FileExistsError:
            raise DatasetError(f"{zip_path}: entry {entry.filename!r} appears twice; paths must be unique") from None
        except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError) as error:
            # an OSError's own text names the staging folder, a path of the server: its reason alone
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            raise DatasetError(f"{zip_path}: entry {_quoted(entry.filename)} cannot be unpacked: {reason}") from error


def _class_root(folder: Path) -> Path:
    """The folder that holds the class folders: `folder`, or its only sub-folder when the zip wrapped them in one."""
    visible = [path for path in folder.iterdir() if not path.name.startswith(".") and path.name != "__MACOSX"]
    if len(visible) == 1 and visible[0].is_dir():
        inner = list(visible[0].iterdir())
        has_subfolders = any(path.is_dir() for path in inner)
        has_images = any(path.suffix.lower() in IMAGE_EXTENSIONS for path in inner)
        if has_subfolders and not has_images:
            return visible[0]
    return folder


def extract_class_zip(
    zip_path: str | Path,
    dest_dir: str | Path,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> Path:
    """Unpack an uploaded zip of class folders into `dest_dir` (missing or empty) and return the class root.

    The class root is `dest_dir`, or the single folder inside it when the zip wrapped its class folders in one
    (as zipping a folder does). Any violation raises a DatasetError that says what was wrong, and leaves
    `dest_dir` as it was.
    """
    zip_path, dest_dir = Path(zip_path), Path(dest_dir)
    if dest_dir.exists() and (not dest_dir.is_dir() or any(dest_dir.iterdir())):
        raise DatasetError(f"destination {dest_dir} must be a new or empty folder")
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as error:
        raise DatasetError(f"{zip_path} is not a readable zip file: {error}") from error
    with archive:
        entries = archive.infolist()
        _check_headers(entries, zip_path, max_bytes, max_files, max_ratio)
        # Bytes really written may exceed neither the size limit nor the ratio limit against the archive's size.
        byte_budget = int(min(max_bytes, max_ratio * max(zip_path.stat().st_size, 1)))
        created_dest = not dest_dir.exists()
        dest_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=dest_dir))
        try:
            _extract_entries(archive, entries, staging, zip_path, byte_budget)
            for path in staging.iterdir():
                path.rename(dest_dir / path.name)
        except BaseException:
            # dest_dir was new or empty, so everything in it now came from this archive.
            if created_dest:
                shutil.rmtree(dest_dir, ignore_errors=True)
            else:
                for path in dest_dir.iterdir():
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
            raise
        staging.rmdir()
    return _class_root(dest_dir)
