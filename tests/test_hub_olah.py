"""pull from olah 0.5.4 (requirements-dev), a third-party, self-hosted Hugging Face mirror, serving a local git repo
read-only on 127.0.0.1: a second implementation of the Hub's API, written by others, beside tests/hub_server.py.

Its limits, as found here: it serves a local mirror at an explicit revision only (its `/api/models/{repo}` without
one asks the upstream Hub, and offline answers RepoNotFound, so `pull(repo_id)` says there is no such repo); an
unknown revision is RepoNotFound too, not RevisionNotFound; a local mirror's files are plain git blobs (no LFS); and
it takes no uploads, so `push` cannot go there.
"""

import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from hub_server import point_client_at

from memvir.hub import HubError, pull
from memvir.models.embedding_model import EmbeddingModel

REPO = "someone/glyph-model"
HUB_FILES = ("README.md", "config.json", "model.safetensors")
START_S = 60


def _git(folder, *args) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=someone", "-c", "user.email=someone@example.org",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def olah(tmp_path_factory):
    """olah serving a git repo of a checkpoint (branch main, tag v1) from its mirrors folder; (url, model, commit,
    the repo's folder). One server for the module: its tests only read from it, each with a Hub cache of its own."""
    try:
        import olah  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("olah is missing: pip install -r requirements-dev.txt")
        pytest.skip("olah is not installed (requirements-dev.txt has it)")
    tmp_path = tmp_path_factory.mktemp("olah")
    repo = tmp_path / "mirrors" / "models" / REPO
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    model = EmbeddingModel(embedding_dim=16)
    model.save_pretrained(repo, metrics={"recall@1": 0.5})
    _git(repo, "add", *HUB_FILES)
    _git(repo, "commit", "-q", "-m", "a checkpoint")
    _git(repo, "tag", "v1")
    commit = _git(repo, "rev-parse", "HEAD")

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "olah.toml").write_text(
        f'[basic]\nhost = "127.0.0.1"\nport = {port}\nrepos-path = "{tmp_path / "olah-cache"}"\n'
        f'mirrors-path = ["{tmp_path / "mirrors"}"]\nmirror-netloc = "127.0.0.1:{port}"\n'
        f'mirror-lfs-netloc = "127.0.0.1:{port}"\n'
        'hf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\nhf-lfs-netloc = "127.0.0.1:9"\n'  # no upstream: nothing listens
        "[accessibility]\noffline = true\n")
    log = (tmp_path / "olah.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "olah.server", "-c", str(tmp_path / "olah.toml")], cwd=tmp_path,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if server.poll() is not None:
                raise AssertionError(f"olah exited with {server.returncode}:\n{(tmp_path / 'olah.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"olah did not listen on port {port} in {START_S} s") from None
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}", model, commit, repo
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_pull_from_olah_at_a_revision(olah, monkeypatch, tmp_path):
    url, model, commit, repo = olah
    point_client_at(monkeypatch, url, tmp_path / "home")
    folder = pull(REPO, revision="main")
    assert folder == tmp_path / "home" / "hub" / "models--someone--glyph-model" / "snapshots" / commit
    assert all((folder / name).read_bytes() == (repo / name).read_bytes() for name in HUB_FILES)
    loaded = EmbeddingModel.from_pretrained(folder).state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in model.state_dict().items())
    assert pull(REPO, revision="v1") == folder


def test_olahs_limits_reach_the_user_as_plain_errors(olah, monkeypatch, tmp_path):
    url, _, _, _ = olah
    point_client_at(monkeypatch, url, tmp_path / "home")
    with pytest.raises(HubError, match=r"The Hub has no model repo 'someone/glyph-model' that this machine may read"):
        pull(REPO)  # olah asks its (absent) upstream for the latest commit of a repo only its mirror has
    with pytest.raises(HubError, match=r"The Hub has no model repo 'someone/glyph-model'"):
        pull(REPO, revision="v9")  # olah calls an unknown revision an unknown repo
