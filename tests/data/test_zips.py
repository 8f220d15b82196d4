"""extract_class_zip on good and malicious archives built here with zipfile; nothing may land outside dest_dir."""

import io
import stat
import struct
import zipfile

import numpy as np
import pytest
from PIL import Image

from memvir.data import DatasetError, extract_class_zip, load_dataset
from memvir.data import zips as zips_module


def png_bytes(seed):
    pixels = np.random.default_rng(seed).integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def make_zip(path, entries):
    """entries: (name or ZipInfo, bytes) pairs, written in order."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return path


def class_entries(prefix=""):
    return [
        (f"{prefix}{name}/{index}.png", png_bytes(10 * k + index))
        for k, name in enumerate("abcd")
        for index in range(2)
    ]


def assert_nothing_written(tmp_path, dest):
    assert not dest.exists() or not any(dest.iterdir())
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        {"upload.zip", *([dest.name] if dest.exists() else [])}
    )


def test_a_good_zip_extracts_byte_for_byte_and_loads_as_a_folder_dataset(tmp_path):
    entries = class_entries()
    make_zip(tmp_path / "upload.zip", [("a/", b""), *entries])
    root = extract_class_zip(tmp_path / "upload.zip", tmp_path / "out")
    assert root == tmp_path / "out"
    for name, data in entries:
        assert (root / name).read_bytes() == data
    assert not [path for path in root.iterdir() if path.name.startswith(".")]  # the staging folder is gone
    splits = load_dataset(f"folder:{root}", image_size=16)
    assert splits.train.class_names == ["a", "b"] and splits.test.class_names == ["c", "d"]


def test_a_zip_of_one_wrapping_folder_returns_that_folder(tmp_path):
    make_zip(tmp_path / "upload.zip", [*class_entries("animals/"), ("__MACOSX/animals/._a", b"junk")])
    root = extract_class_zip(tmp_path / "upload.zip", tmp_path / "out")
    assert root == tmp_path / "out" / "animals"
    assert sorted(path.name for path in root.iterdir()) == ["a", "b", "c", "d"]


def test_an_existing_empty_destination_is_used(tmp_path):
    make_zip(tmp_path / "upload.zip", class_entries())
    (tmp_path / "out").mkdir()
    assert extract_class_zip(tmp_path / "upload.zip", tmp_path / "out") == tmp_path / "out"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../evil.txt", r"entry '\.\./evil.txt' points outside the destination"),
        ("a/../../evil.txt", "points outside the destination"),
        ("..\\evil.txt", "points outside the destination"),
        ("/tmp/evil.txt", "entry '/tmp/evil.txt' has an absolute path"),
        ("C:/evil.txt", "has an absolute path"),
        ("\\evil.txt", "has an absolute path"),
    ],
)
def test_paths_leaving_the_destination_are_rejected(tmp_path, name, message):
    make_zip(tmp_path / "upload.zip", [*class_entries(), (zipfile.ZipInfo(name), b"owned")])
    dest = tmp_path / "out"
    with pytest.raises(DatasetError, match=message):
        extract_class_zip(tmp_path / "upload.zip", dest)
    assert_nothing_written(tmp_path, dest)
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize(
    ("file_type", "message"),
    [(stat.S_IFLNK, "is a symbolic link"), (stat.S_IFIFO, "is a special file"), (stat.S_IFCHR, "is a special file")],
)
def test_symlinks_and_special_files_are_rejected(tmp_path, file_type, message):
    link = zipfile.ZipInfo("a/link.png")
    link.create_system = 3  # unix, where the mode bits live in the high half of external_attr
    link.external_attr = (file_type | 0o777) << 16
    make_zip(tmp_path / "upload.zip", [*class_entries(), (link, b"/etc/passwd")])
    with pytest.raises(DatasetError, match=f"entry 'a/link.png' {message}"):
        extract_class_zip(tmp_path / "upload.zip", tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")


def test_a_zip_bomb_is_rejected_by_its_ratio(tmp_path):
    make_zip(tmp_path / "upload.zip", [*class_entries(), ("a/bomb.png", bytes(5_000_000))])
    with pytest.raises(
        DatasetError, match=r"unpacks 5,0\d\d,\d+ bytes from [\d,]+ compressed, a ratio above the allowed 200"
    ):
        extract_class_zip(tmp_path / "upload.zip", tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")


def test_too_large_and_too_many_files_are_rejected(tmp_path):
    make_zip(tmp_path / "upload.zip", class_entries())
    total = sum(len(data) for _, data in class_entries())
    with pytest.raises(DatasetError, match=f"would unpack to {total:,} bytes; at most 1,000 are allowed"):
        extract_class_zip(tmp_path / "upload.zip", tmp_path / "out", max_bytes=1000)
    with pytest.raises(DatasetError, match="holds 8 entries; at most 5 are allowed"):
        extract_class_zip(tmp_path / "upload.zip", tmp_path / "out", max_files=5)
    assert_nothing_written(tmp_path, tmp_path / "out")


def patch_all(data: bytes, signature: bytes, offset: int, fmt: str, value: int) -> bytes:
    """Overwrite a field at `offset` in every header that starts with `signature` (local and central headers)."""
    patched = bytearray(data)
    start = patched.find(signature)
    while start != -1:
        struct.pack_into(fmt, patched, start + offset, value)
        start = patched.find(signature, start + 4)
    return bytes(patched)


def test_headers_that_understate_the_size_are_caught_while_extracting(tmp_path):
    path = make_zip(tmp_path / "upload.zip", class_entries())
    data = path.read_bytes()
    data = patch_all(data, b"PK\x03\x04", 22, "<I", 10)  # local headers: uncompressed size 10
    data = patch_all(data, b"PK\x01\x02", 24, "<I", 10)  # central directory: the same lie
    path.write_bytes(data)
    with pytest.raises(DatasetError, match=r"entry 'a/0.png' cannot be unpacked: .*CRC"):
        extract_class_zip(path, tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")


def test_bytes_beyond_the_budget_stop_extraction(tmp_path, monkeypatch):
    """If an entry streams more than its header declared, the running count stops it (zipfile itself truncates,
    so the stream is replaced here to show the guard that does not rely on that)."""
    path = make_zip(tmp_path / "upload.zip", class_entries())
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, entry: io.BytesIO(bytes(3 * 1024 * 1024)))
    with pytest.raises(DatasetError, match=r"unpacking exceeded [\d,]+ bytes at entry 'a/0.png'"):
        extract_class_zip(path, tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")


def test_encrypted_entries_are_rejected(tmp_path):
    path = make_zip(tmp_path / "upload.zip", class_entries())
    data = patch_all(path.read_bytes(), b"PK\x01\x02", 8, "<H", 0x1)  # general purpose flag: encrypted
    path.write_bytes(data)
    with pytest.raises(DatasetError, match="entry 'a/0.png' is encrypted; upload an unencrypted zip"):
        extract_class_zip(path, tmp_path / "out")


def test_duplicate_entries_are_rejected(tmp_path):
    with pytest.warns(UserWarning, match="Duplicate name"):
        make_zip(tmp_path / "upload.zip", [*class_entries(), ("a/0.png", b"second copy")])
    with pytest.raises(DatasetError, match="entry 'a/0.png' appears twice"):
        extract_class_zip(tmp_path / "upload.zip", tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")


def test_failure_leaves_an_existing_empty_destination_empty(tmp_path, monkeypatch):
    path = make_zip(tmp_path / "upload.zip", class_entries())
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, entry: io.BytesIO(bytes(3 * 1024 * 1024)))
    with pytest.raises(DatasetError, match="unpacking exceeded"):
        extract_class_zip(path, tmp_path / "out")
    assert (tmp_path / "out").is_dir() and not any((tmp_path / "out").iterdir())


def test_not_a_zip_and_a_used_destination_are_rejected(tmp_path):
    (tmp_path / "upload.zip").write_bytes(b"plain text, not a zip")
    with pytest.raises(DatasetError, match=r"upload.zip is not a readable zip file"):
        extract_class_zip(tmp_path / "upload.zip", tmp_path / "out")
    with pytest.raises(DatasetError, match=r"missing.zip is not a readable zip file"):
        extract_class_zip(tmp_path / "missing.zip", tmp_path / "out")
    make_zip(tmp_path / "upload.zip", class_entries())
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    with pytest.raises(DatasetError, match=r"destination .*used must be a new or empty folder"):
        extract_class_zip(tmp_path / "upload.zip", tmp_path / "used")
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine"


def test_default_limits_are_sane():
    assert zips_module.DEFAULT_MAX_BYTES == 1024**3
    assert zips_module.DEFAULT_MAX_FILES == 50_000
    assert zips_module.DEFAULT_MAX_RATIO == 200.0
