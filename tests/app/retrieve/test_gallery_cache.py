"""The app never writes into a checkpoint folder that is not one of its runs: a bundled checkpoint (tracked in the
repository) whose shipped index went stale, as a machine rendering another glyphs version finds it, gets its index and
views' figures rebuilt into the app's gallery cache (AppSettings.galleries_dir), which the next start reads instead of
embedding and ranking again; a stale cached copy is rebuilt too, and the cache keeps only the most recently used.
A run's own index is saved beside it (tests/app/retrieve/test_retrieval_service_index.py). Embedding and ranking are
observed by counting calls of memvir.retrieval.evaluation.embed and of the diagnosis functions; references are the
model's own forward pass and brute force over the kept vectors."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import memvir.retrieval.diagnosis.ranking
import memvir.retrieval.diagnosis.verification
from demo.common.settings import AppSettings
from demo.retrieve import galleries, index_builds
from demo.retrieve.service import RetrievalService
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import evaluation, shipped_gallery

BUNDLED = Path(__file__).resolve().parents[3] / "checkpoints"


@pytest.fixture(scope="module")
def split():
    return load_dataset("glyphs-mini").test


@pytest.fixture
def work(monkeypatch):
    """What the app embeds (split sizes) and ranks or pairs (kind, vectors' shape), in order."""
    calls = []
    embed, rank = evaluation.embed, memvir.retrieval.diagnosis.ranking.rank_gallery
    pairs = memvir.retrieval.diagnosis.verification.pair_similarities
    monkeypatch.setattr(evaluation, "embed", lambda model, split, *args, **kwargs: calls.append(
        ("embed", len(split))) or embed(model, split, *args, **kwargs))
    monkeypatch.setattr(memvir.retrieval.diagnosis.ranking, "rank_gallery", lambda *args, **kwargs: calls.append(
        ("rank", args[0].shape)) or rank(*args, **kwargs))
    monkeypatch.setattr(memvir.retrieval.diagnosis.verification, "pair_similarities",
                        lambda *args, **kwargs: calls.append(("pairs", args[0].shape)) or pairs(*args, **kwargs))
    return calls


def _tiny_model(seed: int) -> EmbeddingModel:
    torch.manual_seed(seed)
    return EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                          dataset="glyphs-mini")


def _service(root: Path, **settings) -> RetrievalService:
    return RetrievalService(AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False,
                                        **settings))


def _snapshot(folder: Path) -> dict:
    """Every path under `folder` (and the folder itself): a file's bytes and mtime, a folder's mtime (which changes
    when anything, even a staging folder removed again, is made or dropped in it)."""
    return {str(path.relative_to(folder)): (path.read_bytes() if path.is_file() else None, path.stat().st_mtime_ns)
            for path in [folder, *sorted(folder.rglob("*"))]}


def _cache_folder(root: Path, checkpoint: Path, split) -> Path:
    """The cache's folder named by hand: the start of the sha256 of the weights' files and of the split's
    fingerprint."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        digest.update(f"{name}\0".encode() + (checkpoint / name).read_bytes())
    return root / "data" / "galleries" / f"{digest.hexdigest()[:24]}-{shipped_gallery.split_fingerprint(split)[:24]}"


@pytest.fixture
def stale_bundled(tmp_path, split):
    """A bundled checkpoint shipped with its index and views' figures, whose index reads as built from another
    rendering of the split (its stamp's fingerprint changed, as on a machine that renders another glyphs version)."""
    folder = tmp_path / "checkpoints" / "tiny"
    _tiny_model(0).save_pretrained(folder)
    shipped_gallery.build(folder, split, "glyphs-mini")
    shipped_gallery.build_views(folder, split)
    stamp_path = folder / "gallery" / "checkpoint.json"
    stamp = json.loads(stamp_path.read_text())
    stamp["split_fingerprint"] = "0" * len(stamp["split_fingerprint"])
    stamp_path.write_text(json.dumps(stamp))
    assert shipped_gallery.staleness(folder, split) == "it was built from another version of the dataset's test split"
    return folder


def _start(root: Path) -> RetrievalService:
    """The app's start: a service that warms the default checkpoint up (its index, rankings and pair cosines)."""
    service = _service(root)
    service.warm_up().join(120)
    return service


def test_a_stale_bundled_index_is_rebuilt_into_the_cache_and_read_from_there_next_start(tmp_path, split,
                                                                                        stale_bundled, work):
    before = _snapshot(stale_bundled)
    service = _start(tmp_path)
    checkpoint = service.load_checkpoint(str(stale_bundled))
    gallery = service.test_split_gallery(checkpoint)
    hits = service.search(checkpoint, gallery, split.image(30), k=5, exclude=30).hits
    assert work == [("embed", 288), ("rank", (288, 16)), ("pairs", (288, 16))]
    assert _snapshot(stale_bundled) == before  # not a byte, not a timestamp, not a file more or less

    # The rebuilt index is the model's embeddings of the split, kept under the weights' digest and the split's
    # fingerprint with its views' figures.
    cached = _cache_folder(tmp_path, stale_bundled, split)
    assert sorted(path.name for path in (tmp_path / "data" / "galleries").iterdir()) == [cached.name]
    assert sorted(path.name for path in cached.iterdir()) == [
        "checkpoint.json", "gallery.json", "pairs.npz", "rankings.npz", "vectors.npy", "views.json"]
    model = _tiny_model(0).eval()
    with torch.no_grad():
        reference = model(torch.stack([split[item][0] for item in range(len(split))])).numpy()
    vectors = np.load(cached / "vectors.npy")
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    similarities = reference @ reference[30]
    similarities[30] = -np.inf
    assert [hit.index for hit in hits] == np.argsort(-similarities, kind="stable")[:5].tolist()

    restarted = _start(tmp_path)
    assert work == [("embed", 288), ("rank", (288, 16)), ("pairs", (288, 16))]  # read, neither embedded nor ranked
    checkpoint = restarted.load_checkpoint(str(stale_bundled))
    gallery = restarted.test_split_gallery(checkpoint)
    assert [hit.index for hit in restarted.search(checkpoint, gallery, split.image(30), k=5, exclude=30).hits] == [
        hit.index for hit in hits]
    # The rankings read back are those of the kept vectors: each query's first same-class hit by brute force.
    labels = np.asarray(split.labels)
    scores = vectors.astype(np.float64) @ vectors.astype(np.float64).T
    first_correct = []
    for query in range(len(labels)):
        order = np.lexsort((np.arange(len(labels)), -scores[query]))
        order = order[order != query]
        first_correct.append(int(np.argmax(labels[order] == labels[query])) + 1)
    np.testing.assert_array_equal(restarted.rankings(checkpoint, gallery).first_correct_rank, first_correct)
    assert restarted.pair_similarities(checkpoint, gallery).same_pairs == sum(
        int(count) * (int(count) - 1) // 2 for count in np.bincount(labels))
    assert work == [("embed", 288), ("rank", (288, 16)), ("pairs", (288, 16))]
    assert _snapshot(stale_bundled) == before


def test_the_repositorys_bundled_checkpoints_are_never_written(tmp_path, work, monkeypatch):
    # Their shipped indexes stale, as on a machine that renders another glyphs version: here the test split read for
    # "glyphs" is glyphs-mini's (which also keeps the rebuild to 288 images).
    monkeypatch.setattr(galleries, "load_dataset", lambda name, **options: load_dataset(
        "glyphs-mini" if name == "glyphs" else name, **options))
    before = _snapshot(BUNDLED)
    service = RetrievalService(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=BUNDLED, umap=False))
    service.warm_up().join(300)  # the default checkpoint and its comparison: their indexes and rankings
    assert work.count(("embed", 288)) == 2
    assert len(list((tmp_path / "data" / "galleries").iterdir())) == 2
    assert _snapshot(BUNDLED) == before


def test_a_stale_cached_index_is_rebuilt_too(tmp_path, split, stale_bundled, work):
    _start(tmp_path)
    cached = _cache_folder(tmp_path, stale_bundled, split)
    stamp = json.loads((cached / "checkpoint.json").read_text())
    stamp["split_fingerprint"] = "f" * len(stamp["split_fingerprint"])  # as if built from another rendering
    (cached / "checkpoint.json").write_text(json.dumps(stamp))
    before = _snapshot(stale_bundled)

    _start(tmp_path)
    assert work == [("embed", 288), ("rank", (288, 16)), ("pairs", (288, 16))] * 2
    assert shipped_gallery.staleness(stale_bundled, split, cached) is None
    assert shipped_gallery.views_staleness(stale_bundled, split, gallery_dir=cached) is None
    assert _snapshot(stale_bundled) == before


def test_an_index_of_weights_replaced_since_loading_is_not_kept(tmp_path, split, stale_bundled, work):
    service = _service(tmp_path)
    loaded_before = service.load_checkpoint(str(stale_bundled))
    _tiny_model(1).save_pretrained(stale_bundled)  # new weights after the model was loaded
    service.index(loaded_before, service.test_split_gallery(loaded_before))
    assert work == [("embed", 288)] and not (tmp_path / "data" / "galleries").exists()


def test_the_cache_keeps_the_most_recently_used_galleries(tmp_path, split, work, monkeypatch):
    monkeypatch.setattr(index_builds, "CACHED_GALLERIES_KEPT", 1)
    shared = tmp_path / "shared-models"  # folders visitors may name but the app may not write
    for seed, name in enumerate(("first", "second")):
        _tiny_model(seed).save_pretrained(shared / name)
    service = _service(tmp_path, allowed_folders=(shared,))
    first = service.load_checkpoint(str(shared / "first"))
    service.index(first, service.test_split_gallery(first))
    first_cached = _cache_folder(tmp_path, shared / "first", split)
    assert first_cached.is_dir()
    os.utime(first_cached, (first_cached.stat().st_mtime - 60,) * 2)  # used a minute ago
    second = service.load_checkpoint(str(shared / "second"))
    service.index(second, service.test_split_gallery(second))
    assert [path.name for path in (tmp_path / "data" / "galleries").iterdir()] == [
        _cache_folder(tmp_path, shared / "second", split).name]
    assert not (shared / "first" / "gallery").exists() and not (shared / "second" / "gallery").exists()
