"""memvir.retrieval.index.GalleryIndex: build, search against a brute-force reference, save/load round trips, errors."""

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from memvir.retrieval.index import FAISS_VECTORS_FILE, NUMPY_VECTORS_FILE, SIDECAR_FILE, GalleryIndex, SearchHit

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


@needs_faiss
def test_loading_a_faiss_index_of_another_type_is_refused(gallery, tmp_path):
    import faiss

    saved(gallery, tmp_path, backend="faiss")
    faiss.write_index(faiss.IndexIDMap(faiss.IndexFlatIP(8)), str(tmp_path / FAISS_VECTORS_FILE))
    with pytest.raises(ValueError, match=r"index\.faiss holds a faiss IndexIDMap; GalleryIndex\.save writes only flat"):
        GalleryIndex.load(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# The exact backend "auto" picks
# ---------------------------------------------------------------------------------------------------------------


@needs_faiss
@pytest.mark.parametrize("measured", ["faiss", "torch"])
def test_auto_builds_and_loads_the_exact_index_the_measurement_chose(gallery, tmp_path, monkeypatch, measured):
    import memvir.retrieval.knn

    embeddings, labels, items, queries = gallery
    monkeypatch.setattr(memvir.retrieval.knn, "_measured_cpu_backend", measured)
    index = GalleryIndex.build(embeddings, labels=labels, items=items)
    assert index.uses_faiss == (measured == "faiss") and index.kind == "exact"
    assert_hits_match(index.search(queries, 6), brute_force(queries, embeddings, 6), labels.tolist(), items)
    for backend in ("faiss", "torch"):  # whichever way it was saved, "auto" loads it into the measured choice
        GalleryIndex.build(embeddings, backend=backend).save(tmp_path / backend)
        assert GalleryIndex.load(tmp_path / backend).uses_faiss == (measured == "faiss")


# ---------------------------------------------------------------------------------------------------------------
# Approximate kinds: IVF-Flat and HNSW
# ---------------------------------------------------------------------------------------------------------------

APPROXIMATE = [pytest.param("ivf", marks=needs_faiss), pytest.param("hnsw", marks=needs_faiss)]


def clustered_gallery(seed, size=4000, num_queries=200, per_class=10, latent=8, dim=32):
    """(gallery, queries): classes of images that vary along a few directions, as trained embeddings do."""
    rng = np.random.default_rng(seed)
    classes = rng.normal(size=(size // per_class, latent))
    item_class = np.concatenate([np.arange(size) % len(classes), rng.integers(0, len(classes), size=num_queries)])
    points = classes[item_class] + 0.4 * rng.normal(size=(len(item_class), latent))
    points = points @ rng.normal(size=(latent, dim)) + 0.1 * rng.normal(size=(len(item_class), dim))
    return points[:size].astype(np.float32), points[size:].astype(np.float32)


def exact_neighbours(queries, gallery, k):
    """Brute force in float64, ties by lower index (the vectorised twin of ``brute_force`` above)."""
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    similarity = queries.astype(np.float64) @ gallery.T.astype(np.float64)
    return np.argsort(-similarity, axis=1, kind="stable")[:, :k]


def recall(found, exact):
    return float(
        np.mean([len(set(row) & set(truth)) / exact.shape[1] for row, truth in zip(found, exact, strict=True)])
    )


# Measured with the defaults on these sets (4 seeds): IVF 0.96-0.97, HNSW 1.00. The bounds leave room for faiss's
# multi-threaded builds, which need not be identical from run to run.
RECALL_AT_10_BOUND = {"ivf": 0.9, "hnsw": 0.95}


@pytest.mark.parametrize("kind", APPROXIMATE)
def test_approximate_recall_at_10_on_a_clustered_set(kind):
    gallery, queries = clustered_gallery(0)
    index = GalleryIndex.build(gallery, kind=kind)
    assert index.kind == kind and index.uses_faiss and len(index) == 4000
    scores, found = index.search_arrays(queries, 10)
    assert recall(found, exact_neighbours(queries, gallery, 10)) >= RECALL_AT_10_BOUND[kind]
    # What is found is scored exactly: the vectors are kept whole, only the scan is partial.
    unit_queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    unit_gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", unit_queries, unit_gallery[found]), atol=1e-5)
    assert (np.diff(scores, axis=1) <= 0).all()


@needs_faiss
def test_ivf_probing_every_cell_is_exact():
    gallery, queries = clustered_gallery(1, size=1000)
    index = GalleryIndex.build(gallery, kind="ivf", nlist=8, nprobe=8)
    np.testing.assert_array_equal(index.search_arrays(queries, 10)[1], exact_neighbours(queries, gallery, 10))


@needs_faiss
def test_ivf_and_hnsw_defaults_and_options():
    gallery, _ = clustered_gallery(2, size=4000)
    assert GalleryIndex.build(gallery, kind="ivf").options == {"nlist": 102, "nprobe": 6}  # 4000 / 39 cells, / 16
    assert GalleryIndex.build(gallery[:200], kind="ivf").options == {"nlist": 5, "nprobe": 1}
    assert GalleryIndex.build(gallery, kind="ivf", nlist=20, nprobe=3).options == {"nlist": 20, "nprobe": 3}
    assert GalleryIndex.build(gallery[:500], kind="hnsw").options == {"m": 32, "ef_construction": 80, "ef_search": 64}
    hnsw = GalleryIndex.build(gallery[:500], kind="hnsw", m=8, ef_construction=20, ef_search=12)
    assert hnsw.options == {"m": 8, "ef_construction": 20, "ef_search": 12}
    hnsw.set_search_options(ef_search=40)
    assert hnsw.options["ef_search"] == 40
    assert GalleryIndex.build(gallery[:50], backend="torch").options == {}


@pytest.mark.parametrize("kind", APPROXIMATE)
def test_approximate_save_load_round_trip_keeps_kind_options_and_results(kind, tmp_path):
    gallery, queries = clustered_gallery(3, size=2000)
    labels = np.arange(2000) % 200
    items = [f"shop/{i}.jpg" for i in range(2000)]
    built = GalleryIndex.build(gallery, labels=labels, items=items, kind=kind)
    built.set_search_options(**({"nprobe": 9} if kind == "ivf" else {"ef_search": 33}))  # not the defaults
    folder = built.save(tmp_path / kind)
    assert sorted(path.name for path in folder.iterdir()) == sorted([SIDECAR_FILE, FAISS_VECTORS_FILE])
    loaded = GalleryIndex.load(folder)
    assert (loaded.kind, loaded.options, len(loaded), loaded.dim) == (kind, built.options, 2000, 32)
    assert (loaded.labels, loaded.items) == (labels.tolist(), items)
    assert loaded.search(queries, 7) == built.search(queries, 7)
    assert "kind=" in repr(loaded) and repr(loaded).endswith(f"faiss=True, kind={kind!r})")
    with pytest.raises(ValueError, match=rf"holds an approximate \({kind!r}\) faiss index; load it with faiss"):
        GalleryIndex.load(folder, backend="torch")


@needs_faiss
def test_an_ivf_search_that_finds_fewer_than_k_items_returns_the_ones_found():
    gallery, queries = clustered_gallery(4, size=400)
    index = GalleryIndex.build(gallery, kind="ivf", nlist=10, nprobe=1)  # one cell scanned: about 40 items
    scores, indices = index.search_arrays(queries[:5], 400)
    hits = index.search(queries[:5], 400)
    for row_scores, row_indices, row_hits in zip(scores, indices, hits, strict=True):
        found = row_indices >= 0
        assert 0 < found.sum() < 400 and found[: found.sum()].all()  # the missing places come last
        assert [hit.index for hit in row_hits] == row_indices[found].tolist()
        assert (row_scores[~found] == np.finfo(np.float32).min).all()


@needs_faiss
def test_approximate_build_errors():
    gallery, _ = clustered_gallery(5, size=400)
    with pytest.raises(ValueError, match=r"kind must be one of \('exact', 'ivf', 'hnsw'\); got 'lsh'"):
        GalleryIndex.build(gallery, kind="lsh")
    with pytest.raises(ValueError, match=r"kind='ivf' takes the options \('nlist', 'nprobe'\); got ef_search"):
        GalleryIndex.build(gallery, kind="ivf", ef_search=10)
    with pytest.raises(ValueError, match=r"kind='exact' takes the options \(\); got nprobe"):
        GalleryIndex.build(gallery, nprobe=10)
    with pytest.raises(ValueError, match="kind='hnsw' is a faiss index; pass backend='auto' or 'faiss'"):
        GalleryIndex.build(gallery, kind="hnsw", backend="torch")
    with pytest.raises(ValueError, match="nprobe=11 is out of range: the largest valid value is 10"):
        GalleryIndex.build(gallery, kind="ivf", nlist=10, nprobe=11)
    with pytest.raises(ValueError, match="nlist must be a positive integer; got 0"):
        GalleryIndex.build(gallery, kind="ivf", nlist=0)
    with pytest.raises(ValueError, match="m must be a positive integer; got 2.5"):
        GalleryIndex.build(gallery, kind="hnsw", m=2.5)
    index = GalleryIndex.build(gallery, kind="ivf")
    with pytest.raises(ValueError, match=r"a 'ivf' index takes the search options \('nprobe',\); got ef_search"):
        index.set_search_options(ef_search=5)
    with pytest.raises(ValueError, match=r"a 'exact' index takes the search options \(\); got nprobe"):
        GalleryIndex.build(gallery, backend="torch").set_search_options(nprobe=2)


def test_approximate_kinds_without_faiss_say_what_is_needed(monkeypatch):
    gallery, _ = clustered_gallery(6, size=100)
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match="kind='ivf' needs the faiss-cpu package; install it or use kind='exact'"):
        GalleryIndex.build(gallery, kind="ivf")


@pytest.mark.parametrize(("kind", "backend"), [("exact", "torch"), pytest.param("exact", "faiss", marks=needs_faiss),
                                               pytest.param("ivf", "faiss", marks=needs_faiss),
                                               pytest.param("hnsw", "faiss", marks=needs_faiss)])
def test_vectors_are_the_rows_normalised_in_order(gallery, kind, backend):
    embeddings, labels, _, _ = gallery
    options = {"nlist": 1} if kind == "ivf" else {}
    vectors = GalleryIndex.build(embeddings, labels=labels, backend=backend, kind=kind, **options).vectors()
    expected = embeddings.astype(np.float64) / np.linalg.norm(embeddings.astype(np.float64), axis=1, keepdims=True)
    assert vectors.dtype == np.float32 and vectors.shape == (40, 8)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
