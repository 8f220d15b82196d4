"""memvir.retrieval.export, read back as TensorBoard would: the zip's tsv files parsed by hand, the sprite's size
against ceil(sqrt(N)) cells, each cell's pixels against the thumbnail put there, the pbtxt's fields, and the .npz's
arrays against the embeddings given."""

import math
import re
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from memvir.retrieval import export
from memvir.retrieval.export import sprite_cell, write_npz, write_projector_zip


def gallery(count=11, dim=5, seed=0):
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(count, dim)).astype(np.float32)
    labels = rng.integers(0, 3, size=count)
    names = ["alpha", "beta\tgamma", "Ж U+0416"]  # a tab inside a name must not start a column
    # Each thumbnail one flat grey, told apart by its level; sizes vary, as uploads do.
    images = [Image.new("L", (8 + i % 3, 8), 10 + 20 * i) for i in range(count)]
    return vectors, labels, names, images


def read_zip(path):
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_projector_bundle_reads_back(tmp_path):
    vectors, labels, names, images = gallery()
    path = write_projector_zip(tmp_path / "memvir-projector.zip", vectors, labels, names, images, name="memvir",
                               cell=8)
    files = read_zip(path)
    assert sorted(files) == sorted(f"memvir-projector/{name}" for name in
                                   ("tensors.tsv", "metadata.tsv", "sprite.png", "projector_config.pbtxt"))

    rows = files["memvir-projector/tensors.tsv"].decode().splitlines()
    parsed = np.array([[float(field) for field in row.split("\t")] for row in rows], dtype=np.float32)
    np.testing.assert_array_equal(parsed, vectors)  # nine digits give each float32 back

    lines = files["memvir-projector/metadata.tsv"].decode().splitlines()
    assert lines[0] == "label\tclass"  # a header, as there are two columns
    assert [line.split("\t") for line in lines[1:]] == [[str(label), names[label].replace("\t", " ")]
                                                       for label in labels]

    config = files["memvir-projector/projector_config.pbtxt"].decode()
    fields = dict(re.findall(r'(\w+): "([^"]*)"', config))
    assert fields == {"tensor_name": "memvir", "tensor_path": "tensors.tsv", "metadata_path": "metadata.tsv",
                      "image_path": "sprite.png"}
    assert re.findall(r"single_image_dim: (\d+)", config) == ["8", "8"]

    sprite_path = tmp_path / "sprite.png"
    sprite_path.write_bytes(files["memvir-projector/sprite.png"])
    sprite = np.asarray(Image.open(sprite_path).convert("L"))
    side = math.ceil(math.sqrt(len(vectors)))
    assert sprite.shape == (side * 8, side * 8)
    for position in range(len(vectors)):
        row, column = divmod(position, side)
        centre = sprite[row * 8 + 4, column * 8 + 4]
        assert centre == 10 + 20 * position  # row by row from the top left
    assert (sprite[(side - 1) * 8:, (len(vectors) % side) * 8:] == 255).all()  # cells past the last are white


@pytest.mark.parametrize("count, cell, expected", [(1, 32, (1, 32)), (4, 32, (2, 32)), (5, 32, (3, 32)),
                                                   (12250, 32, (111, 32)), (12250, 96, (111, 73)),
                                                   (400_000, 32, (633, 12))])
def test_sprite_is_ceil_sqrt_cells_a_side_and_fits_tensorboard(count, cell, expected):
    assert sprite_cell(count, cell) == expected
    side, fitted = expected
    assert side == math.ceil(math.sqrt(count)) and side * fitted <= 8192


def test_npz_holds_the_embeddings_labels_and_names(tmp_path):
    vectors, labels, names, _ = gallery()
    path = write_npz(tmp_path / "gallery.npz", torch.from_numpy(vectors), torch.from_numpy(labels), names)
    with np.load(path) as saved:
        assert saved["embeddings"].dtype == np.float32 and saved["labels"].dtype == np.int64
        np.testing.assert_array_equal(saved["embeddings"], vectors)
        np.testing.assert_array_equal(saved["labels"], labels)
        assert saved["class_names"].tolist() == names


def test_bad_input_says_what_is_wrong(tmp_path):
    vectors, labels, names, images = gallery()
    with pytest.raises(ValueError, match="one thumbnail per embedding"):
        write_projector_zip(tmp_path / "a.zip", vectors, labels, names, images[:-1])
    with pytest.raises(ValueError, match="index the 3 class names"):
        write_npz(tmp_path / "a.npz", vectors, labels + 3, names)
    with pytest.raises(ValueError, match="one whole number per embedding"):
        write_npz(tmp_path / "a.npz", vectors, labels[:-1], names)
    with pytest.raises(ValueError, match=r"\[N, D\]"):
        write_npz(tmp_path / "a.npz", vectors[0], labels, names)
    with pytest.raises(ValueError, match="do not fit a sprite"):
        sprite_cell(export.MAX_SPRITE_SIDE**2 + 1, 32)
    assert not list(tmp_path.iterdir())  # nothing half-written is left
