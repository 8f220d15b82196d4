"""memvir.retrieval.shipped_gallery: a checkpoint's saved test-split index is the evaluation's embeddings, is used only
while its weights and split are the ones it was built from, and the bundled checkpoints ship a fresh one."""

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

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


def test_progress_is_reported_per_batch(checkpoint, split):
    fractions = []
    shipped_gallery.build(checkpoint, split, "glyphs-mini", save=False, batch_size=100,
                             on_progress=fractions.append)
    assert fractions == [100 / 288, 200 / 288, 1.0]


def test_the_command_builds_what_is_missing_and_keeps_what_is_fresh(checkpoint, capsys):
    assert shipped_gallery.main([str(checkpoint)]) == 0
    assert f"{checkpoint}: built gallery/ (there is no gallery/checkpoint.json): 288 items" in capsys.readouterr().out
    assert shipped_gallery.main([str(checkpoint)]) == 0
    assert capsys.readouterr().out == f"{checkpoint}: gallery/ is up to date\n"


@pytest.mark.parametrize("name", BUNDLED)
def test_each_bundled_checkpoint_ships_a_fresh_index_of_its_test_split(name, tmp_path):
    """Fails when a bundled checkpoint is retrained without `make gallery-index`."""
    model = EmbeddingModel.from_pretrained(CHECKPOINTS / name)
    test = load_dataset(model.config["dataset"], image_size=model.config["image_size"]).test
    assert shipped_gallery.staleness(CHECKPOINTS / name, test) is None
    shipped = shipped_gallery.load(CHECKPOINTS / name, test)
    assert len(shipped.index) == len(test) == 12_252
    card = (CHECKPOINTS / name / "README.md").read_text()
    for key in ("recall@1", "map@r", "r_precision"):
        assert f"| {key} | {shipped.metrics[key]:.4f} |" in card
    # The stored rows are float32 vectors of unit length, one per item (no lossy storage).
    vectors = GalleryIndex.load(CHECKPOINTS / name / "gallery", backend="torch")._vectors
    assert vectors.dtype == np.float32 and vectors.shape == (12_252, 128)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # A copy with other weights is not served the shipped index.
    copied = shutil.copytree(CHECKPOINTS / name, tmp_path / name)
    _tiny_model(2).save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", copied / "model.safetensors")
    assert shipped_gallery.load(copied, test) is None
