"""The Retrieve tab's threshold view, its similarity cut-off and the gallery export, through the service and the
handlers, against brute-force references written here: every pair of the shipped gallery's vectors visited in float64
numpy, the threshold found by trying each distinct other-class cosine from the lowest up, and the files read back.

The checkpoint is an untrained glyphs-mini model whose shipped gallery index holds +-1/4 vectors in 16 dimensions:
their cosines are exact multiples of 1/8 in float32 and float64 alike, so ties are everywhere and are ties for the
app and the reference. Nothing is timed."""

import html
import math
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sign_vectors import clustered_sign_vectors

from demo.common.settings import AppSettings
from demo.retrieve import tab, threshold
from demo.retrieve.service import RetrievalError, RetrievalService
from demo.retrieve.tiles import Tile, caption, tiles_html, with_cutoff
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import prepare_query


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(service, checkpoint folder, gallery vectors [float64], labels)."""
    from memvir.retrieval import shipped_gallery

    root = tmp_path_factory.mktemp("threshold-export")
    split = load_dataset("glyphs-mini").test
    torch.manual_seed(0)
    folder = root / "checkpoints" / "memvir"
    model = EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                           dataset="glyphs-mini")
    model.save_pretrained(folder)
    shipped_gallery.build(folder, split, "glyphs-mini", model=model)
    labels = np.asarray(split.labels)
    vectors = clustered_sign_vectors(labels)
    np.save(folder / "gallery" / "vectors.npy", vectors)
    service = RetrievalService(AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False))
    return service, str(folder), vectors.astype(np.float64), labels


def reference_pairs(vectors, labels):
    same, other = [], []
    for i in range(len(vectors)):
        similarity = vectors[i + 1:] @ vectors[i]
        same_class = labels[i + 1:] == labels[i]
        same.extend(similarity[same_class])
        other.extend(similarity[~same_class])
    return np.array(same), np.array(other)


def reference_point(same, other, fmr):
    """(threshold, false matches, false non-matches) of the lowest threshold whose FMR is at most `fmr`."""
    for value in np.unique(other):
        if (other > value).sum() / len(other) <= fmr:
            cut = float(np.nextafter(np.float32(value), np.float32(np.inf)))
            return cut, int((other >= cut).sum()), int((same < cut).sum())
    raise AssertionError("no threshold")


def test_the_threshold_view_shows_the_brute_force_fnmr_at_each_fmr(served):
    service, choice, vectors, labels = served
    same, other = reference_pairs(vectors, labels)
    handlers = tab.RetrieveHandlers(service)
    for fmr in (0.001, 0.01, 0.1):
        summary, figure = handlers.show_threshold(choice, tab.TEST_SPLIT, fmr)
        expected, false_matches, false_non_matches = reference_point(same, other, fmr)
        shown = re.search(r"\*\*FNMR at FMR ([0-9.e-]+): ([0-9.]+)\*\*.*?: ([0-9,]+) of its ([0-9,]+) same-class "
                          r"pairs fall below the threshold, cosine ([0-9.-]+), which ([0-9,]+) of its ([0-9,]+) "
                          r"other-class", summary)
        assert shown, summary
        assert float(shown[1]) == fmr
        assert shown[2] == f"{false_non_matches / len(same):.4f}"
        assert [int(shown[i].replace(",", "")) for i in (3, 4, 6, 7)] == [false_non_matches, len(same),
                                                                         false_matches, len(other)]
        assert shown[5] == f"{expected:.4f}"
        table = dict(re.findall(r"^\| ([0-9.e-]+) \| ([0-9.-]+) \|", summary, re.MULTILINE))
        assert set(table) == {"0.001", "0.01", "0.1"}
        # The histogram: each kind's pairs per bin of 1/32, as numpy counts them.
        edges = np.linspace(-1, 1, threshold.BINS + 1)
        bars = {trace.name.split(" (")[0]: np.array(trace.customdata) for trace in figure.data}
        np.testing.assert_array_equal(bars["same class"], np.histogram(same, edges)[0])
        np.testing.assert_array_equal(bars["other class"], np.histogram(other, edges)[0])
        assert figure.layout.shapes[0].x0 == pytest.approx(expected)


def test_pair_cosines_are_computed_once_per_gallery_index(served):
    service, choice, _, _ = served
    checkpoint = service.load_checkpoint(choice)
    gallery = service.test_split_gallery(checkpoint)
    assert service.pair_similarities(checkpoint, gallery) is service.pair_similarities(checkpoint, gallery)


@pytest.mark.parametrize(("value", "shown"), [(0.5964897871017456, "0.5965"), (0.5, "0.5000"), (0.1234, "0.1234"),
                                              (0.12340001, "0.1235"), (-0.12345, "-0.1234"), (0.99999, "1.0000")])
def test_a_threshold_fills_the_cut_off_box_rounded_up_to_four_decimals(value, shown):
    assert threshold.cutoff_for(value) == shown


def test_the_cut_off_s_figures_and_the_threshold_as_cut_off(served):
    service, choice, vectors, labels = served
    same, other = reference_pairs(vectors, labels)
    handlers = tab.RetrieveHandlers(service)
    note, cutoff = handlers.threshold_as_cutoff(choice, tab.TEST_SPLIT, 0.01)
    expected, false_matches, false_non_matches = reference_point(same, other, 0.01)
    # rounded up to 4 decimals by hand: the cut-off's FMR stays at most the threshold's
    assert re.fullmatch(r"-?\d\.\d{4}", cutoff), cutoff
    assert float(cutoff) - 1e-4 < expected <= float(cutoff) and f"Cut-off set to {cutoff}," in note
    summary, _ = handlers.show_threshold(choice, tab.TEST_SPLIT, 0.01, 0.5)
    at = re.search(r"\*\*At the cut-off 0.5000\*\*: FMR ([0-9.]+) \(([0-9,]+) of ([0-9,]+) pairs\) · FNMR ([0-9.]+) "
                   r"\(([0-9,]+) of ([0-9,]+) pairs\)", summary)
    assert at, summary
    # 0.5 is itself the cosine of many pairs: they match (>=).
    assert (other == 0.5).sum() > 1 and (same == 0.5).sum() > 1
    assert int(at[2].replace(",", "")) == int((other >= 0.5).sum())
    assert int(at[5].replace(",", "")) == int((same < 0.5).sum())
    # Below the threshold at the highest FMR offered, the other-class pairs are counted only by bin.
    assert (other >= 0.25).mean() > 0.1
    summary, _ = handlers.show_threshold(choice, tab.TEST_SPLIT, 0.01, 0.25)
    assert "**At the cut-off 0.2500**: FMR above 0.1 (more false matches than this view counts one by one)" in summary
    assert f"FNMR {(same < 0.25).mean():.4f} ({int((same < 0.25).sum()):,} of {len(same):,} pairs)" in summary


def test_result_tiles_below_the_cut_off_are_dimmed_at_their_ranks(served):
    service, choice, vectors, labels = served
    checkpoint = service.load_checkpoint(choice)
    gallery = service.test_split_gallery(checkpoint)
    item = 7
    query = checkpoint.model.embed(prepare_query(gallery.image(item), checkpoint.config))[0]
    query = query.numpy().astype(np.float64)
    scores = vectors @ (query / np.linalg.norm(query))
    scores[item] = -np.inf
    order = np.lexsort((np.arange(len(scores)), -scores))[:8]
    cut = float((scores[order[3]] + scores[order[4]]) / 2)  # between the 4th and 5th hit: four stay bright
    picked = {"sample": [item], "gallery": gallery.key}
    event = type("Select", (), {"index": 0})()
    handlers = tab.RetrieveHandlers(service)
    about, tiles, _ = handlers.search_gallery_item(choice, tab.TEST_SPLIT, 8, picked, cutoff=cut, evt=event)
    alts = [html.unescape(alt) for alt in re.findall(r'alt="([^"]*)"', tiles)]
    assert [alt.split(" ")[0] for alt in alts] == [f"#{rank}" for rank in range(1, 9)]  # every hit, in rank order
    assert [alt.endswith("below the cut-off") for alt in alts] == [False] * 4 + [True] * 4
    assert tiles.count("<figure") == 8
    assert len(re.findall(r'<figure class="result-tile[^"]* below-cutoff" style="opacity', tiles)) == 4
    assert f"4 of 8 below the cut-off {cut:.4f}, dimmed" in about
    _, plain, _ = handlers.search_gallery_item(choice, tab.TEST_SPLIT, 8, picked, evt=event)
    assert "below the cut-off" not in plain


def test_a_tile_at_the_cut_off_itself_is_kept():
    image = Image.new("L", (4, 4))
    tiles = [Tile(image, rank, score, "a", True) for rank, score in enumerate((0.5, 0.25, 0.2499999), 1)]
    marked = with_cutoff(tiles, 0.25)
    assert [tile.below_cutoff for tile in marked] == [False, False, True]
    assert caption(marked[2]).endswith("below the cut-off") and "below" not in tiles_html(marked[:2])
    assert with_cutoff(tiles, None) == tiles


@pytest.mark.parametrize("call, words", [
    (lambda h, c: h.show_threshold(c, tab.TEST_SPLIT, 0.5), "choose a false match rate of 0.001, 0.01, 0.1"),
    (lambda h, c: h.show_threshold(c, tab.TEST_SPLIT, 0.01, "2"), "cut-off must be a cosine from -1 to 1"),
    (lambda h, c: h.threshold_as_cutoff(c, tab.TEST_SPLIT, "x"), "choose a false match rate"),
])
def test_bad_input_is_a_message(served, call, words):
    service, choice, _, _ = served
    with pytest.warns(UserWarning):
        message = call(tab.RetrieveHandlers(service), choice)[0]
    assert message.startswith("⚠️") and words in message


def test_an_unlabelled_gallery_has_no_pairs_to_tell_apart(served, tmp_path):
    service, choice, _, _ = served
    checkpoint = service.load_checkpoint(choice)
    paths = []
    for index in range(3):
        paths.append(tmp_path / f"{index}.png")
        load_dataset("glyphs-mini").test.image(index).save(paths[-1])
    gallery = service.uploaded_gallery(paths)
    with pytest.raises(RetrievalError, match="this gallery has no classes"):
        service.pair_similarities(checkpoint, gallery)
    with pytest.raises(RetrievalError, match="no classes to export"):
        service.export(checkpoint, gallery)


def test_the_export_holds_the_gallery_s_embeddings_labels_and_thumbnails(served, tmp_path):
    service, choice, vectors, labels = served
    handlers = tab.RetrieveHandlers(service)
    note, zip_box, npz_box = handlers.export_gallery(choice, tab.TEST_SPLIT)
    assert zip_box["visible"] and npz_box["visible"]  # shown once they hold a file
    zip_path, npz_path = zip_box["value"], npz_box["value"]
    class_names = load_dataset("glyphs-mini").test.class_names
    with np.load(npz_path) as saved:
        np.testing.assert_array_equal(saved["embeddings"], vectors.astype(np.float32))
        np.testing.assert_array_equal(saved["labels"], labels)
        assert saved["class_names"].tolist() == class_names
    with zipfile.ZipFile(zip_path) as archive:
        files = {Path(name).name: archive.read(name) for name in archive.namelist()}
    assert set(files) == {"tensors.tsv", "metadata.tsv", "sprite.png", "projector_config.pbtxt"}
    tensors = np.array([[float(x) for x in row.split("\t")] for row in files["tensors.tsv"].decode().splitlines()])
    np.testing.assert_array_equal(tensors, vectors)
    metadata = files["metadata.tsv"].decode().splitlines()
    assert metadata[0] == "label\tclass" and metadata[1:] == [f"{label}\t{class_names[label]}" for label in labels]
    (tmp_path / "sprite.png").write_bytes(files["sprite.png"])
    side = math.ceil(math.sqrt(len(labels)))
    assert Image.open(tmp_path / "sprite.png").size == (side * 32, side * 32)
    assert re.findall(r"single_image_dim: (\d+)", files["projector_config.pbtxt"].decode()) == ["32", "32"]
    assert Path(zip_path).name in note and Path(npz_path).name in note
    again = handlers.export_gallery(choice, tab.TEST_SPLIT)
    assert (again[1]["value"], again[2]["value"]) == (zip_path, npz_path)  # written once, then offered again


def test_exports_are_pruned_with_the_checkpoint_zips(served, tmp_path):
    """The downloads folder's size limit covers the exports: past it, the least recently used go, the files just
    asked for stay."""
    _, choice, _, _ = served
    checkpoints = Path(choice).parent
    service = RetrievalService(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=checkpoints, umap=False,
                                           max_downloads_bytes=1))
    checkpoint = service.load_checkpoint(choice)
    zip_path, npz_path = service.export(checkpoint, service.test_split_gallery(checkpoint))
    assert zip_path.is_file() and npz_path.is_file()  # over the limit alone, but just asked for
    checkpoint_zip = service.download_zip(choice)
    assert checkpoint_zip.is_file() and not zip_path.exists() and not npz_path.exists()
