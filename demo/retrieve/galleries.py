"""Galleries to search (a checkpoint's test split, or images a visitor uploaded), what a search over one returns, and
the thumbnails they are shown as."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps

from demo.common.settings import AppSettings
from demo.common.uploads import UploadError, load_image

THUMBNAIL_SIZE = 96
# Uploads are kept decoded at no more than this on their long side: plenty for any model input here, and it bounds
# the memory of a gallery of 2,000 uploads.
_UPLOAD_SIDE = 512


@dataclass(frozen=True)
class Gallery:
    """Images to search: `image(i)` gives item i; labels and class names when known (a test split, a zip)."""

    key: str
    description: str
    size: int
    image: Callable[[int], Image.Image]
    labels: list[int] | None = None
    class_names: list[str] | None = None
    glyphs: bool = False  # white ink on black: shown inverted, as print
    split: object | None = None  # a test split's dataset split (memvir.data.SplitDataset), embedded as evaluated

    def class_of(self, index: int) -> str | None:
        return None if self.labels is None else self.class_names[self.labels[index]]


@dataclass(frozen=True)
class IndexedGallery:
    """A gallery's embeddings in a GalleryIndex, with the gallery's own retrieval metrics (when labelled)."""

    index: object  # memvir.retrieval.index.GalleryIndex
    metrics: dict


@dataclass(frozen=True)
class Hit:
    """One result: gallery item, cosine similarity, its class (when known) and whether it matches the query's."""

    index: int
    score: float
    class_name: str | None
    same_class: bool | None


def thumbnail(image: Image.Image, glyphs: bool, size: int = THUMBNAIL_SIZE) -> Image.Image:
    """A display copy at `size` pixels on its long side; glyphs (white ink on black) shown as dark ink on white."""
    shown = image.convert("L") if glyphs else image.convert("RGB")
    if glyphs:
        shown = ImageOps.invert(shown)
    scale = size / max(shown.size)
    return shown.resize((max(1, round(shown.width * scale)), max(1, round(shown.height * scale))),
                        Image.Resampling.LANCZOS)


def zip_gallery(name: str, root: Path, settings: AppSettings) -> Gallery:
    """The images of an unpacked zip of class folders under `root`, labelled by folder; UploadError when it holds
    none or too many, or a file that is no image within the settings' limits."""
    from memvir.data.folder import class_folders

    classes = class_folders(root)
    files = [image for _, images in classes for image in images]
    if not files:
        raise UploadError(f"{name} holds no images in class folders")
    labels = [label for label, (_, images) in enumerate(classes) for _ in images]
    return images_gallery(files, labels, [class_name for class_name, _ in classes],
                          f"{name} ({len(files)} images in {len(classes)} classes)", settings)


def images_gallery(files: list[Path], labels: list[int] | None, class_names: list[str] | None, description: str,
                   settings: AppSettings) -> Gallery:
    """Uploaded image files as a gallery, decoded now so that a bad file is reported at upload, not in the middle of
    a search; its key is a digest of the pixels and labels, so the same upload twice finds the same index."""
    if len(files) > settings.max_gallery_uploads:
        raise UploadError(f"the gallery has {len(files)} images; at most {settings.max_gallery_uploads} "
                          "are accepted")
    images = [_decoded(path, settings) for path in files]
    digest = hashlib.blake2b(digest_size=8)
    for image in images:
        digest.update(image.tobytes())
    digest.update(repr(labels).encode())
    return Gallery(key=f"upload:{digest.hexdigest()}", description=description, size=len(images),
                   image=images.__getitem__, labels=labels, class_names=class_names)


def _decoded(path: Path, settings: AppSettings) -> Image.Image:
    image = load_image(path, settings.max_image_bytes, settings.max_image_pixels)
    image.thumbnail((_UPLOAD_SIDE, _UPLOAD_SIDE))
    return image
