"""memvir.retrieval.shipped_gallery: a checkpoint's saved test-split index is the evaluation's embeddings, is used only
while its weights and split are the ones it was built from, and the bundled checkpoints ship a fresh one."""

import copy
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sign_vectors import clustered_sign_vectors

from memvir import cli
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import evaluation, shipped_gallery
from memvir.retrieval.index import GalleryIndex

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"
BUNDLED = ("glyphs-norm-softmax-baseline", "glyphs-norm-softmax-memvir")


def _tiny_model(seed: int) -> EmbeddingModel:
    torch.manual_seed(seed)
    return EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                          dataset="glyphs-mini")


@pytest.fixture(scope="module")
def split():
    return load_dataset("glyphs-mini").test


@pytest.fixture
def checkpoint(tmp_path):
    folder = tmp_path / "tiny"
    _tiny_model(0).save_pretrained(folder)
    return folder


def test_a_built_index_holds_the_evaluations_embeddings_and_metrics(checkpoint, split):
    model = EmbeddingModel.from_pretrained(checkpoint)
    built = shipped_gallery.build(checkpoint, split, "glyphs-mini")
    assert sorted(path.name for path in (checkpoint / "gallery").iterdir()) == [
        "checkpoint.json", "gallery.json", "vectors.npy"]

    embeddings, labels = evaluation.embed(model, split)
    loaded = shipped_gallery.load(checkpoint, split)
    assert loaded is not None and len(loaded.index) == len(split) == 288
    assert loaded.index.labels == split.labels.tolist()
    assert loaded.metrics == built.metrics == evaluation.score(embeddings, labels, "glyphs-mini")
    # Every row is the evaluation's embedding of that item: the whole score matrix of the embeddings computed here
    # against the index is their own Gram matrix (which pins the rows down: 288 embeddings span all 16 dimensions).
    scores, indices = loaded.index.search_arrays(embeddings, len(split))
    gram = (embeddings @ embeddings.T).numpy()
    np.testing.assert_allclose(scores, np.take_along_axis(gram, indices, axis=1), atol=1e-5)
    assert all(sorted(row) == list(range(len(split))) for row in indices.tolist())

    stamp = json.loads((checkpoint / "gallery" / "checkpoint.json").read_text())
    assert stamp["checkpoint_sha256"] == shipped_gallery.checkpoint_digest(checkpoint)
    assert (stamp["dataset"], stamp["split"], stamp["size"]) == ("glyphs-mini", "test", 288)


def test_new_weights_make_the_saved_index_stale(checkpoint, split):
    shipped_gallery.build(checkpoint, split, "glyphs-mini")
    _tiny_model(1).save_pretrained(checkpoint)  # retrained: other weights in the same folder
    assert shipped_gallery.staleness(checkpoint, split) == (
        "it was built from other weights (config.json or model.safetensors changed)")
    assert shipped_gallery.load(checkpoint, split) is None


def test_a_changed_config_makes_the_saved_index_stale(checkpoint, split):
    shipped_gallery.build(checkpoint, split, "glyphs-mini")
    config = json.loads((checkpoint / "config.json").read_text())
    config["std"] = [0.3]
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert shipped_gallery.load(checkpoint, split) is None


def test_another_version_of_the_split_makes_the_saved_index_stale(checkpoint, split):
    shipped_gallery.build(checkpoint, split, "glyphs-mini")
    reprocessed = copy.copy(split)  # the same items and labels through another transform: other model inputs
    reprocessed.transform = lambda pixels: split.transform(pixels) * 0.5
    assert shipped_gallery.staleness(checkpoint, reprocessed) == (
        "it was built from another version of the dataset's test split")
    assert shipped_gallery.load(checkpoint, reprocessed) is None
    assert shipped_gallery.load(checkpoint, split) is not None


def test_a_missing_or_damaged_index_reads_as_none(checkpoint, split):
    assert shipped_gallery.staleness(checkpoint, split) == "there is no gallery/checkpoint.json"
    assert shipped_gallery.load(checkpoint, split) is None
    shipped_gallery.build(checkpoint, split, "glyphs-mini")
    (checkpoint / "gallery" / "vectors.npy").write_bytes(b"not a numpy array")
    assert shipped_gallery.load(checkpoint, split) is None
    (checkpoint / "gallery" / "checkpoint.json").write_text("{")
    assert shipped_gallery.staleness(checkpoint, split).endswith("cannot be read (Expecting property name "
                                                                    "enclosed in double quotes: line 1 column 2 "
                                                                    "(char 1))")


def test_nothing_is_saved_without_save_and_a_rebuild_replaces_the_old_index(checkpoint, split):
    shipped_gallery.build(checkpoint, split, "glyphs-mini", save=False)
    assert not (checkpoint / "gallery").exists()
    shipped_gallery.build(checkpoint, split, "glyphs-mini")
    _tiny_model(1).save_pretrained(checkpoint)
    shipped_gallery.build(checkpoint, split, "glyphs-mini")
    assert shipped_gallery.load(checkpoint, split) is not None
    assert [path.name for path in checkpoint.iterdir() if path.name.startswith(".")] == []  # no staging left


def test_a_gallery_kept_away_from_its_checkpoint_follows_the_same_rules(checkpoint, split, tmp_path):
    config, weights = (checkpoint / "config.json").read_bytes(), (checkpoint / "model.safetensors").read_bytes()
    # The cache's folder name: the start of the sha256 of the weights' files (each name, a NUL, its bytes) and of the
    # split's fingerprint.
    weights_sha256 = hashlib.sha256(b"config.json\0" + config + b"model.safetensors\0" + weights).hexdigest()
    kept = shipped_gallery.gallery_cache_dir(tmp_path / "cache", checkpoint, split)
    assert kept == tmp_path / "cache" / f"{weights_sha256[:24]}-{shipped_gallery.split_fingerprint(split)[:24]}"
    listing = sorted(path.name for path in checkpoint.iterdir())

    built = shipped_gallery.build(checkpoint, split, "glyphs-mini", gallery_dir=kept)
    rankings, _ = shipped_gallery.build_views(checkpoint, split, gallery_dir=kept)
    assert sorted(path.name for path in checkpoint.iterdir()) == listing  # nothing written beside the checkpoint
    assert sorted(path.name for path in kept.iterdir()) == [
        "checkpoint.json", "gallery.json", "pairs.npz", "rankings.npz", "vectors.npy", "views.json"]
    assert json.loads((kept / "checkpoint.json").read_text())["checkpoint_sha256"] == weights_sha256
    assert shipped_gallery.staleness(checkpoint, split) == "there is no gallery/checkpoint.json"
    loaded = shipped_gallery.load(checkpoint, split, kept)
    np.testing.assert_array_equal(loaded.index.vectors(), built.index.vectors())
    np.testing.assert_array_equal(shipped_gallery.load_rankings(checkpoint, split, gallery_dir=kept).average_precision,
                                  rankings.average_precision)
    assert shipped_gallery.load_pairs(checkpoint, split, gallery_dir=kept) is not None

    _tiny_model(1).save_pretrained(checkpoint)  # retrained: the kept copy is stale, as one beside it would be
    assert shipped_gallery.staleness(checkpoint, split, kept) == (
        "it was built from other weights (config.json or model.safetensors changed)")
    assert shipped_gallery.load(checkpoint, split, kept) is None
    assert shipped_gallery.views_staleness(checkpoint, split, gallery_dir=kept).startswith(
        "the index they were computed from cannot be used: it was built from other weights")
    with pytest.raises(ValueError, match=f"{kept} holds no fresh index of {checkpoint} \\(it was built from other"):
        shipped_gallery.build_views(checkpoint, split, gallery_dir=kept)


def test_progress_is_reported_per_batch(checkpoint, split):
    fractions = []
    shipped_gallery.build(checkpoint, split, "glyphs-mini", save=False, batch_size=100,
                             on_progress=fractions.append)
    assert fractions == [100 / 288, 200 / 288, 1.0]


def test_the_command_builds_what_is_missing_and_keeps_what_is_fresh(checkpoint, capsys):
    assert cli.main(["index", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    assert f"{checkpoint}: built gallery/ (there is no gallery/checkpoint.json): 288 items" in out
    assert f"{checkpoint}: computed the views' figures (there is no gallery/views.json): rankings.npz " in out
    assert cli.main(["index", str(checkpoint)]) == 0
    assert capsys.readouterr().out == (f"{checkpoint}: gallery/ is up to date\n"
                                       f"{checkpoint}: the views' figures are up to date\n")


@pytest.mark.parametrize("name", BUNDLED)
def test_each_bundled_checkpoint_ships_a_fresh_index_of_its_test_split(name, tmp_path):
    """Fails when a bundled checkpoint is retrained without `make gallery-index`."""
    model = EmbeddingModel.from_pretrained(CHECKPOINTS / name)
    test = load_dataset(model.config["dataset"], image_size=model.config["image_size"]).test
    assert shipped_gallery.staleness(CHECKPOINTS / name, test) is None
    shipped = shipped_gallery.load(CHECKPOINTS / name, test)
    assert len(shipped.index) == len(test) == 12_250
    card = (CHECKPOINTS / name / "README.md").read_text()
    for key in ("recall@1", "map@r", "r_precision"):
        assert f"| {key} | {shipped.metrics[key]:.4f} |" in card
    # The stored rows are float32 vectors of unit length, one per item (no lossy storage).
    vectors = GalleryIndex.load(CHECKPOINTS / name / "gallery", backend="torch")._vectors
    assert vectors.dtype == np.float32 and vectors.shape == (12_250, 128)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # It ships the views' figures too, fresh: the rankings' mean AP@R and R-Precision are the metrics the
    # evaluation stamped, and the pairs are every pair of the split's labels.
    assert shipped_gallery.views_staleness(CHECKPOINTS / name, test) is None
    rankings = shipped_gallery.load_rankings(CHECKPOINTS / name, test)
    assert len(rankings) == 12_250
    assert rankings.average_precision.mean() == pytest.approx(shipped.metrics["map@r"], abs=1e-9)
    assert rankings.r_precision.mean() == pytest.approx(shipped.metrics["r_precision"], abs=1e-9)
    assert (rankings.first_correct_rank == 1).mean() == pytest.approx(shipped.metrics["recall@1"], abs=1e-9)
    pairs = shipped_gallery.load_pairs(CHECKPOINTS / name, test)
    class_sizes = np.bincount(np.asarray(test.labels))
    assert pairs.same_pairs == int((class_sizes * (class_sizes - 1) // 2).sum())
    assert pairs.same_pairs + pairs.other_pairs == 12_250 * 12_249 // 2
    assert pairs.fine_same.sum() == pairs.same_scores.size == pairs.same_pairs
    # Kept small: the views' files of a checkpoint stay under 4 MB.
    assert sum((CHECKPOINTS / name / "gallery" / file).stat().st_size
               for file in ("views.json", "rankings.npz", "pairs.npz")) < 4e6
    # A copy with other weights is not served the shipped index, nor its figures.
    copied = shutil.copytree(CHECKPOINTS / name, tmp_path / name)
    _tiny_model(2).save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", copied / "model.safetensors")
    assert shipped_gallery.load(copied, test) is None
    assert shipped_gallery.load_rankings(copied, test) is None and shipped_gallery.load_pairs(copied, test) is None


# ---------------------------------------------------------------------------------------------- the views' figures
def _brute_force_rankings(vectors, labels, k):
    """Per query (items whose class has another member): AP@R, R-Precision, first correct rank, the top k, from the
    whole ranking sorted in float64 by (similarity, index), itself left out."""
    vectors = np.asarray(vectors, dtype=np.float64)
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    labels = np.asarray(labels)
    rows = []
    for query in range(len(labels)):
        similarity = vectors @ vectors[query]
        order = np.lexsort((np.arange(len(labels)), -similarity))
        order = order[order != query]
        correct = labels[order] == labels[query]
        same = int(correct.sum())
        if same == 0:
            continue
        ranks = np.arange(1, same + 1)
        rows.append((query, float((np.cumsum(correct[:same]) / ranks * correct[:same]).sum() / same),
                     correct[:same].mean(), int(np.argmax(correct)) + 1, order[:k].tolist()))
    return rows




@pytest.fixture
def with_views(checkpoint, split):
    """A checkpoint whose saved index holds `clustered_sign_vectors`, with its views' figures computed."""
    shipped_gallery.build(checkpoint, split, "glyphs-mini")
    np.save(checkpoint / "gallery" / "vectors.npy", clustered_sign_vectors(np.asarray(split.labels)))
    shipped_gallery.build_views(checkpoint, split)
    return checkpoint


def test_the_saved_views_figures_equal_a_fresh_computation_and_brute_force(with_views, split):
    from memvir.retrieval.diagnosis.ranking import rank_gallery
    from memvir.retrieval.diagnosis.verification import pair_similarities

    folder = with_views / "gallery"
    assert {"views.json", "rankings.npz", "pairs.npz"} <= {path.name for path in folder.iterdir()}
    vectors = GalleryIndex.load(folder, backend="torch")._vectors
    labels = split.labels.tolist()
    loaded = shipped_gallery.load_rankings(with_views, split)
    fresh = rank_gallery(vectors, labels, k=shipped_gallery.RANKED_K, missed=shipped_gallery.MISSED_KEPT)
    assert len(loaded) == len(fresh) == 288
    assert [loaded.row(i) for i in range(len(loaded))] == [fresh.row(i) for i in range(len(fresh))]
    for name in ("query", "label", "same_class", "first_correct_rank", "average_precision", "r_precision",
                 "missed", "missed_ranks"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(fresh, name))
    reference = _brute_force_rankings(vectors, labels, shipped_gallery.RANKED_K)
    np.testing.assert_array_equal(loaded.query, [row[0] for row in reference])
    np.testing.assert_allclose(loaded.average_precision, [row[1] for row in reference], atol=1e-6)
    np.testing.assert_allclose(loaded.r_precision, [row[2] for row in reference], atol=1e-12)
    np.testing.assert_array_equal(loaded.first_correct_rank, [row[3] for row in reference])

    pairs = shipped_gallery.load_pairs(with_views, split)
    fresh_pairs = pair_similarities(vectors, labels, max_fmr=shipped_gallery.MAX_FMR)
    for name in ("fine_same", "fine_other", "same_scores", "other_top"):
        assert getattr(pairs, name).dtype == getattr(fresh_pairs, name).dtype
        np.testing.assert_array_equal(getattr(pairs, name), getattr(fresh_pairs, name))
    assert (pairs.same_pairs, pairs.other_pairs, pairs.top_floor, pairs.max_fmr) == (
        fresh_pairs.same_pairs, fresh_pairs.other_pairs, fresh_pairs.top_floor, fresh_pairs.max_fmr)
    # The threshold at FMR 0.01 from every pair's float64 cosine: just above the other-class cosine at place
    # floor(1% of them) + 1 from the top, so that the pairs tied with it do not match either.
    unit = vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    upper = np.triu_indices(len(labels), k=1)
    cosines = (unit @ unit.T)[upper]
    same = np.asarray(labels)[upper[0]] == np.asarray(labels)[upper[1]]
    other = np.sort(cosines[~same])[::-1]
    last_refused = other[int(np.floor(0.01 * other.size))]
    point = pairs.threshold_at_fmr(0.01)
    assert last_refused < point.threshold and point.threshold == pytest.approx(last_refused, abs=1e-6)
    assert point.false_matches == int((other > last_refused).sum())
    assert point.false_non_matches == int((cosines[same] <= last_refused).sum())


def test_sorted_cosines_are_kept_exactly_through_their_steps():
    rng = np.random.default_rng(0)
    tricky = np.array([-1.0, -0.5, -0.0, 0.0, 1e-30, 0.3, 0.3, np.float32(0.3) + np.float32(1e-7), 1.0,
                       np.float32(1.0000001)], dtype=np.float32)
    spread = rng.uniform(-1, 1, 50_000).astype(np.float32)
    for values in (np.zeros(0, np.float32), np.float32([0.5]), np.sort(tricky), np.sort(spread)):
        decoded = shipped_gallery._float32_from_steps(shipped_gallery._sorted_float32_steps(values))
        assert decoded.dtype == np.float32
        np.testing.assert_array_equal(decoded, values)
        np.testing.assert_array_equal(np.signbit(decoded), np.signbit(values))


def test_stale_views_figures_are_not_read_and_the_log_says_why(with_views, split, caplog):
    caplog.set_level("INFO", logger="memvir.retrieval.shipped_gallery")
    assert shipped_gallery.views_staleness(with_views, split) is None
    # Other settings than those saved.
    assert "other settings" in shipped_gallery.views_staleness(with_views, split, ranked_k=4)
    assert shipped_gallery.load_pairs(with_views, split, max_fmr=0.01) is None
    # Another format version.
    stamp_path = with_views / "gallery" / "views.json"
    stamp = json.loads(stamp_path.read_text())
    stamp_path.write_text(json.dumps({**stamp, "version": 0}))
    assert shipped_gallery.load_rankings(with_views, split) is None
    assert "of format version 0, not 1" in caplog.text
    stamp_path.write_text(json.dumps(stamp))
    assert shipped_gallery.load_rankings(with_views, split) is not None
    # Another index of the same weights (rebuilt elsewhere, rows not bit for bit the same).
    vectors_path = with_views / "gallery" / "vectors.npy"
    original = vectors_path.read_bytes()
    np.save(vectors_path, np.load(vectors_path)[::-1].copy())
    assert shipped_gallery.views_staleness(with_views, split) == "they were computed from another index of the gallery"
    vectors_path.write_bytes(original)
    # New weights: the index goes stale, and the figures with it.
    _tiny_model(1).save_pretrained(with_views)
    caplog.clear()
    assert shipped_gallery.load_rankings(with_views, split) is None
    assert shipped_gallery.load_pairs(with_views, split) is None
    assert "it was built from other weights" in caplog.text and "computing them" in caplog.text
    # The command recomputes both, and says so.
    assert cli.main(["index", str(with_views)]) == 0
    assert shipped_gallery.load_rankings(with_views, split) is not None


@pytest.mark.parametrize("damage", ["truncated", "not a zip", "stamp cut"])
def test_damaged_views_files_are_ignored_with_a_log_line(with_views, split, caplog, damage):
    caplog.set_level("INFO", logger="memvir.retrieval.shipped_gallery")
    folder = with_views / "gallery"
    if damage == "truncated":
        data = (folder / "pairs.npz").read_bytes()
        (folder / "pairs.npz").write_bytes(data[: len(data) // 2])
    elif damage == "not a zip":
        (folder / "rankings.npz").write_bytes(b"not a zip")
        (folder / "pairs.npz").write_bytes(b"not a zip")
    else:
        (folder / "views.json").write_text('{"format": "memvir.Gallery')
    # One damaged file and the figures are all recomputed: they were computed together.
    assert shipped_gallery.load_rankings(with_views, split) is None
    assert shipped_gallery.load_pairs(with_views, split) is None
    assert "are not used" in caplog.text and ("damaged" in caplog.text or "cannot be read" in caplog.text)


def test_damaged_arrays_under_a_matching_stamp_are_ignored_with_a_log_line(with_views, split, caplog):
    """A file whose stamped sha256 was rewritten to match (so only reading it can tell): no crash, a warning."""
    caplog.set_level("INFO", logger="memvir.retrieval.shipped_gallery")
    folder = with_views / "gallery"
    (folder / "pairs.npz").write_bytes(b"PK\x03\x04 not really a zip")
    stamp = json.loads((folder / "views.json").read_text())
    stamp["files"]["pairs.npz"] = shipped_gallery._file_digest(folder / "pairs.npz")
    (folder / "views.json").write_text(json.dumps(stamp))
    assert shipped_gallery.load_pairs(with_views, split) is None
    assert "pairs.npz cannot be read" in caplog.text
    assert shipped_gallery.load_rankings(with_views, split) is not None
