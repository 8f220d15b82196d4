"""memvir.retrieval.query: a drawing searched through the library alone against a bundled checkpoint's shipped
gallery, checked against a brute-force cosine ranking written here and against the app's answer to the same drawing;
and uploaded images indexed as queries are, checked against inputs prepared by hand (inverted ink, transparency on
white paper)."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from demo.common.settings import AppSettings
from demo.retrieve.galleries import thumbnail
from demo.retrieve.service import RetrievalService
from demo.retrieve.tab import RetrieveHandlers
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import index_images, prepare_query, search_image, shipped_gallery

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "checkpoints" / "glyphs-norm-softmax-memvir"
SKETCH_SIZE = 320  # the app's sketchpad (demo.retrieve.tab.SKETCH_SIZE)


def _drawing() -> Image.Image:
    """A 'T' in black strokes on the sketchpad's white RGBA sheet, off centre and smaller than the sheet, as a
    visitor draws it."""
    sheet = Image.new("RGBA", (SKETCH_SIZE, SKETCH_SIZE), (255, 255, 255, 255))
    pen = ImageDraw.Draw(sheet)
    pen.line([(60, 70), (180, 70)], fill=(0, 0, 0, 255), width=14)
    pen.line([(120, 70), (120, 230)], fill=(0, 0, 0, 255), width=14)
    return sheet


@pytest.fixture(scope="module")
def bundled():
    model = EmbeddingModel.from_pretrained(BUNDLED).eval()
    split = load_dataset(model.config["dataset"], image_size=model.config["image_size"]).test
    saved = shipped_gallery.load(BUNDLED, split)
    assert saved is not None, "the bundled checkpoint ships a fresh gallery index (make gallery-index)"
    return model, split, saved.index


def test_a_drawing_searched_through_the_library_is_its_brute_force_ranking(bundled):
    model, _, index = bundled
    found = search_image(model, index, _drawing(), k=8, drawn=True)

    # The query as the model saw it: white ink on black, the ink fitted to the middle of a square frame.
    seen = np.asarray(found.query)
    assert found.query.mode == "L" and seen.shape[0] == seen.shape[1]
    assert seen[0].max() == seen[-1].max() == seen[:, 0].max() == seen[:, -1].max() == 0 and seen.max() == 255
    rows, columns = np.flatnonzero((seen > 32).any(axis=1)), np.flatnonzero((seen > 32).any(axis=0))
    side = seen.shape[0] - 1
    assert abs(rows[0] - (side - rows[-1])) <= 1 and abs(columns[0] - (side - columns[-1])) <= 1

    # Every gallery cosine in float64, sorted by hand.
    query = model.embed(found.query)[0].double().numpy()
    cosines = index.vectors().astype(np.float64) @ query
    expected = sorted(range(len(cosines)), key=lambda row: (-cosines[row], row))[:8]
    assert [hit.index for hit in found.hits] == expected
    assert [hit.score for hit in found.hits] == pytest.approx([cosines[row] for row in expected], abs=1e-5)
    assert [hit.label for hit in found.hits] == [index.labels[row] for row in expected]


def test_the_app_answers_a_drawing_as_the_library_does(bundled, tmp_path):
    model, _, index = bundled
    drawing = _drawing()
    found = search_image(model, index, drawing, k=8, drawn=True)

    sheet = tmp_path / "drawing.png"
    drawing.save(sheet)
    service = RetrievalService(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=BUNDLED.parent, umap=False))
    about, tiles, shown = RetrieveHandlers(service).search_drawing(
        str(BUNDLED), "test split", 8, "", {"background": None, "layers": [], "composite": str(sheet)})
    assert about.startswith("**Checkpoint**"), about
    assert [int(item) for item in re.findall(r'data-item="(\d+)"', tiles)] == [hit.index for hit in found.hits]
    assert np.array_equal(np.asarray(shown), np.asarray(thumbnail(found.query, True, 128)))


def test_an_empty_drawing_is_refused_with_what_to_do(bundled):
    model, _, index = bundled
    blank = Image.new("RGBA", (SKETCH_SIZE, SKETCH_SIZE), (255, 255, 255, 255))
    with pytest.raises(ValueError, match="the drawing is empty: draw a character"):
        search_image(model, index, blank, k=3, drawn=True)
    with pytest.raises(ValueError, match="k must be a whole number of at least 1"):
        search_image(model, index, _drawing(), k=0, drawn=True)


def test_the_gallery_item_searched_with_is_left_out(bundled):
    model, split, index = bundled
    item = 40
    found = search_image(model, index, split.image(item), k=3, exclude=item)
    assert item not in [hit.index for hit in found.hits] and len(found.hits) == 3


def _ink_on_paper(value: int) -> np.ndarray:
    """A dark stroke on light paper, as an uploaded scan is (the glyph models saw light ink on black)."""
    pixels = np.full((24, 24), 230, dtype=np.uint8)
    pixels[4:20, 6 + value: 10 + value] = 20
    return pixels


def test_uploaded_images_are_indexed_as_the_glyph_model_sees_a_query():
    torch.manual_seed(0)
    model = EmbeddingModel(embedding_dim=8, in_channels=1, image_size=32, dataset="glyphs-mini").eval()
    pixels = [_ink_on_paper(value) for value in range(5)]
    index = index_images(model, [Image.fromarray(one) for one in pixels], labels=["a", "a", "b", "b", "c"],
                         items=[f"scan-{value}.png" for value in range(5)], batch_size=2)
    by_hand = model.embed([Image.fromarray(255 - one) for one in pixels]).numpy()  # inverted: light ink on black
    np.testing.assert_allclose(index.vectors(), by_hand, atol=1e-6)
    assert index.labels == ["a", "a", "b", "b", "c"] and index.items[3] == "scan-3.png"


def test_a_photo_models_transparent_upload_lies_on_white_paper():
    torch.manual_seed(0)
    model = EmbeddingModel(embedding_dim=8, in_channels=3, image_size=32, mean=(0.5,) * 3, std=(0.25,) * 3,
                           image_kind="photo", dataset="folder").eval()
    rgba = np.zeros((40, 40, 4), dtype=np.uint8)
    rgba[10:30, 10:30] = (200, 40, 10, 128)  # a half-transparent square on a fully transparent sheet
    alpha = rgba[..., 3:].astype(np.float64) / 255
    on_white = np.round(rgba[..., :3] * alpha + 255 * (1 - alpha)).astype(np.uint8)
    prepared = np.asarray(prepare_query(Image.fromarray(rgba, "RGBA"), model.config))
    assert np.abs(prepared.astype(int) - on_white.astype(int)).max() <= 1
    index = index_images(model, [Image.fromarray(rgba, "RGBA")])
    np.testing.assert_allclose(index.vectors(), model.embed(Image.fromarray(prepared)).numpy(), atol=1e-6)


def test_no_images_to_index_is_refused():
    model = EmbeddingModel(embedding_dim=8, in_channels=1, image_size=32)
    with pytest.raises(ValueError, match="there are no images to index"):
        index_images(model, [])
