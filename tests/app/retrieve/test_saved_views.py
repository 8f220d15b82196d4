"""RetrievalService reads a checkpoint's saved views' figures (memvir.retrieval.shipped_gallery) for its own test
split instead of computing them, computes them where none are saved or they are stale or damaged (logging why), and
its warm-up then ranks nothing. References: brute force over the saved vectors in float64."""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from sign_vectors import clustered_sign_vectors

import memvir.retrieval.diagnosis.ranking
import memvir.retrieval.diagnosis.verification
from demo.common.settings import AppSettings
from demo.retrieve import tab
from demo.retrieve.service import RetrievalService
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import shipped_gallery


@pytest.fixture
def saved(tmp_path):
    """Two glyphs-mini checkpoints ("memvir", whose card says MemVir, and "baseline") with their test split's index
    and views' figures saved beside them; a service over them."""
    split = load_dataset("glyphs-mini").test
    folders = {}
    for seed, name in ((0, "memvir"), (1, "baseline")):
        torch.manual_seed(seed)
        folder = tmp_path / "checkpoints" / name
        model = EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                               dataset="glyphs-mini")
        model.save_pretrained(folder)
        shipped_gallery.build(folder, split, "glyphs-mini", model=model)
        np.save(folder / "gallery" / "vectors.npy", clustered_sign_vectors(np.asarray(split.labels), seed))
        shipped_gallery.build_views(folder, split)
        folders[name] = str(folder)
    card = Path(folders["memvir"]) / "README.md"
    card.write_text(card.read_text(encoding="utf-8") + "\n| MemVir | N=5, M=100 |\n", encoding="utf-8")
    service = RetrievalService(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints",
                                           umap=False))
    return service, folders


@pytest.fixture
def computed(monkeypatch):
    """The shapes of every gallery the service ranks or pairs itself (not read from a saved file)."""
    calls = []
    real_rank = memvir.retrieval.diagnosis.ranking.rank_gallery
    real_pairs = memvir.retrieval.diagnosis.verification.pair_similarities
    monkeypatch.setattr(memvir.retrieval.diagnosis.ranking, "rank_gallery",
                        lambda *args, **kwargs: calls.append(("rank", args[0].shape)) or real_rank(*args, **kwargs))
    monkeypatch.setattr(memvir.retrieval.diagnosis.verification, "pair_similarities",
                        lambda *args, **kwargs: calls.append(("pairs", args[0].shape)) or real_pairs(*args, **kwargs))
    return calls


def _brute_force(folder):
    """(AP@R, first correct rank) per item of the saved index, itself left out; the threshold at FMR 0.01's last
    refused other-class cosine."""
    vectors = np.load(Path(folder) / "gallery" / "vectors.npy").astype(np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    labels = np.asarray(load_dataset("glyphs-mini").test.labels)
    similarity = vectors @ vectors.T
    figures = []
    for query in range(len(labels)):
        order = np.lexsort((np.arange(len(labels)), -similarity[query]))
        order = order[order != query]
        correct = labels[order] == labels[query]
        same = int(correct.sum())
        figures.append(((np.cumsum(correct[:same]) / np.arange(1, same + 1) * correct[:same]).sum() / same,
                        int(np.argmax(correct)) + 1))
    upper = np.triu_indices(len(labels), k=1)
    other = np.sort(similarity[upper][labels[upper[0]] != labels[upper[1]]])[::-1]
    return np.array(figures), other[int(np.floor(0.01 * other.size))]


def test_the_saved_figures_are_read_not_computed(saved, computed):
    service, folders = saved
    checkpoint = service.load_checkpoint(folders["memvir"])
    gallery = service.test_split_gallery(checkpoint)
    rankings = service.rankings(checkpoint, gallery)
    pairs = service.pair_similarities(checkpoint, gallery)
    assert computed == []
    figures, last_refused = _brute_force(folders["memvir"])
    np.testing.assert_allclose(rankings.average_precision, figures[:, 0], atol=1e-9)
    np.testing.assert_array_equal(rankings.first_correct_rank, figures[:, 1])
    threshold = pairs.threshold_at_fmr(0.01).threshold
    assert last_refused < threshold and threshold == pytest.approx(last_refused, abs=1e-6)
    # The views draw from them as from computed ones.
    handlers = tab.RetrieveHandlers(service)
    _, rows = handlers.show_hardest(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, "map@r", True)
    assert rows.count('class="hard-row"') > 0
    assert computed == []


def test_warming_up_computes_nothing_the_checkpoints_saved(saved, computed):
    service, folders = saved
    service.warm_up().join(120)
    assert computed == []
    handlers = tab.RetrieveHandlers(service)
    handlers.show_per_class(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, True)
    handlers.show_threshold(folders["memvir"], tab.TEST_SPLIT)
    assert computed == []


def test_stale_or_damaged_figures_are_computed_and_the_log_says_why(saved, computed, caplog):
    caplog.set_level(logging.INFO)
    service, folders = saved
    # The baseline's rankings file damaged, the MemVir checkpoint's figures of another format version.
    (Path(folders["baseline"]) / "gallery" / "rankings.npz").write_bytes(b"damaged")
    stamp = Path(folders["memvir"]) / "gallery" / "views.json"
    stamp.write_text(stamp.read_text().replace('"version": 1', '"version": 0'))
    for name in ("memvir", "baseline"):
        checkpoint = service.load_checkpoint(folders[name])
        gallery = service.test_split_gallery(checkpoint)
        figures, _ = _brute_force(folders[name])
        np.testing.assert_allclose(service.rankings(checkpoint, gallery).average_precision, figures[:, 0],
                                   atol=1e-9)
    service.pair_similarities(service.load_checkpoint(folders["memvir"]), gallery)
    assert computed == [("rank", (288, 16)), ("rank", (288, 16)), ("pairs", (288, 16))]
    assert "rankings.npz is missing or damaged" in caplog.text
    assert "of format version 0, not 1" in caplog.text


def test_an_uploaded_gallery_is_computed(saved, computed, tmp_path):
    import zipfile

    service, folders = saved
    split = load_dataset("glyphs-mini").test
    archive = tmp_path / "classes.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        for index in range(24):
            path = tmp_path / f"{index}.png"
            split.image(index).save(path)
            bundle.write(path, f"{split.class_names[split.labels[index]]}/{index}.png")
    checkpoint = service.load_checkpoint(folders["memvir"])
    service.rankings(checkpoint, service.uploaded_gallery([archive]))
    assert [kind for kind, _ in computed] == ["rank"]
