"""memvir.index.GalleryIndex: build, search against a brute-force reference, save/load round trips, errors."""

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from memvir.index import FAISS_VECTORS_FILE, NUMPY_VECTORS_FILE, SIDECAR_FILE, GalleryIndex, SearchHit

FAISS_INSTALLED = importlib.util.find_spec("faiss") is not None
needs_faiss = pytest.mark.skipif(not FAISS_INSTALLED, reason="faiss is not installed")
BACKENDS = [pytest.param("faiss", marks=needs_faiss), "torch"]


def brute_force(queries, gallery, k):
    """Cosine similarities in float64 and a stable sort (ties by lower index), one query at a time."""
    results = []
    for query in np.asarray(queries, dtype=np.float64):
        similarity = [
            float(np.dot(query, row) / (np.linalg.norm(query) * np.linalg.norm(row)))
            for row in np.asarray(gallery, dtype=np.float64)
        ]
        order = sorted(range(len(similarity)), key=lambda j: (-similarity[j], j))[:k]
        results.append([(j, similarity[j]) for j in order])
    return results


@pytest.fixture
def gallery():
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(40, 8)).astype(np.float32) * rng.uniform(0.5, 3, size=(40, 1)).astype(np.float32)
    labels = rng.integers(0, 6, size=40)
    items = [f"images/{i:03d}.png" for i in range(40)]
    queries = rng.normal(size=(5, 8)).astype(np.float32)
    return embeddings, labels, items, queries


def assert_hits_match(hits, expected, labels, items):
    assert len(hits) == len(expected)
    for row_hits, row_expected in zip(hits, expected, strict=True):
        assert [hit.index for hit in row_hits] == [index for index, _ in row_expected]
        for hit, (index, score) in zip(row_hits, row_expected, strict=True):
            assert isinstance(hit, SearchHit)
            assert isinstance(hit.index, int) and isinstance(hit.score, float)
            assert hit.score == pytest.approx(score, abs=1e-5)
            assert hit.label == (None if labels is None else labels[index])
            assert hit.item == (None if items is None else items[index])


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_matches_brute_force(gallery, backend):
    embeddings, labels, items, queries = gallery
    index = GalleryIndex.build(embeddings, labels=labels, items=items, backend=backend)
    assert len(index) == 40 and index.dim == 8
    assert index.uses_faiss == (backend == "faiss")
    expected = brute_force(queries, embeddings, 7)
    assert_hits_match(index.search(queries, 7), expected, labels.tolist(), items)
    scores, indices = index.search_arrays(queries, 7)
    assert scores.dtype == np.float32 and indices.dtype == np.int64 and indices.shape == (5, 7)
    assert indices.tolist() == [[j for j, _ in row] for row in expected]


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_vector_query_and_whole_gallery(gallery, backend):
    embeddings, _, _, queries = gallery
    index = GalleryIndex.build(torch.from_numpy(embeddings), backend=backend)
    hits = index.search(torch.from_numpy(queries[0]), 40)
    assert_hits_match(hits, brute_force(queries[:1], embeddings, 40), None, None)
    # A gallery item finds itself first.
    assert index.search(embeddings[3] * 5.0, 1)[0][0].index == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_load_round_trip(gallery, tmp_path, backend):
    embeddings, labels, items, queries = gallery
    built = GalleryIndex.build(embeddings, labels=labels, items=items, backend=backend)
    folder = built.save(tmp_path / "nested" / "gallery")
    vectors_file = FAISS_VECTORS_FILE if backend == "faiss" else NUMPY_VECTORS_FILE
    assert sorted(path.name for path in folder.iterdir()) == sorted([SIDECAR_FILE, vectors_file])
    expected = built.search(queries, 5)
    for load_backend in ["faiss", "torch"] if FAISS_INSTALLED else ["torch"]:
        loaded = GalleryIndex.load(folder, backend=load_backend)
        assert loaded.uses_faiss == (load_backend == "faiss")
        assert (len(loaded), loaded.dim, loaded.labels, loaded.items) == (40, 8, labels.tolist(), items)
        hits = loaded.search(queries, 5)
        # The same vectors come back; faiss and torch may round a score differently in the last bit.
        assert [[hit._replace(score=None) for hit in row] for row in hits] == [
            [hit._replace(score=None) for hit in row] for row in expected
        ]
        np.testing.assert_allclose(
            [[hit.score for hit in row] for row in hits], [[hit.score for hit in row] for row in expected], atol=1e-6
        )


def test_string_labels_and_no_items_survive_a_round_trip(gallery, tmp_path):
    embeddings, labels, _, queries = gallery
    names = [f"class {label}" for label in labels]
    loaded = GalleryIndex.load(GalleryIndex.build(embeddings, labels=names).save(tmp_path))
    assert loaded.labels == names and loaded.items is None
    hit = loaded.search(queries[:1], 1)[0][0]
    assert hit.label == names[hit.index] and hit.item is None


def test_without_faiss_the_index_uses_torch_and_saves_numpy(gallery, tmp_path, monkeypatch):
    embeddings, labels, items, queries = gallery
    expected = brute_force(queries, embeddings, 4)
    monkeypatch.setitem(sys.modules, "faiss", None)  # makes `import faiss` raise ImportError
    index = GalleryIndex.build(embeddings, labels=labels, items=items)
    assert not index.uses_faiss
    assert_hits_match(index.search(queries, 4), expected, labels.tolist(), items)
    index.save(tmp_path / "torch")
    assert (tmp_path / "torch" / NUMPY_VECTORS_FILE).is_file()
    assert GalleryIndex.load(tmp_path / "torch").search(queries, 4) == index.search(queries, 4)


@needs_faiss
def test_loading_a_faiss_index_without_faiss_says_what_is_needed(gallery, tmp_path, monkeypatch):
    embeddings, *_ = gallery
    GalleryIndex.build(embeddings, backend="faiss").save(tmp_path)
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match=r"index\.faiss was saved with faiss; reading it needs the faiss-cpu package"):
        GalleryIndex.load(tmp_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_build_and_search_from_gpu_tensors(gallery):
    embeddings, _, _, queries = gallery
    index = GalleryIndex.build(torch.from_numpy(embeddings).cuda())
    hits = index.search(torch.from_numpy(queries).cuda(), 3)
    assert_hits_match(hits, brute_force(queries, embeddings, 3), None, None)


def test_repr_names_size_and_dimension(gallery):
    embeddings, labels, *_ = gallery
    text = repr(GalleryIndex.build(embeddings, labels=labels, backend="torch"))
    assert text == "GalleryIndex(size=40, dim=8, labels=True, faiss=False)"


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_errors(gallery, backend):
    embeddings, *_ = gallery
    index = GalleryIndex.build(embeddings, backend=backend)
    with pytest.raises(ValueError, match="queries have 5 dimensions but the gallery has 8"):
        index.search(np.ones((2, 5)), 1)
    with pytest.raises(ValueError, match="k=41 is out of range: it must be >= 1 and the largest valid value is 40"):
        index.search(embeddings[:1], 41)
    with pytest.raises(ValueError, match="k=0 is out of range"):
        index.search(embeddings[:1], 0)
    with pytest.raises(ValueError, match="NaN or inf in 1 of 1 rows of queries"):
        index.search(np.full(8, np.nan), 1)


def test_build_errors(gallery):
    embeddings, labels, items, _ = gallery
    with pytest.raises(ValueError, match=r"no rows in embeddings"):
        GalleryIndex.build(np.zeros((0, 8)))
    with pytest.raises(ValueError, match=r"embeddings must be 2-D \[N, D\]; got shape \(8,\)"):
        GalleryIndex.build(embeddings[0])
    with pytest.raises(ValueError, match=r"labels must be 1-D with one label per embedding \(40\); got shape \(39,\)"):
        GalleryIndex.build(embeddings, labels=labels[:39])
    with pytest.raises(ValueError, match="labels must be integers or strings; got dtype float64"):
        GalleryIndex.build(embeddings, labels=labels.astype(float))
    with pytest.raises(ValueError, match=r"items must hold one name or path per embedding \(40\); got 3"):
        GalleryIndex.build(embeddings, items=items[:3])
    with pytest.raises(ValueError, match="items must be strings \\(ids or paths\\); got int 7"):
        GalleryIndex.build(embeddings, items=items[:-1] + [7])
    with pytest.raises(ValueError, match=r"backend must be one of"):
        GalleryIndex.build(embeddings, backend="annoy")


def test_loading_a_folder_that_is_not_an_index_names_the_file_expected(tmp_path):
    with pytest.raises(ValueError, match=r"is not a gallery index: expected gallery\.json in it"):
        GalleryIndex.load(tmp_path)
    with pytest.raises(ValueError, match=r"is not a gallery index: expected gallery\.json in it"):
        GalleryIndex.load(tmp_path / "missing")


def saved(gallery, folder, backend="auto"):
    embeddings, labels, items, _ = gallery
    GalleryIndex.build(embeddings, labels=labels, items=items, backend=backend).save(folder)
    return json.loads((folder / SIDECAR_FILE).read_text()), next(p for p in folder.iterdir() if p.name != SIDECAR_FILE)


def test_loading_a_damaged_index_says_what_is_wrong(gallery, tmp_path):
    sidecar, vectors_path = saved(gallery, tmp_path)
    sidecar_path = tmp_path / SIDECAR_FILE

    sidecar_path.write_text("{not json")
    with pytest.raises(ValueError, match=r"gallery\.json is not valid JSON"):
        GalleryIndex.load(tmp_path)

    sidecar_path.write_text(json.dumps({**sidecar, "format": "something else"}))
    with pytest.raises(ValueError, match=r'is not a GalleryIndex sidecar \(no "format": "memvir.GalleryIndex" in it\)'):
        GalleryIndex.load(tmp_path)

    sidecar_path.write_text(json.dumps({**sidecar, "version": 99}))
    with pytest.raises(ValueError, match="has format version 99; this code reads 1"):
        GalleryIndex.load(tmp_path)

    sidecar_path.write_text(json.dumps({**sidecar, "vectors_file": "../elsewhere.bin"}))
    with pytest.raises(ValueError, match=r"names vectors file '\.\./elsewhere\.bin'; expected index\.faiss or vectors"):
        GalleryIndex.load(tmp_path)

    sidecar_path.write_text(json.dumps({**sidecar, "size": 41}))
    with pytest.raises(ValueError, match="holds 40 vectors of dimension 8 but gallery.json says 41 of dimension 8"):
        GalleryIndex.load(tmp_path)

    sidecar_path.write_text(json.dumps({**sidecar, "items": sidecar["items"][:-1]}))
    with pytest.raises(ValueError, match=r"items must hold one name or path per embedding \(40\); got 39"):
        GalleryIndex.load(tmp_path)

    sidecar_path.write_text(json.dumps(sidecar))
    vectors_path.unlink()
    with pytest.raises(ValueError, match=rf"gallery\.json names {vectors_path.name}, which is missing"):
        GalleryIndex.load(tmp_path)


def test_loading_numpy_vectors_of_the_wrong_kind_is_refused(gallery, tmp_path):
    embeddings, *_ = gallery
    GalleryIndex.build(embeddings, backend="torch").save(tmp_path)
    np.save(tmp_path / NUMPY_VECTORS_FILE, embeddings.astype(np.float64))
    with pytest.raises(ValueError, match=r"vectors\.npy holds float64 of shape \(40, 8\), not \[N, D\] float32"):
        GalleryIndex.load(tmp_path)


@needs_faiss
def test_loading_a_faiss_index_of_another_metric_is_refused(gallery, tmp_path):
    import faiss

    saved(gallery, tmp_path, backend="faiss")  # the sidecar names index.faiss
    faiss.write_index(faiss.IndexFlatL2(8), str(tmp_path / FAISS_VECTORS_FILE))
    with pytest.raises(ValueError, match=r"index\.faiss is not an inner-product faiss index"):
        GalleryIndex.load(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# The exact backend "auto" picks
# ---------------------------------------------------------------------------------------------------------------


@needs_faiss
@pytest.mark.parametrize("measured", ["faiss", "torch"])
def test_auto_builds_and_loads_the_exact_index_the_measurement_chose(gallery, tmp_path, monkeypatch, measured):
    import memvir.metrics

    embeddings, labels, items, queries = gallery
    monkeypatch.setattr(memvir.metrics, "_measured_cpu_backend", measured)
    index = GalleryIndex.build(embeddings, labels=labels, items=items)
    assert index.uses_faiss == (measured == "faiss")
    assert_hits_match(index.search(queries, 6), brute_force(queries, embeddings, 6), labels.tolist(), items)
    for backend in ("faiss", "torch"):  # whichever way it was saved, "auto" loads it into the measured choice
        GalleryIndex.build(embeddings, backend=backend).save(tmp_path / backend)
        assert GalleryIndex.load(tmp_path / backend).uses_faiss == (measured == "faiss")
