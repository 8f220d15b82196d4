"""Searching with images: a query brought to the model's terms, a set of images indexed the same way, one search.

A model's config (`EmbeddingModel.config`) says what its inputs looked like in training. A glyph model
(``image_kind="glyph"``) saw white ink on black, framed as the renderer frames (memvir.data.glyphs.query): an upload
or a drawing is turned so, a drawing's ink fitted to the frame. Any other model takes the image as RGB, a
transparent background read as white paper. The model's own preprocessing (`EmbeddingModel.preprocess`) then
resizes and normalises, as it does for every input.

Uploaded galleries go through the same preparation as a query (never fitted: a gallery image is framed already),
so a query and the images it is compared with are seen alike. A dataset split is embedded by
memvir.retrieval.evaluation instead, through the split's own test transform, as the metrics are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from PIL import Image, UnidentifiedImageError

from memvir.data.folder import IMAGE_EXTENSIONS, class_folders
from memvir.data.glyphs.query import flatten_alpha, glyph_query
from memvir.retrieval.index import GalleryIndex, SearchHit

DEFAULT_BATCH_SIZE = 256


class QueryResult(NamedTuple):
    """A search with one image: its hits, best first, and the query as the model saw it (before its resize)."""

    hits: list[SearchHit]
    query: Image.Image


def prepare_query(image: Image.Image, config: dict, drawn: bool = False) -> Image.Image:
    """The image as it goes into the model's own preprocessing.

    Args:
        image: any PIL image (an upload, a photo, a drawing's composite with or without transparency).
        config: the model's config (`EmbeddingModel.config`, or its config.json): `image_kind` and `image_size`.
        drawn: the image is a drawing, made at any size on a large canvas: for a glyph model its ink is cropped and
            centred with the renderer's margin.

    Returns:
        A grayscale image (glyph models: white ink on black) or an RGB one on white.

    Raises:
        ValueError: a drawing with no ink (memvir.data.DatasetError, which says to draw first).
    """
    if config.get("image_kind") != "glyph":
        return flatten_alpha(image)
    return glyph_query(image, int(config["image_size"]), fit_ink=drawn)


def embed_images(model, images: Sequence[Image.Image], batch_size: int = DEFAULT_BATCH_SIZE,
                 on_progress: Callable[[float], None] | None = None) -> torch.Tensor:
    """L2-normalised embeddings [N, D] (CPU float32) of images prepared as queries are (`prepare_query`, not fitted).

    Args:
        model: an `EmbeddingModel` (its `config` and `embed`).
        images: the images, in order (a list, or any sequence that gives one by position).
        batch_size: images embedded per forward pass.
        on_progress: called after each batch with the fraction embedded so far (for a progress bar).
    """
    config = model.config
    chunks = []
    for start in range(0, len(images), batch_size):
        stop = min(start + batch_size, len(images))
        batch = [prepare_query(images[position], config) for position in range(start, stop)]
        chunks.append(model.embed(batch).float().cpu())
        if on_progress is not None:
            on_progress(stop / len(images))
    if not chunks:
        return torch.empty(0, model.embedding_dim)
    return torch.cat(chunks)


def index_images(model, images: Sequence[Image.Image], labels=None, items=None,
                 batch_size: int = DEFAULT_BATCH_SIZE, on_progress: Callable[[float], None] | None = None,
                 **build_options) -> GalleryIndex:
    """A `GalleryIndex` of images (an uploaded gallery, a folder's files) embedded by `model` (`embed_images`).

    Args:
        model: an `EmbeddingModel`.
        images: the gallery's images, in order.
        labels: optional, one per image (ints or strings).
        items: optional, an id or path per image.
        batch_size, on_progress: as `embed_images`.
        **build_options: passed to `GalleryIndex.build` (kind, backend, its options).

    Returns:
        The index, its rows in the order of `images`.

    Raises:
        ValueError: no images, or labels or items not one per image.
    """
    if len(images) == 0:
        raise ValueError("there are no images to index: give at least one")
    embeddings = embed_images(model, images, batch_size=batch_size, on_progress=on_progress)
    return GalleryIndex.build(embeddings, labels=labels, items=items, **build_options)


class ImageFiles(Sequence):
    """Image files read one at a time as they are asked for (a gallery folder need not fit in memory at once)."""

    def __init__(self, paths: Sequence[str | Path]):
        self.paths = [Path(path) for path in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, position):
        if isinstance(position, slice):
            return ImageFiles(self.paths[position])
        return open_image(self.paths[position])


def open_image(path: str | Path) -> Image.Image:
    """The image in a file, decoded; ValueError naming the file when it is missing or is no image PIL reads."""
    if not Path(path).is_file():
        raise ValueError(f"there is no file {path}: give the path of an image file")
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except (OSError, UnidentifiedImageError) as error:
        raise ValueError(f"{path} cannot be read as an image ({error}); give a PNG, JPEG, BMP, WebP or GIF") from None


def index_folder(model, folder: str | Path, batch_size: int = DEFAULT_BATCH_SIZE,
                 on_progress: Callable[[float], None] | None = None) -> GalleryIndex:
    """A `GalleryIndex` of a folder's images (`index_images`): labelled by class folder when it holds class folders
    (as `folder:PATH` datasets are), else its own image files unlabelled; each row's item is the file's path.

    Raises:
        ValueError: the folder does not exist or holds no images, or a file is no image.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder: give a folder of images or of class folders, or a dataset name")
    classes = class_folders(folder)
    if classes:
        paths = [path for _, images in classes for path in images]
        labels = [name for name, images in classes for _ in images]
    else:
        paths = sorted(path for path in folder.iterdir() if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file())
        labels = None
    if not paths:
        raise ValueError(f"{folder} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}), directly or in class "
                         "folders")
    return index_images(model, ImageFiles(paths), labels=labels, items=[str(path) for path in paths],
                        batch_size=batch_size, on_progress=on_progress)


def search_image(model, index: GalleryIndex, image: Image.Image, k: int, drawn: bool = False,
                 exclude: int | None = None) -> QueryResult:
    """The `k` gallery items nearest an image, best first, by cosine similarity.

    Args:
        model: the `EmbeddingModel` that embedded the index's gallery.
        index: the gallery's `GalleryIndex`.
        image: the query (an upload, a photo, a drawing).
        k: how many hits (fewer when the gallery holds fewer).
        drawn: the query is a drawing (`prepare_query`).
        exclude: a gallery row to leave out (the query itself, when it is a gallery item).

    Returns:
        `QueryResult`: the hits and the query as the model saw it.

    Raises:
        ValueError: k not a whole number of at least 1, or an empty drawing.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a whole number of at least 1, got {k!r}")
    prepared = prepare_query(image, model.config, drawn=drawn)
    wanted = min(k + (exclude is not None), len(index))
    hits = [hit for hit in index.search(model.embed(prepared), wanted)[0] if hit.index != exclude][:k]
    return QueryResult(hits, prepared)
