"""RetrievalService's gallery indexes on disk: a bundled checkpoint's shipped index answers the first search with no
embedding; a stale one is rebuilt, not used, and kept in the app's gallery cache for the next start (never written
beside the checkpoint); a run's gallery is indexed in the background, saved beside it, with its progress readable.
Embedding is observed by counting calls of memvir.retrieval.evaluation.embed (the one path that embeds a test split);
nothing is timed."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from demo.common.settings import AppSettings
from demo.retrieve.service import RetrievalError, RetrievalService
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import evaluation, shipped_gallery

BUNDLED_MEMVIR = Path(__file__).resolve().parents[3] / "checkpoints" / "glyphs-norm-softmax-memvir"
FAIR_RESULTS = Path(__file__).resolve().parents[3] / "docs" / "reproduction" / "wide" / "results.json"


@pytest.fixture
def embed_calls(monkeypatch):
    """The splits memvir.retrieval.evaluation.embed is asked to embed, in order."""
    calls = []
    original = evaluation.embed

    def counting(model, split, *args, **kwargs):
        calls.append(len(split))
        return original(model, split, *args, **kwargs)

    monkeypatch.setattr(evaluation, "embed", counting)
    return calls


def _service(tmp_path, **settings) -> RetrievalService:
    return RetrievalService(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints",
                                        umap=False, **settings))


def _tiny_model(seed: int) -> EmbeddingModel:
    torch.manual_seed(seed)
    return EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                          dataset="glyphs-mini")


def _mini_glyph(index: int):
    return load_dataset("glyphs-mini").test.image(index)


def _files(folder: Path) -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}


def test_a_bundled_checkpoints_first_search_uses_its_shipped_index(tmp_path, embed_calls):
    bundled = shutil.copytree(BUNDLED_MEMVIR, tmp_path / "checkpoints" / BUNDLED_MEMVIR.name)
    shipped = _files(bundled / "gallery")
    service = _service(tmp_path)
    checkpoint = service.load_checkpoint(str(bundled))
    gallery = service.test_split_gallery(checkpoint)
    query_index = 1234
    hits = service.search(checkpoint, gallery, gallery.image(query_index), k=5,
                          query_class=gallery.class_of(query_index)).hits
    assert embed_calls == []  # the 12,250 test images were not embedded
    # The query is a gallery image: the app's query path embeds it exactly as the shipped row, so it comes first.
    assert hits[0].index == query_index and hits[0].score == pytest.approx(1.0, abs=1e-5) and hits[0].same_class
    indexed = service.index(checkpoint, gallery)
    assert len(indexed.index) == gallery.size == 12_250
    card = (bundled / "README.md").read_text()
    # the card's figure is the shipped index's; its command is the widened fair study's record of its seed-0 final
    # but for the folder: the same run retrained on glyphs v2 (the study's runs, and their figures, are v1's)
    (trained,) = [r for r in json.loads(FAIR_RESULTS.read_text()) if r["profile"] == "wide"
                  and r["phase"] == "final" and r["arm"] == "memvir-balanced" and r["seed"] == 0]
    assert f"| recall@1 | {indexed.metrics['recall@1']:.4f} |" in card
    study_command = trained["command"].replace("runs/fair/wide/final-memvir-balanced-s0", f"runs/{bundled.name}")
    assert f"\n{study_command}\n" in card
    assert service.indexing_progress(str(bundled)) == 1.0
    assert _files(bundled / "gallery") == shipped  # read, not rewritten


def test_a_stale_index_is_rebuilt_not_used_and_kept_for_the_next_start(tmp_path, embed_calls):
    folder = tmp_path / "checkpoints" / "tiny"
    split = load_dataset("glyphs-mini").test
    _tiny_model(0).save_pretrained(folder)
    shipped_gallery.build(folder, split, "glyphs-mini")
    _tiny_model(1).save_pretrained(folder)  # retrained after its index was built
    embed_calls.clear()

    service = _service(tmp_path)
    checkpoint = service.load_checkpoint(str(folder))
    gallery = service.test_split_gallery(checkpoint)
    hits = service.search(checkpoint, gallery, split.image(30), k=5, exclude=30).hits
    assert embed_calls == [288]  # embedded once, with the new weights
    new_model = _tiny_model(1).eval()
    with torch.no_grad():
        reference = new_model(torch.stack([split[i][0] for i in range(len(split))])).numpy()
    similarities = reference @ reference[30]
    similarities[30] = -np.inf
    assert [hit.index for hit in hits] == np.argsort(-similarities, kind="stable")[:5].tolist()
    # kept in the app's cache, not beside the bundled weights (tests/app/retrieve/test_gallery_cache.py)
    assert shipped_gallery.staleness(folder, split) is not None
    assert shipped_gallery.load(folder, split, shipped_gallery.gallery_cache_dir(
        tmp_path / "data" / "galleries", folder, split)) is not None

    restarted = _service(tmp_path)
    checkpoint = restarted.load_checkpoint(str(folder))
    restarted.search(checkpoint, restarted.test_split_gallery(checkpoint), split.image(30), k=5)
    assert embed_calls == [288]  # the next start reads it


def test_an_index_of_a_folder_the_app_may_only_read_is_kept_in_its_cache(tmp_path, embed_calls):
    elsewhere = tmp_path / "shared-models" / "tiny"
    _tiny_model(0).save_pretrained(elsewhere)
    service = _service(tmp_path, allowed_folders=(tmp_path / "shared-models",))
    checkpoint = service.load_checkpoint(str(elsewhere))
    service.index(checkpoint, service.test_split_gallery(checkpoint))
    assert embed_calls == [288] and not (elsewhere / "gallery").exists()  # a folder visitors may only read
    restarted = _service(tmp_path, allowed_folders=(tmp_path / "shared-models",))
    checkpoint = restarted.load_checkpoint(str(elsewhere))
    restarted.index(checkpoint, restarted.test_split_gallery(checkpoint))
    assert embed_calls == [288]  # the next start reads it from the app's gallery cache


def test_a_finished_runs_gallery_is_indexed_in_the_background(tmp_path, embed_calls):
    run = tmp_path / "data" / "runs" / "20260101-run"
    _tiny_model(0).save_pretrained(run)
    service = _service(tmp_path)
    assert service.indexing_progress(str(run)) is None  # nothing started yet
    service.index_in_background(str(run)).join(120)
    assert embed_calls == [288]
    assert service.indexing_progress(str(run)) == 1.0
    assert shipped_gallery.staleness(run, load_dataset("glyphs-mini").test) is None  # saved beside the run
    assert not (tmp_path / "data" / "galleries").exists()  # and nowhere else

    checkpoint = service.load_checkpoint(str(run))
    service.search(checkpoint, service.test_split_gallery(checkpoint), _mini_glyph(0), k=3)
    restarted = _service(tmp_path)
    checkpoint = restarted.load_checkpoint(str(run))
    restarted.search(checkpoint, restarted.test_split_gallery(checkpoint), _mini_glyph(0), k=3)
    assert embed_calls == [288]  # neither this process's search nor a later start's embeds it again


def test_a_background_indexing_that_fails_says_why(tmp_path, embed_calls):
    run = tmp_path / "data" / "runs" / "20260102-run"
    torch.manual_seed(0)
    EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                   dataset="folder:/no/such/folder").save_pretrained(run)
    service = _service(tmp_path)
    service.index_in_background(str(run)).join(120)
    assert embed_calls == []
    with pytest.raises(RetrievalError, match="the checkpoint's dataset 'folder:/no/such/folder' is not available"):
        service.indexing_progress(str(run))


def test_a_background_build_that_fails_leaves_its_error_for_the_progress_query(tmp_path, embed_calls):
    run = tmp_path / "data" / "runs" / "20260103-run"
    torch.manual_seed(0)
    # An RGB model on the grayscale glyphs: it loads, and its forward pass refuses the split's 1-channel images.
    EmbeddingModel(embedding_dim=16, in_channels=3, image_size=32, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                   dataset="glyphs-mini").save_pretrained(run)
    service = _service(tmp_path)
    service.index_in_background(str(run)).join(120)
    assert embed_calls == [288]
    with pytest.raises(RetrievalError, match=r"indexing the gallery of 20260103-run failed: expected a batch of "
                                             r"images \[B, 3, H, W\], got shape \(288, 1, 32, 32\)"):
        service.indexing_progress(str(run))
    assert not (run / "gallery").exists()


def test_warming_up_readies_the_default_checkpoints_gallery_from_its_shipped_index(tmp_path, embed_calls):
    bundled = shutil.copytree(BUNDLED_MEMVIR, tmp_path / "checkpoints" / BUNDLED_MEMVIR.name)
    service = _service(tmp_path)
    assert service.indexing_progress(str(bundled)) is None
    service.warm_up().join(120)
    assert service.indexing_progress(str(bundled)) == 1.0 and embed_calls == []
    assert _service(tmp_path / "nothing").warm_up() is None  # no checkpoint to warm


def test_an_index_embedded_with_weights_since_replaced_is_not_saved(tmp_path, embed_calls):
    run = tmp_path / "data" / "runs" / "20260104-run"
    _tiny_model(0).save_pretrained(run)
    service = _service(tmp_path)
    loaded_before = service.load_checkpoint(str(run))
    _tiny_model(1).save_pretrained(run)  # the run saved again after its model was loaded
    service.index(loaded_before, service.test_split_gallery(loaded_before))
    assert embed_calls == [288] and not (run / "gallery").exists()  # it would not match the stamp's weights
