"""`make space` puts the app on a Hugging Face Space with `hf upload`: its upload set (every tracked file less the
Makefile's SPACE_EXCLUDE, filtered by huggingface_hub's own pattern matcher, as the upload filters them) holds what
the Space runs, and every binary or large file in it is one that .gitattributes sends to Xet/LFS: the Hub refuses
binary files sent as plain git blobs, and any file over its plain-git limit."""

import fnmatch
import re
import subprocess
from pathlib import Path, PurePosixPath

from huggingface_hub.utils import filter_repo_objects

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAIN_GIT_LIMIT = 10 * 1024 * 1024  # the Hub stores a file this large with LFS whatever its name


def _space_exclude() -> list[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    return re.search(r"^SPACE_EXCLUDE := (.+)$", text, re.MULTILINE).group(1).split()


def _upload_set() -> list[str]:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    return list(filter_repo_objects(tracked, ignore_patterns=_space_exclude()))


def _lfs_patterns() -> list[str]:
    lines = (REPO_ROOT / ".gitattributes").read_text().splitlines()
    return [line.split()[0] for line in lines if "filter=lfs" in line.split()[1:]]


def _binary(path: Path) -> bool:
    return b"\0" in path.read_bytes()[:8192]


def test_the_upload_set_is_what_a_space_runs():
    files = set(_upload_set())
    needed = {"app.py", "README.md", "requirements.txt", "pre-requirements.txt", ".gitattributes",
              "demo/page.py", "demo/static/page.js", "memvir/__init__.py", "memvir/train/trainer.py",
              "checkpoints/glyphs-norm-softmax-memvir/model.safetensors",
              "checkpoints/glyphs-norm-softmax-memvir/gallery/vectors.npy"}
    assert needed <= files, sorted(needed - files)
    assert {f for f in files if f.endswith(".ttf")}, "the glyphs' fonts (memvir/data/glyphs/fonts)"
    assert not [f for f in files if f.split("/")[0] in ("tests", "bench", ".ci", "runs", ".venv")]


def test_every_binary_or_large_file_of_the_upload_set_goes_to_lfs():
    patterns = _lfs_patterns()
    outside = [name for name in _upload_set()
               if (_binary(REPO_ROOT / name) or (REPO_ROOT / name).stat().st_size > PLAIN_GIT_LIMIT)
               and not any(fnmatch.fnmatchcase(PurePosixPath(name).name, pattern) for pattern in patterns)]
    assert outside == [], f"binary or large files no .gitattributes pattern sends to LFS: {outside}"
