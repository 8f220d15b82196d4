"""What the Retrieve tab offers a visitor, from RetrievalService: the checkpoint it starts on (the bundled MemVir one),
a query class that the gallery has, and a checkpoint as a zip that loads with EmbeddingModel.from_pretrained."""

import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from demo.common.settings import AppSettings
from demo.retrieve.service import RetrievalError, RetrievalService
from memvir.models.embedding_model import EmbeddingModel

CHECKPOINTS = Path(__file__).resolve().parents[3] / "checkpoints"


def _service(data_dir, checkpoints_dir, **settings) -> RetrievalService:
    return RetrievalService(AppSettings(data_dir=data_dir, checkpoints_dir=checkpoints_dir, umap=False, **settings))


def _tiny_model(seed: int, dataset: str = "glyphs-mini") -> EmbeddingModel:
    torch.manual_seed(seed)
    return EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                          dataset=dataset)


# ---------------------------------------------------------------------------------------------- default checkpoint
def test_the_default_checkpoint_is_the_bundled_memvir_one(tmp_path):
    service = _service(tmp_path / "data", CHECKPOINTS)
    assert service.default_checkpoint() == str(CHECKPOINTS / "glyphs-norm-softmax-memvir")
    assert service.checkpoint_choices()[0][1] == str(CHECKPOINTS / "glyphs-norm-softmax-baseline")  # not the first


def test_without_a_bundled_memvir_checkpoint_the_first_listed_is_the_default(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(CHECKPOINTS / "glyphs-norm-softmax-baseline", checkpoints / "baseline")
    _tiny_model(0).save_pretrained(tmp_path / "data" / "runs" / "20260101-run")
    assert _service(tmp_path / "data", checkpoints).default_checkpoint() == str(checkpoints / "baseline")
    assert _service(tmp_path / "data", tmp_path / "none").default_checkpoint() == str(
        tmp_path / "data" / "runs" / "20260101-run")
    assert _service(tmp_path / "empty", tmp_path / "none").default_checkpoint() is None


# ---------------------------------------------------------------------------------------------- example query class
def test_the_example_query_class_is_a_typeable_class_of_the_gallery(tmp_path):
    service = _service(tmp_path / "data", CHECKPOINTS)
    glyphs = service.test_split_gallery(service.load_checkpoint(str(CHECKPOINTS / "glyphs-norm-softmax-memvir")))
    assert "Ж U+0416" not in glyphs.class_names  # the page's old placeholder, which the test split lacks
    assert service.example_query_class(glyphs) == "A"
    assert service.match_class(glyphs, "A") == "A U+0041"

    _tiny_model(0).save_pretrained(tmp_path / "checkpoints" / "mini")
    mini_service = _service(tmp_path / "data", tmp_path / "checkpoints")
    mini = mini_service.test_split_gallery(mini_service.load_checkpoint(str(tmp_path / "checkpoints" / "mini")))
    assert service.example_query_class(mini) == "z"  # glyphs-mini's only ASCII letter
    assert service.match_class(mini, "z") == "z U+007A"


def test_the_example_query_class_of_uploads(tmp_path):
    service = _service(tmp_path / "data", CHECKPOINTS)
    archive = tmp_path / "shapes.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in ("circles/1.png", "circles/2.png", "squares/1.png"):
            image = tmp_path / "one.png"
            Image.new("RGB", (20, 20), (200, 10, 10)).save(image)
            handle.write(image, name)
    assert service.example_query_class(service.uploaded_gallery([archive])) == "circles"
    loose = tmp_path / "loose.png"
    Image.new("RGB", (20, 20)).save(loose)
    assert service.example_query_class(service.uploaded_gallery([loose])) is None


# ---------------------------------------------------------------------------------------------- download as zip
def _unzipped_model(path: Path, into: Path) -> tuple[EmbeddingModel, list[str]]:
    with zipfile.ZipFile(path) as archive:
        names = sorted(archive.namelist())
        archive.extractall(into)
    (folder,) = into.iterdir()
    return EmbeddingModel.from_pretrained(folder), names


def _same_weights(a: EmbeddingModel, b: EmbeddingModel) -> bool:
    a_state, b_state = a.state_dict(), b.state_dict()
    return a_state.keys() == b_state.keys() and all(torch.equal(a_state[key], b_state[key]) for key in a_state)


def test_a_bundled_checkpoint_downloads_as_a_zip_that_loads(tmp_path):
    data = tmp_path / "data"
    service = _service(data, CHECKPOINTS)
    bundled = CHECKPOINTS / "glyphs-norm-softmax-memvir"
    path = service.download_zip(str(bundled))
    assert path.name == "glyphs-norm-softmax-memvir.zip" and path.parent.parent == data / "downloads"
    model, names = _unzipped_model(path, tmp_path / "unzipped")
    assert names == ["glyphs-norm-softmax-memvir/README.md", "glyphs-norm-softmax-memvir/config.json",
                     "glyphs-norm-softmax-memvir/model.safetensors"]  # no gallery index, no trainer state
    assert _same_weights(model, EmbeddingModel.from_pretrained(bundled)) and model.config == dict(
        EmbeddingModel.from_pretrained(bundled).config)
    assert (tmp_path / "unzipped" / "glyphs-norm-softmax-memvir" / "README.md").read_text() == (
        bundled / "README.md").read_text()
    assert service.download_zip(str(bundled)) == path  # unchanged files: the same zip again


def test_a_run_downloads_as_a_zip_and_a_new_save_makes_a_new_one(tmp_path):
    run = tmp_path / "data" / "runs" / "20260101-run"
    _tiny_model(0).save_pretrained(run, metrics={"recall@1": 0.5})
    service = _service(tmp_path / "data", tmp_path / "checkpoints")
    first = service.download_zip(str(run))
    model, _ = _unzipped_model(first, tmp_path / "first")
    assert _same_weights(model, _tiny_model(0))
    _tiny_model(1).save_pretrained(run, metrics={"recall@1": 0.6})  # the run saved again
    second = service.download_zip(str(run))
    assert second != first
    model, _ = _unzipped_model(second, tmp_path / "second")
    assert _same_weights(model, _tiny_model(1))


def test_downloads_are_bounded_by_size_and_age(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    for seed, name in enumerate(("first", "second", "third")):
        _tiny_model(seed).save_pretrained(checkpoints / name)
    one_zip = _service(tmp_path / "probe", checkpoints).download_zip(str(checkpoints / "first")).stat().st_size

    service = _service(tmp_path / "data", checkpoints, max_downloads_bytes=2 * one_zip + one_zip // 2)
    first = service.download_zip(str(checkpoints / "first"))
    second = service.download_zip(str(checkpoints / "second"))
    os.utime(first, (first.stat().st_mtime - 60,) * 2)  # the least recently used
    third = service.download_zip(str(checkpoints / "third"))
    assert not first.exists() and second.is_file() and third.is_file()
    assert sorted(path.name for path in (tmp_path / "data" / "downloads").iterdir()) == sorted(
        [second.parent.name, third.parent.name])  # its folder went with it

    aged = _service(tmp_path / "data", checkpoints, max_upload_age_s=30)
    os.utime(second, (second.stat().st_mtime - 3600,) * 2)  # unused for an hour
    again = aged.download_zip(str(checkpoints / "third"))
    assert again == third and not second.exists()


def test_a_checkpoint_a_visitor_may_not_name_is_not_zipped(tmp_path):
    outside = tmp_path / "elsewhere" / "model"
    _tiny_model(0).save_pretrained(outside)
    service = _service(tmp_path / "data", tmp_path / "checkpoints")
    with pytest.raises(RetrievalError, match="the checkpoint typed is neither an existing folder nor a Hub repo id"):
        service.download_zip(str(outside))
    assert not (tmp_path / "data" / "downloads").exists()
