"""Galleries to search (a checkpoint's test split, or images a visitor uploaded), kept once made; their classes as a
visitor names them; what a search over one returns, and the thumbnails they are shown as."""

from __future__ import annotations

import hashlib
import string
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps

from demo.common import upload_store
from demo.common.settings import AppSettings
from demo.common.uploads import UploadError, is_zip, load_image, unpack_upload
from demo.retrieve.checkpoints import LoadedCheckpoint, LruCache, RetrievalError
from memvir.data import load_dataset
from memvir.data.folder import class_folders

THUMBNAIL_SIZE = 96
SAMPLE_SIZE = 48
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
class Answer:
    """A search's answer: its hits, best first, and the query as the model saw it (before the model's resize)."""

    hits: list[Hit]
    query: Image.Image


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


class Galleries:
    """The galleries a search may look in: a checkpoint's test split (made once per dataset and size, and kept) or
    a visitor's upload (loose images, or one zip of class folders); thread-safe."""

    def __init__(self, settings: AppSettings, uploads_in_use: Callable[[], Iterable[Path]] = tuple):
        """uploads_in_use: folders under the uploads folder that must not be pruned (datasets of training runs)."""
        self.settings = settings
        self._uploads_in_use = uploads_in_use
        self._lock = threading.Lock()
        self._kept = LruCache()

    def test_split(self, checkpoint: LoadedCheckpoint) -> Gallery:
        """The test split of the dataset the checkpoint was trained on (glyphs are re-rendered, no download)."""
        config = checkpoint.config
        dataset = config["dataset"]
        size = config["image_size"]
        key = f"test-split:{dataset}:{size}"

        def load():
            try:
                split = load_dataset(dataset, image_size=size).test
            except ValueError as error:
                raise RetrievalError(
                    f"the checkpoint's dataset {dataset!r} is not available on this machine ({error}); "
                    "upload gallery images or a zip of class folders instead"
                ) from None
            return Gallery(key=key, description=f"the {dataset} test split", size=len(split), image=split.image,
                           labels=split.labels.tolist(), class_names=split.class_names,
                           glyphs=checkpoint.is_glyph_model, split=split)

        with self._lock:
            return self._kept.get_or_make(key, load)

    def uploaded(self, paths: Sequence[str | Path]) -> Gallery:
        """A gallery from uploaded images (no labels) or from one zip of class folders (labels = folder names)."""
        paths = [Path(path) for path in paths or []]
        if not paths:
            raise RetrievalError("upload gallery images (or one zip of class folders) first")
        zips = [path for path in paths if is_zip(path)]
        if zips and len(paths) > 1:
            raise RetrievalError("upload either one zip of class folders or loose images, not both")
        settings = self.settings
        if not zips:
            return images_gallery(paths, None, None, f"{len(paths)} uploaded images", settings)
        root = unpack_upload(zips[0], settings, settings.max_gallery_uploads, self._uploads_in_use())
        try:
            return zip_gallery(zips[0].name, root, settings)
        except UploadError:
            upload_store.discard(settings.uploads_dir, root)  # refused: its unpacked copy goes too
            raise


def sample(gallery: Gallery, count: int = SAMPLE_SIZE) -> list[int]:
    """Items to show for click-to-query: one per class across the classes (or the first items)."""
    if gallery.labels is None:
        return list(range(min(count, gallery.size)))
    first_of_class: dict[int, int] = {}
    for index, label in enumerate(gallery.labels):
        first_of_class.setdefault(label, index)
    firsts = list(first_of_class.values())
    step = max(1, len(firsts) // count)
    return firsts[::step][:count]


def example_query_class(gallery: Gallery) -> str | None:
    """A class of the gallery to suggest for "Query's class", as a visitor would type it (a glyph's character): the
    first that is an ASCII letter, which any keyboard types, else the first; None when it has no classes."""
    if not gallery.class_names:
        return None
    typed = [name.split(" ")[0] if gallery.glyphs else name for name in gallery.class_names]
    return next((text for text in typed if text in string.ascii_letters), typed[0])


def query_class_choices(gallery: Gallery) -> list[tuple[str, str]]:
    """(label, value) of each class of the gallery, to pick as the query's class: a glyph's value is its character,
    as a visitor would type it ("Ж", labelled "Ж U+0416"); a folder's, its name. Empty without classes."""
    names = gallery.class_names or []
    return [(name, name.split(" ")[0] if gallery.glyphs else name) for name in names]


def match_class(gallery: Gallery, text: str | None) -> str | None:
    """The gallery class a visitor named ("Ж", "Ж U+0416", "U+0416" or a folder name), None when blank.

    RetrievalError when the gallery has no such class (or no labels), naming where its classes are listed.
    """
    text = (text or "").strip()
    if not text:
        return None
    if gallery.class_names is None:
        raise RetrievalError("this gallery has no classes, so the query's class cannot be compared")
    for name in gallery.class_names:
        parts = name.split(" ")
        if text == name or (gallery.glyphs and (parts[0] == text or len(parts) > 1 and parts[-1] == text.upper())):
            return name
    count = len(gallery.class_names)
    raise RetrievalError(f"the gallery has no class {text!r}: {gallery.description} holds {count:,} classes, "
                         f"listed under \u201cor pick one of the gallery's classes\u201d (e.g. "
                         f"{example_query_class(gallery)}); pick one there, or leave the query's class empty")
