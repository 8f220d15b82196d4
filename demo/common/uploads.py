"""Checks on what visitors upload: images that must decode within size limits, and zips of class folders.

Uploads are untrusted. An image is opened only after its file size is checked, and decoded only after the pixel
count in its header is checked (a small file can declare a huge canvas); this holds on every path an image takes:
a query, a drawing (all its layers), gallery images and the images inside zips. A zip's size and file count are
checked before anything is written, then it goes through `memvir.data.extract_class_zip`, which rejects paths
leaving the folder, links and zip bombs, into the app's own uploads folder (one copy per content, bounded:
demo.common.upload_store). Every refusal is an `UploadError` naming the file and what to do; a refused zip leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import zipfile
from collections.abc import Iterable
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from demo.common import upload_store
from demo.common.settings import AppSettings
from memvir.data import DatasetError, extract_class_zip
from memvir.data.folder import class_folders
from memvir.memory.size import format_bytes

ACCEPTED_IMAGES = "PNG, JPEG, BMP, WebP or GIF"


class UploadError(ValueError):
    """An upload was refused; the message names the file and says why."""


def display_name(path: str | Path | bytes) -> str:
    """The file name a visitor recognises (Gradio stores uploads under random folders)."""
    return "the image" if isinstance(path, bytes) else Path(path).name


def _check_size(path: Path, max_bytes: int, kind: str) -> None:
    try:
        size = path.stat().st_size
    except OSError as error:
        raise UploadError(f"{display_name(path)} could not be read ({error.strerror}); upload it again") from None
    if size > max_bytes:
        raise UploadError(
            f"{display_name(path)} is {format_bytes(size)}; {kind} up to {format_bytes(max_bytes)} are accepted"
        )


@contextlib.contextmanager
def _opened_image(source: str | Path | bytes, name: str, max_bytes: int, max_pixels: int):
    """The image at `source` (a file, or bytes) with only its header read, once its file size and its declared
    canvas are within the limits. Decoding errors raised in the caller's block become UploadErrors too."""
    if isinstance(source, bytes):
        if len(source) > max_bytes:
            raise UploadError(f"{name} is {format_bytes(len(source))}; images up to {format_bytes(max_bytes)} are "
                              "accepted")
        opened = io.BytesIO(source)
    else:
        _check_size(Path(source), max_bytes, "images")
        opened = source
    try:
        # Pillow itself only warns about a canvas above its own limit (and refuses one above twice that); the
        # check below refuses any canvas above this app's smaller limit before a single pixel is decoded.
        with Image.open(opened) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise UploadError(
                    f"{name} is {width}x{height} pixels; images up to {max_pixels / 1e6:.0f} megapixels are "
                    "accepted: scale it down and upload it again"
                )
            yield image
    except UploadError:
        raise
    except Image.DecompressionBombError:
        raise UploadError(
            f"{name} declares more than {2 * Image.MAX_IMAGE_PIXELS / 1e6:.0f} megapixels; images up to "
            f"{max_pixels / 1e6:.0f} megapixels are accepted: scale it down and upload it again"
        ) from None
    except UnidentifiedImageError:  # Pillow's words name the server's copy of the file
        raise UploadError(f"{name} is not an image this app can read ({ACCEPTED_IMAGES})") from None
    except (OSError, SyntaxError, ValueError) as error:  # truncated or corrupt data surfaces as any of these
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error  # without the file's path
        raise UploadError(
            f"{name} could not be decoded as an image ({reason}); upload a {ACCEPTED_IMAGES} file"
        ) from None


def check_image(source: str | Path | bytes, max_bytes: int, max_pixels: int, name: str | None = None) -> None:
    """Refuse an image over the limits (UploadError) from its file size and header alone; nothing is decoded."""
    with _opened_image(source, name or display_name(source), max_bytes, max_pixels):
        pass


def load_image(source: str | Path | bytes, max_bytes: int, max_pixels: int, name: str | None = None) -> Image.Image:
    """The decoded image at `source` (a file, or bytes named `name`), fully loaded and closed, or an UploadError
    saying why not."""
    with _opened_image(source, name or display_name(source), max_bytes, max_pixels) as image:
        image.load()
        return image.copy()


def load_sketch(value: dict | None, max_bytes: int, max_pixels: int) -> Image.Image | None:
    """The composite of a sketchpad's value as `demo.retrieve.sketchpad.pass_undecoded` makes it (files or bytes, not
    decoded), or None when nothing was drawn. Every part (background, layers, composite) must be within the limits
    before the composite alone is decoded."""
    if not isinstance(value, dict):
        return None
    parts = [("the drawing's background", value.get("background")),
             *((f"layer {number} of the drawing", layer) for number, layer in enumerate(value.get("layers") or [], 1)),
             ("the drawing", value.get("composite"))]
    for name, source in parts:
        if source is not None:
            check_image(source, max_bytes, max_pixels, name=name)
    composite = value.get("composite")
    return None if composite is None else load_image(composite, max_bytes, max_pixels, name="the drawing")


def is_zip(path: str | Path) -> bool:
    """Whether an upload is to be read as a zip of class folders: by its name, the same on every path. Not by its
    bytes: a PNG with a zip appended is a valid PNG and a valid zip, and it is the image its name says (the checks of
    an image then apply to it, as to any other); a file named .zip that is not one is refused as such."""
    return Path(path).suffix.lower() == ".zip"


def _is_macos_metadata(name: str) -> bool:
    """Entries macOS adds to the zips it makes (``__MACOSX/``, ``._name``), one per file at most."""
    parts = name.replace("\\", "/").split("/")
    return parts[0] == "__MACOSX" or parts[-1].startswith("._")


def _check_entry_count(path: Path, max_images: int) -> None:
    """Refuse, from the zip's directory alone, one holding more files than `max_images` (macOS metadata aside):
    nothing of it has been written yet."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [entry.filename for entry in archive.infolist() if not entry.is_dir()]
    except (zipfile.BadZipFile, OSError):
        return  # extract_class_zip says what is wrong with it
    metadata = sum(_is_macos_metadata(name) for name in names)
    files = len(names) - metadata
    if files > max_images or metadata > max_images:
        raise UploadError(f"{display_name(path)} holds {files:,} files; zips of at most {max_images:,} images are "
                          "accepted")


def unpack_class_zip(path: str | Path, uploads_dir: Path, max_zip_bytes: int, max_unpacked_bytes: int,
                     max_images: int = AppSettings.max_training_images) -> Path:
    """The folder holding the classes of a zip of class folders, unpacked under `uploads_dir` once per content
    (demo.common.upload_store): a zip seen before is not unpacked again. Its size, file count and entries are checked
    before anything is written; a refused zip leaves nothing behind."""
    path = Path(path)
    _check_size(path, max_zip_bytes, "zips")
    _check_entry_count(path, max_images)
    key = upload_store.content_key(path)
    known = upload_store.find(uploads_dir, key)
    if known is not None:
        return known
    staging = upload_store.staging_folder(uploads_dir)
    try:
        class_root = extract_class_zip(path, staging, max_bytes=max_unpacked_bytes)
        size = sum(file.stat().st_size for file in staging.rglob("*") if file.is_file())
        return upload_store.publish(uploads_dir, key, staging, class_root, size)
    except DatasetError as error:
        # The library names Gradio's temporary path; the visitor knows the file by its own name.
        raise UploadError(str(error).replace(str(path), display_name(path))) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone once published or refused; left by an unexpected error


def check_class_images(root: Path, max_bytes: int, max_pixels: int) -> None:
    """Every image of a folder of class folders within the limits, read from the headers (nothing decoded)."""
    for _, images in class_folders(root):
        for image in images:
            check_image(image, max_bytes, max_pixels)


def unpack_upload(path: str | Path, settings: AppSettings, max_images: int, in_use: Iterable[Path] = ()) -> Path:
    """`unpack_class_zip` with the app's limits, every image's header checked, and the uploads folder then pruned
    to its size and age bounds (sparing this zip and the folders in `in_use`). A refused zip is deleted."""
    root = unpack_class_zip(path, settings.uploads_dir, settings.max_zip_bytes, settings.max_unpacked_bytes,
                            max_images)
    try:
        check_class_images(root, settings.max_image_bytes, settings.max_image_pixels)
    except UploadError:
        upload_store.discard(settings.uploads_dir, root)
        raise
    upload_store.prune(settings.uploads_dir, settings.max_uploads_bytes, settings.max_upload_age_s,
                       in_use=[root, *in_use])
    return root
