"""`python -m memvir search` (a query image against a folder of class folders, checked against a brute-force cosine
ranking written here) and `python -m memvir index` without --out (a checkpoint folder's own gallery/; the rest of
it is tested in tests/retrieval/test_shipped_gallery.py), and their refusals. The commands run in processes forked
with the imports done (tests/cli_process.py)."""

import json

import numpy as np
import pytest
import torch
from cli_process import run_memvir
from PIL import Image

from memvir.models.embedding_model import EmbeddingModel


def _stroke(offset: int) -> np.ndarray:
    """A light bar on black, as a glyph render is, further right with `offset`."""
    pixels = np.zeros((32, 32), dtype=np.uint8)
    pixels[6:26, 4 + offset: 9 + offset] = 255
    return pixels


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    torch.manual_seed(0)
    model = EmbeddingModel(embedding_dim=8, in_channels=1, image_size=32, dataset="glyphs-mini").eval()
    model.save_pretrained(root / "model")
    paths = []
    for label, offsets in (("left", (0, 2, 4)), ("right", (14, 16, 18))):
        (root / "gallery" / label).mkdir(parents=True)
        for offset in offsets:
            paths.append(root / "gallery" / label / f"bar-{offset:02d}.png")
            Image.fromarray(_stroke(offset)).save(paths[-1])
    Image.fromarray(_stroke(3)).save(root / "query.png")
    return root, model, paths


def test_search_prints_the_nearest_images_of_a_folder(folders):
    root, model, paths = folders
    result = run_memvir("search", root / "model", root / "query.png", "--gallery", root / "gallery", "-k", "4")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])

    # By hand: every image as the glyph model takes it (already light on black: unchanged), cosines in float64.
    vectors = model.embed([Image.fromarray(np.asarray(Image.open(path))) for path in paths]).double().numpy()
    query = model.embed(Image.fromarray(_stroke(3)))[0].double().numpy()
    cosines = vectors @ query
    order = sorted(range(len(paths)), key=lambda row: (-cosines[row], row))[:4]
    assert answer["items"] == 6 and answer["gallery"] == str(root / "gallery")
    assert [hit["item"] for hit in answer["hits"]] == [str(paths[row]) for row in order]
    assert [hit["label"] for hit in answer["hits"]] == [paths[row].parent.name for row in order]
    assert [hit["score"] for hit in answer["hits"]] == pytest.approx([cosines[row] for row in order], abs=1e-5)
    assert [hit["rank"] for hit in answer["hits"]] == [1, 2, 3, 4]


@pytest.mark.parametrize(("arguments", "message"), [
    (("search", "{root}/model", "{root}/missing.png"), "error: there is no file {root}/missing.png"),
    (("search", "{root}/model", "{root}/query.png", "-k", "0"), "error: -k must be at least 1, got 0"),
    (("search", "{root}/model", "{root}/query.png", "--gallery", "{root}/model"),
     "error: {root}/model holds no images"),
    (("index", "{root}/model", "{root}/model", "--out", "{root}/index"), "error: --out takes one model"),
])
def test_refusals_say_what_to_do(folders, arguments, message):
    root = folders[0]
    result = run_memvir(*(argument.format(root=root) for argument in arguments))
    assert result.returncode == 2 and result.stderr.startswith(message.format(root=root)), result.stderr
