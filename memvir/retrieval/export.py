"""A gallery's embeddings, labels and thumbnails for other tools: a TensorBoard projector bundle, and `.npz`.

The projector bundle is the folder TensorBoard's projector plugin reads from a log directory: `tensors.tsv` (one
embedding a row, tab-separated), `metadata.tsv` (a header row, then each item's label and class name), `sprite.png`
(the thumbnails in a square grid of ceil(sqrt(N)) cells a side, row by row from the top left) and
`projector_config.pbtxt` naming the three files and the size of one sprite cell. `tensorboard --logdir FOLDER` on
the unzipped folder shows it. The `.npz` holds `embeddings` (float32 [N, D]), `labels` (int64 [N], indexes into
`class_names`) and `class_names` ([C] strings).
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from memvir.checkpoint import atomic_write

TENSORS_FILE = "tensors.tsv"
METADATA_FILE = "metadata.tsv"
SPRITE_FILE = "sprite.png"
CONFIG_FILE = "projector_config.pbtxt"
METADATA_COLUMNS = ("label", "class")
# TensorBoard's projector refuses sprites larger than this on a side.
MAX_SPRITE_SIDE = 8192
# Nine significant digits give back the same float32.
_FLOAT_FORMAT = "%.9g"


def sprite_cell(count: int, cell: int) -> tuple[int, int]:
    """(cells a side, pixels a cell) of the sprite of `count` thumbnails: ceil(sqrt(count)) a side, each cell `cell`
    pixels or fewer, so that the sprite fits MAX_SPRITE_SIDE."""
    if count < 1:
        raise ValueError("there are no thumbnails to lay out; export a gallery of at least one image")
    side = math.isqrt(count - 1) + 1
    fitted = min(cell, MAX_SPRITE_SIDE // side)
    if fitted < 1:
        raise ValueError(f"{count:,} thumbnails do not fit a sprite of {MAX_SPRITE_SIDE} pixels a side; export "
                         "fewer images")
    return side, fitted


def sprite_image(images: Sequence[Image.Image], cell: int = 32) -> tuple[Image.Image, int]:
    """(the sprite, pixels a cell): each image fitted inside its square cell (aspect kept, centred on white)."""
    side, cell = sprite_cell(len(images), cell)
    sprite = Image.new("RGB", (side * cell, side * cell), "white")
    for position, image in enumerate(images):
        fitted = ImageOps.contain(image.convert("RGB"), (cell, cell), Image.Resampling.LANCZOS)
        row, column = divmod(position, side)
        sprite.paste(fitted, (column * cell + (cell - fitted.width) // 2, row * cell + (cell - fitted.height) // 2))
    return sprite, cell


def _checked(embeddings, labels, class_names):
    vectors = np.asarray(embeddings.detach().cpu() if hasattr(embeddings, "detach") else embeddings,
                         dtype=np.float32)
    codes = np.asarray(labels.detach().cpu() if hasattr(labels, "detach") else labels)
    if vectors.ndim != 2 or vectors.shape[0] == 0:
        raise ValueError(f"embeddings must be [N, D] with N >= 1; got shape {vectors.shape}")
    if codes.shape != (vectors.shape[0],) or not np.issubdtype(codes.dtype, np.integer):
        raise ValueError(f"labels must be one whole number per embedding ({vectors.shape[0]}); got shape "
                         f"{codes.shape}, dtype {codes.dtype}")
    names = [str(name) for name in class_names]
    if codes.min() < 0 or codes.max() >= len(names):
        raise ValueError(f"labels must index the {len(names)} class names (0..{len(names) - 1}); got "
                         f"{codes.min()}..{codes.max()}")
    return vectors, codes.astype(np.int64), names


def write_npz(path: Path, embeddings, labels, class_names: Sequence[str]) -> Path:
    """`embeddings` float32 [N, D], `labels` int64 [N] and `class_names` [C] in one `.npz` at `path` (atomically).

    ValueError for embeddings not [N, D], labels not one whole number each, or labels outside the class names."""
    vectors, codes, names = _checked(embeddings, labels, class_names)
    atomic_write(Path(path), lambda handle: np.savez(handle, embeddings=vectors, labels=codes,
                                                     class_names=np.array(names, dtype=str)))
    return Path(path)


def _tsv_field(text: str) -> str:
    # A tab or a line break inside a name would start another column or row.
    return " ".join(text.split())


def projector_files(embeddings, labels, class_names: Sequence[str], images: Sequence[Image.Image],
                    name: str = "embeddings", cell: int = 32) -> dict[str, bytes]:
    """The bundle's four files by name (see the module's docstring); `images`: one thumbnail per embedding, any
    size (each is fitted into a `cell`-pixel square, smaller where the sprite would pass MAX_SPRITE_SIDE)."""
    vectors, codes, names = _checked(embeddings, labels, class_names)
    if len(images) != vectors.shape[0]:
        raise ValueError(f"give one thumbnail per embedding ({vectors.shape[0]}); got {len(images)}")
    tensors = io.StringIO()
    np.savetxt(tensors, vectors, fmt=_FLOAT_FORMAT, delimiter="\t")
    metadata = ["\t".join(METADATA_COLUMNS)] + [f"{code}\t{_tsv_field(names[code])}" for code in codes]
    sprite, cell = sprite_image(images, cell)
    png = io.BytesIO()
    sprite.save(png, format="PNG", optimize=True)
    config = (f'embeddings {{\n  tensor_name: "{_pbtxt_string(name)}"\n  tensor_path: "{TENSORS_FILE}"\n'
              f'  metadata_path: "{METADATA_FILE}"\n  sprite {{\n    image_path: "{SPRITE_FILE}"\n'
              f"    single_image_dim: {cell}\n    single_image_dim: {cell}\n  }}\n}}\n")
    return {TENSORS_FILE: tensors.getvalue().encode(), METADATA_FILE: ("\n".join(metadata) + "\n").encode(),
            SPRITE_FILE: png.getvalue(), CONFIG_FILE: config.encode()}


def _pbtxt_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def write_projector_zip(path: Path, embeddings, labels, class_names: Sequence[str], images: Sequence[Image.Image],
                        name: str = "embeddings", cell: int = 32) -> Path:
    """The projector bundle (`projector_files`) zipped at `path` (atomically), inside one folder named after the
    zip, to give as TensorBoard's log directory once unzipped."""
    path = Path(path)
    files = projector_files(embeddings, labels, class_names, images, name, cell)

    def write(handle):
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for file_name, data in files.items():
                archive.writestr(f"{path.stem}/{file_name}", data)

    atomic_write(path, write)
    return path
