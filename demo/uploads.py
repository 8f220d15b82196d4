"""Checks on what visitors upload: images that must decode within size limits, and zips of class folders.

Uploads are untrusted. An image is opened only after its file size is checked, and decoded only after the pixel
count in its header is checked (a small file can declare a huge canvas). A zip goes through
`memvir.data.extract_class_zip`, which rejects paths leaving the folder, links and zip bombs, into a fresh folder
under the app's own uploads folder. Every refusal is an `UploadError` naming the file and what to do.
"""

from __future__ import annotations

import uuid
import warnings
import zipfile
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from demo.settings import MB

ACCEPTED_IMAGES = "PNG, JPEG, BMP, WebP or GIF"


class UploadError(ValueError):
    """An upload was refused; the message names the file and says why."""


def display_name(path: str | Path) -> str:
    """The file name a visitor recognises (Gradio stores uploads under random folders)."""
    return Path(path).name


def _check_size(path: Path, max_bytes: int, kind: str) -> None:
    try:
        size = path.stat().st_size
    except OSError as error:
        raise UploadError(f"{display_name(path)} could not be read ({error.strerror}); upload it again") from None
    if size > max_bytes:
        raise UploadError(
            f"{display_name(path)} is {size / MB:.1f} MB; {kind} up to {max_bytes / MB:.0f} MB are accepted"
        )


def load_image(path: str | Path, max_bytes: int, max_pixels: int) -> Image.Image:
    """The decoded image at `path` (fully loaded, file closed), or an UploadError saying why not."""
    path = Path(path)
    _check_size(path, max_bytes, "images")
    name = display_name(path)
    try:
        with warnings.catch_warnings():
            # Pillow only warns below twice its own limit; here any oversized canvas is refused.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > max_pixels:
                    raise UploadError(
                        f"{name} is {width}x{height} pixels; images up to {max_pixels / 1e6:.0f} megapixels are "
                        "accepted: scale it down and upload it again"
                    )
                image.load()
                return image.copy()
    except UploadError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise UploadError(f"{name} is not an image this app can read ({ACCEPTED_IMAGES}): {error}") from None
    except (OSError, SyntaxError, ValueError) as error:  # truncated or corrupt data surfaces as any of these
        raise UploadError(
            f"{name} could not be decoded as an image ({error}); upload a {ACCEPTED_IMAGES} file"
        ) from None


def is_zip(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".zip" or zipfile.is_zipfile(path)


def unpack_class_zip(path: str | Path, uploads_dir: Path, max_zip_bytes: int, max_unpacked_bytes: int) -> Path:
    """Unpack a zip of class folders into a new folder under `uploads_dir`; the folder holding the classes."""
    from memvir.data import DatasetError, extract_class_zip

    path = Path(path)
    _check_size(path, max_zip_bytes, "zips")
    destination = uploads_dir / f"zip-{uuid.uuid4().hex[:12]}"
    try:
        return extract_class_zip(path, destination, max_bytes=max_unpacked_bytes)
    except DatasetError as error:
        # The library names Gradio's temporary path; the visitor knows the file by its own name.
        raise UploadError(str(error).replace(str(path), display_name(path))) from None
