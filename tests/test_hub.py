"""pull / push / load_model: local folders, the Hub cache offline, clear errors; the network is never touched.

Every Hub call that would leave the machine is replaced by a stand-in that records what it was asked, and an
autouse fixture makes any real HTTP request fail the test.
"""

import httpx2
import huggingface_hub
import pytest
import torch
from hub_cache import COMMIT, hub_cache_snapshot
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoUrl
from huggingface_hub.utils import filter_repo_objects

from memvir import hub
from memvir.hub import HubError, load_model, pull, push
from memvir.models.embedding_model import EmbeddingModel

REPO = "someone/glyph-model"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """A real HTTP request from any test here is a bug: fail loudly instead of sending it."""

    def refuse(self, request):
        raise AssertionError(f"tests must not touch the network: {request.method} {request.url}")

    monkeypatch.setattr(httpx2.HTTPTransport, "handle_request", refuse)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def online(monkeypatch):
    """Online mode, with the Hub calls themselves still replaced by each test."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _checkpoint(folder, **model_kwargs):
    model = EmbeddingModel(embedding_dim=16, **model_kwargs)
    model.save_pretrained(folder, metrics={"recall@1": 0.5})
    return model


def _cached_snapshot(cache_dir, repo_id=REPO):
    return hub_cache_snapshot(cache_dir, repo_id)


def _http_error(error_class, status, message):
    request = httpx2.Request("GET", f"https://huggingface.co/api/models/{REPO}")
    return error_class(message, response=httpx2.Response(status, request=request))


# ---------------------------------------------------------------- pull


def test_pull_returns_a_local_checkpoint_folder_as_is(tmp_path):
    _checkpoint(tmp_path)
    assert pull(tmp_path) == tmp_path
    assert pull(str(tmp_path)) == tmp_path


def test_pull_names_what_a_local_folder_lacks(tmp_path):
    _checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(HubError, match=rf"the local folder {tmp_path} is not a checkpoint: model.safetensors missing"):
        pull(tmp_path)


def test_pull_rejects_what_is_neither_folder_nor_repo_id(tmp_path):
    with pytest.raises(HubError, match=r"'no//such--path' is neither an existing folder nor a Hub repo id"):
        pull("no//such--path", cache_dir=tmp_path)


def test_pull_unknown_repo_offline_is_a_clear_error(tmp_path, offline):
    with pytest.raises(HubError) as caught:
        pull("nobody/missing-model", cache_dir=tmp_path)
    message = str(caught.value)
    assert "Could not pull 'nobody/missing-model': HF_HUB_OFFLINE is set" in message
    assert str(tmp_path) in message and "holds no complete snapshot" in message
    assert "pass a local checkpoint folder" in message


def test_pull_offline_uses_the_hub_cache(tmp_path, offline):
    model = _checkpoint(_cached_snapshot(tmp_path))
    folder = pull(REPO, cache_dir=tmp_path)
    assert folder == tmp_path / "models--someone--glyph-model" / "snapshots" / COMMIT
    loaded = load_model(REPO, cache_dir=tmp_path)
    images = torch.randn(2, 1, 32, 32)
    assert torch.equal(loaded.embed(images), model.embed(images))


def test_pull_of_a_cached_repo_without_weights_names_the_file(tmp_path, offline):
    snapshot = _cached_snapshot(tmp_path)
    _checkpoint(snapshot)
    (snapshot / "model.safetensors").unlink()
    with pytest.raises(HubError, match=rf"the Hub repo '{REPO}' is not a checkpoint: model.safetensors missing"):
        pull(REPO, cache_dir=tmp_path)


def test_pull_of_a_repo_the_hub_does_not_know(tmp_path, online, monkeypatch):
    asked = {}

    def repo_info(self, repo_id, **kwargs):
        asked.update(kwargs, repo_id=repo_id)
        raise _http_error(RepositoryNotFoundError, 404, "404 Repository Not Found")

    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    with pytest.raises(HubError, match=r"The Hub has no model repo 'nobody/missing' .* `hf auth login`"):
        pull("nobody/missing", timeout_s=1.5, cache_dir=tmp_path)
    assert asked == {"repo_id": "nobody/missing", "revision": None, "timeout": 1.5}


def test_pull_when_the_hub_does_not_answer_says_so(tmp_path, online, monkeypatch):
    def repo_info(self, repo_id, **kwargs):
        raise httpx2.ConnectTimeout("timed out")

    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    with pytest.raises(HubError, match=r"the Hub could not be reached within 2.0 s \(ConnectTimeout: timed out\)"):
        pull(REPO, cache_dir=tmp_path)
    _checkpoint(_cached_snapshot(tmp_path))  # once cached, the same failure falls back to the cache
    assert pull(REPO, cache_dir=tmp_path) == tmp_path / "models--someone--glyph-model" / "snapshots" / COMMIT


def test_pull_online_downloads_only_the_hub_files_with_the_timeout(tmp_path, online, monkeypatch):
    monkeypatch.setattr(HfApi, "repo_info", lambda self, repo_id, **kwargs: object())
    download_folder = tmp_path / "snapshot"
    _checkpoint(download_folder)
    asked = {}

    def snapshot_download(repo_id, **kwargs):
        asked.update(kwargs, repo_id=repo_id)
        return str(download_folder)

    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)
    assert pull(REPO, revision="v1", timeout_s=3.0) == download_folder
    assert asked["repo_id"] == REPO and asked["revision"] == "v1"
    assert asked["allow_patterns"] == ["config.json", "model.safetensors", "README.md"]
    assert asked["etag_timeout"] == 3.0 and asked["local_files_only"] is False


def test_pull_of_a_revision_the_repo_lacks(tmp_path, online, monkeypatch):
    def repo_info(self, repo_id, **kwargs):
        raise _http_error(RevisionNotFoundError, 404, "404 Revision Not Found")

    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    with pytest.raises(HubError, match=rf"'{REPO}' has no revision 'v9'; pass an existing branch, tag or commit"):
        pull(REPO, revision="v9", cache_dir=tmp_path)


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (_http_error(HfHubHTTPError, 500, "500 Server Error"), rf"Downloading '{REPO}' from the Hub failed .*500"),
        (httpx2.ReadTimeout("read timed out"), rf"Downloading '{REPO}' from the Hub failed \(read timed out\)"),
        (LocalEntryNotFoundError("connection dropped"),
         rf"Could not pull '{REPO}': the download broke off \(connection dropped\), and the local Hub cache"),
    ],
)
def test_pull_when_the_download_fails_after_the_look_up(tmp_path, online, monkeypatch, failure, message):
    monkeypatch.setattr(HfApi, "repo_info", lambda self, repo_id, **kwargs: object())

    def snapshot_download(repo_id, **kwargs):
        raise failure

    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)
    with pytest.raises(HubError, match=message):
        pull(REPO, cache_dir=tmp_path)


# ---------------------------------------------------------------- push


@pytest.fixture
def run_folder(tmp_path):
    """A run folder as the CLI leaves it: Hub files, metrics, and things that must stay on the machine."""
    folder = tmp_path / "run"
    _checkpoint(folder)
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n')
    (folder / "trainer_state.safetensors").write_bytes(b"not for the Hub")
    (folder / "sub").mkdir()
    (folder / "sub" / "config.json").write_text("{}")
    return folder


@pytest.fixture
def fake_hub(monkeypatch, online):
    """Stand-ins for HfApi.create_repo / upload_folder that record their calls."""
    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", self.token, repo_id, kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, **kwargs):
        calls.append(("upload_folder", self.token, kwargs["repo_id"], kwargs))

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def _uploaded_files(upload_kwargs) -> set[str]:
    """What upload_folder would send, decided by huggingface_hub's own pattern filter."""
    folder = upload_kwargs["folder_path"]
    relative = [str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()]
    return set(filter_repo_objects(relative, allow_patterns=upload_kwargs["allow_patterns"]))


def test_push_uploads_only_the_hub_files(run_folder, fake_hub):
    url = push(run_folder, REPO, token="hf_test", private=True)
    assert url == f"https://huggingface.co/{REPO}"
    (create_name, create_token, create_repo_id, create_kwargs), (upload_name, upload_token, upload_repo_id, upload) = (
        fake_hub
    )
    assert (create_name, create_token, create_repo_id) == ("create_repo", "hf_test", REPO)
    assert create_kwargs["private"] is True and create_kwargs["exist_ok"] is True
    assert (upload_name, upload_token, upload_repo_id) == ("upload_folder", "hf_test", REPO)
    assert upload["folder_path"] == run_folder
    assert _uploaded_files(upload) == {"config.json", "model.safetensors", "README.md", "metrics.jsonl"}


def test_push_without_metrics_uploads_the_checkpoint_and_card(run_folder, fake_hub):
    (run_folder / "metrics.jsonl").unlink()
    push(run_folder, REPO, token="hf_test")
    assert _uploaded_files(fake_hub[-1][3]) == {"config.json", "model.safetensors", "README.md"}


def test_push_uses_the_cached_login(run_folder, fake_hub, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_cached")
    push(run_folder, REPO)
    assert [call[1] for call in fake_hub] == ["hf_cached", "hf_cached"]


def test_push_without_a_token_says_how_to_set_one(run_folder, fake_hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(HubError) as caught:
        push(run_folder, REPO)
    message = str(caught.value)
    assert "needs a Hugging Face token with write access" in message
    assert "token=..." in message and "HF_TOKEN" in message and "hf auth login" in message
    assert fake_hub == []


def test_push_names_the_missing_weights(run_folder, fake_hub):
    (run_folder / "model.safetensors").unlink()
    with pytest.raises(HubError, match=rf"{run_folder} lacks model.safetensors: push uploads config.json, "):
        push(run_folder, REPO, token="hf_test")
    assert fake_hub == []


def test_push_of_a_missing_folder(tmp_path, fake_hub):
    with pytest.raises(HubError, match=r"is not a folder; push takes a run folder"):
        push(tmp_path / "nowhere", REPO, token="hf_test")


def test_push_to_an_invalid_repo_id(run_folder, fake_hub):
    with pytest.raises(HubError, match=r"'bad//id' is not a Hub repo id .* use 'owner/name'"):
        push(run_folder, "bad//id", token="hf_test")


def test_push_refused_by_the_hub(run_folder, monkeypatch, online):
    def create_repo(self, repo_id, **kwargs):
        raise _http_error(HfHubHTTPError, 401, "401 Unauthorized: invalid token")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    with pytest.raises(HubError, match=r"The Hub refused to push .* 401 Unauthorized.* token has write access"):
        push(run_folder, REPO, token="hf_wrong")


def test_push_without_a_connection(run_folder, monkeypatch, online):
    def create_repo(self, repo_id, **kwargs):
        raise httpx2.ConnectError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    with pytest.raises(HubError, match=r"Could not reach the Hub to push .*name resolution.*check the connection"):
        push(run_folder, REPO, token="hf_test")


def test_push_while_offline(run_folder, offline):
    with pytest.raises(HubError, match=r"HF_HUB_OFFLINE is set, so nothing can be pushed; unset it"):
        push(run_folder, REPO, token="hf_test")
