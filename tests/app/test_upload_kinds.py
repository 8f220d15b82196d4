"""A file is what its name and the checks of that kind say, the same on every path: a PNG with a zip appended, named
.png, is one image whether it is uploaded alone or with other images (the zip inside is never unpacked); a file named
.zip is read as a zip of class folders, and refused as one when it is not."""

import io
import zipfile

import pytest
from PIL import Image

from demo.common.settings import AppSettings
from demo.common.uploads import UploadError, is_zip
from demo.retrieve.service import RetrievalService


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (20, 20), value).save(buffer, format="PNG")
    return buffer.getvalue()


def _zip_of_classes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in ("a/1.png", "a/2.png", "b/1.png", "b/2.png"):
            archive.writestr(name, _png(9))
    return buffer.getvalue()


@pytest.fixture
def service(tmp_path):
    return RetrievalService(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints",
                                        umap=False))


def test_a_png_with_a_zip_appended_is_one_image_alone_or_among_others(service, tmp_path):
    polyglot = tmp_path / "odd.png"
    polyglot.write_bytes(_png(100) + _zip_of_classes())
    assert zipfile.is_zipfile(polyglot)  # a valid zip too, which is what made it a gallery of 4 images before
    other = tmp_path / "other.png"
    other.write_bytes(_png(200))
    assert not is_zip(polyglot)
    alone = service.uploaded_gallery([polyglot])
    assert (alone.size, alone.labels) == (1, None)
    together = service.uploaded_gallery([polyglot, other])
    assert (together.size, together.labels) == (2, None)
    assert not (tmp_path / "data" / "uploads").exists() or not any((tmp_path / "data" / "uploads").iterdir())


def test_a_file_named_zip_is_read_as_one_and_refused_when_it_is_not(service, tmp_path):
    fake = tmp_path / "classes.zip"
    fake.write_bytes(_png(5))
    assert is_zip(fake)
    with pytest.raises(UploadError, match="classes.zip"):
        service.uploaded_gallery([fake])
