"""RetrievalService against hand-written references: brute-force cosine top-k and Recall@1 over the glyphs-mini test
split, same/different class marks, uploaded galleries, and the messages for checkpoints that cannot be had."""

import io
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from demo.common.settings import AppSettings
from demo.common.uploads import UploadError
from demo.retrieve.service import RetrievalError, RetrievalService
from memvir.models.embedding_model import EmbeddingModel


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval")
    torch.manual_seed(0)
    model = EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                           dataset="glyphs-mini")
    model.save_pretrained(root / "checkpoints" / "tiny")
    (root / "checkpoints" / "not-a-checkpoint").mkdir()
    run = root / "data" / "runs" / "20260101-run"
    model.save_pretrained(run)
    (root / "data" / "runs" / "20260102-no-weights-yet").mkdir(parents=True)
    service = RetrievalService(AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False))
    checkpoint = service.load_checkpoint(str(root / "checkpoints" / "tiny"))
    return root, service, checkpoint


def _reference_embeddings(checkpoint, gallery_split):
    """Embeddings through the dataset's own test transform (not the app's query path), in one batch."""
    batch = torch.stack([gallery_split[i][0] for i in range(len(gallery_split))])
    with torch.no_grad():
        return checkpoint.model.eval()(batch).numpy()


def test_checkpoints_listed_are_bundled_folders_and_runs_with_weights(setup):
    root, service, _ = setup
    assert service.checkpoint_choices() == [
        ("bundled: tiny", str(root / "checkpoints" / "tiny")),
        ("run: 20260101-run", str(root / "data" / "runs" / "20260101-run")),
    ]


@pytest.mark.parametrize(("choice", "message"), [
    ("", "choose a checkpoint, or type a Hub repo id such as owner/name"),
    ("someone/not-cached-anywhere", "the Hub cannot be reached from this server; pick a bundled checkpoint"),
    ("not a repo id!", "is neither an existing folder nor a Hub repo id"),
])
def test_checkpoints_that_cannot_be_had_say_why(setup, choice, message):
    _, service, _ = setup
    with pytest.raises(RetrievalError, match=message):
        service.load_checkpoint(choice)


def test_a_folder_without_weights_is_refused(setup):
    root, service, _ = setup
    with pytest.raises(RetrievalError, match="model.safetensors missing"):
        service.load_checkpoint(str(root / "checkpoints" / "not-a-checkpoint"))


def test_search_matches_a_brute_force_cosine_top_k(setup):
    from memvir.data import load_dataset

    _, service, checkpoint = setup
    split = load_dataset("glyphs-mini").test
    gallery = service.test_split_gallery(checkpoint)
    assert gallery.size == len(split) == 288 and gallery.labels == split.labels.tolist()
    reference = _reference_embeddings(checkpoint, split)
    query_index = 30
    hits = service.search(checkpoint, gallery, split.image(query_index), k=5, exclude=query_index,
                          query_class=gallery.class_of(query_index)).hits
    similarities = reference @ reference[query_index]
    similarities[query_index] = -np.inf
    expected = np.argsort(-similarities, kind="stable")[:5]
    assert [hit.index for hit in hits] == expected.tolist()
    np.testing.assert_allclose([hit.score for hit in hits], similarities[expected], atol=1e-4)
    query_label = split.labels[query_index]
    assert [hit.same_class for hit in hits] == [bool(split.labels[i] == query_label) for i in expected]
    assert [hit.class_name for hit in hits] == [split.class_names[split.labels[i]] for i in expected]


def test_the_gallerys_recall_at_1_is_each_item_against_all_others(setup):
    from memvir.data import load_dataset

    _, service, checkpoint = setup
    split = load_dataset("glyphs-mini").test
    reference = _reference_embeddings(checkpoint, split)
    correct = 0
    for i in range(len(split)):
        similarities = reference @ reference[i]
        similarities[i] = -np.inf
        correct += split.labels[int(np.argmax(similarities))] == split.labels[i]
    indexed = service.index(checkpoint, service.test_split_gallery(checkpoint))
    assert indexed.metrics["recall@1"] == pytest.approx(correct / len(split), abs=1e-9)
    assert service.index(checkpoint, service.test_split_gallery(checkpoint)) is indexed  # built once, then cached


def test_query_class_is_matched_by_character_or_full_name(setup):
    _, service, checkpoint = setup
    gallery = service.test_split_gallery(checkpoint)
    name = gallery.class_names[3]
    assert service.match_class(gallery, name.split(" ")[0]) == name
    assert service.match_class(gallery, name) == name
    assert service.match_class(gallery, "  ") is None
    with pytest.raises(RetrievalError, match="the gallery has no class 'no such class'"):
        service.match_class(gallery, "no such class")


def _png_bytes(value):
    buffer = io.BytesIO()
    Image.new("L", (20, 20), value).save(buffer, format="PNG")
    return buffer.getvalue()


def test_uploaded_images_make_an_unlabelled_gallery(setup, tmp_path):
    _, service, checkpoint = setup
    paths = []
    for value in (0, 100, 200):
        paths.append(tmp_path / f"{value}.png")
        paths[-1].write_bytes(_png_bytes(value))
    gallery = service.uploaded_gallery(paths)
    assert (gallery.size, gallery.labels, gallery.description) == (3, None, "3 uploaded images")
    hits = service.search(checkpoint, gallery, Image.new("L", (20, 20), 100), k=3).hits
    assert sorted(hit.index for hit in hits) == [0, 1, 2] and all(hit.same_class is None for hit in hits)
    with pytest.raises(RetrievalError, match="this gallery has no classes"):
        service.match_class(gallery, "a")


def test_an_uploaded_zip_makes_a_labelled_gallery(setup, tmp_path):
    _, service, _ = setup
    path = tmp_path / "classes.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for name in ("cats/1.png", "cats/2.png", "dogs/1.png"):
            archive.writestr(name, _png_bytes(50))
    gallery = service.uploaded_gallery([path])
    assert gallery.labels == [0, 0, 1] and gallery.class_names == ["cats", "dogs"]


def test_bad_gallery_uploads_say_what_was_wrong(setup, tmp_path):
    _, service, _ = setup
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("x/1.png", _png_bytes(1))
    with pytest.raises(RetrievalError, match="upload gallery images"):
        service.uploaded_gallery([])
    with pytest.raises(UploadError, match="notes.txt is not an image"):
        service.uploaded_gallery([text])
    with pytest.raises(RetrievalError, match="either one zip of class folders or loose images, not both"):
        service.uploaded_gallery([archive, text])
