"""pull / push / load_model: over real HTTP against a Hub on 127.0.0.1 (tests/hub_server.py), and what they do
without one (local folders, offline, local refusals).

The Hub tests point this process's huggingface_hub at the loopback Hub (`hub_server.point_client_at`); nothing
leaves the machine. Every failure pull and push promise goes through the client's real requests and error answers:
an unknown repo, a private one without a token, an unknown revision, a Hub that does not answer (within the limit
plus a second), a download that breaks, a repo or a folder missing a file, a refused push.
"""

import hashlib
import time
from types import SimpleNamespace

import huggingface_hub
import pytest
import torch
from hub_server import OTHER_TOKEN, READ_TOKEN, USER, WRITE_TOKEN, point_client_at
from served_app import free_port

from memvir.hub import HubError, load_model, pull, push
from memvir.models.embedding_model import EmbeddingModel

REPO = f"{USER}/glyph-model"
HUB_FILES = ["README.md", "config.json", "model.safetensors"]


@pytest.fixture
def hf_home(tmp_path):
    return tmp_path / "hf-home"


@pytest.fixture
def hub(loopback_hub, monkeypatch, hf_home):
    """The loopback Hub, with this process's client pointed at it (cache and token files in `hf_home`)."""
    point_client_at(monkeypatch, loopback_hub.url, hf_home)
    return loopback_hub


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _checkpoint(folder, **model_kwargs):
    model = EmbeddingModel(embedding_dim=16, **model_kwargs)
    model.save_pretrained(folder, metrics={"recall@1": 0.5})
    return model


def _files(folder, names=HUB_FILES) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in names}


def _publish(hub, folder, repo_id=REPO, private=False, extra=None) -> str:
    """Put a checkpoint folder's Hub files (and `extra` files) on the loopback Hub as its owner would; the commit."""
    hub.create_repo(repo_id, private=private)
    return hub.add_commit(repo_id, {**_files(folder), **(extra or {})})


def _same_weights(a: EmbeddingModel, b: EmbeddingModel) -> bool:
    first, second = a.state_dict(), b.state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


# ---------------------------------------------------------------- pull: local folders and offline


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


# ---------------------------------------------------------------- pull over HTTP


def test_pull_downloads_the_hub_files_and_nothing_else(hub, tmp_path, hf_home):
    model = _checkpoint(tmp_path / "model")
    commit = _publish(hub, tmp_path / "model", extra={"metrics.jsonl": b'{"step": 1}\n',
                                                      "runs/trainer_state.pt": b"state"})
    hub.tree_page_size = 2  # the listing comes in pages, as a large repo's does on the Hub

    folder = pull(REPO)
    assert folder == hf_home / "hub" / "models--someone--glyph-model" / "snapshots" / commit
    assert sorted(path.name for path in folder.iterdir()) == HUB_FILES
    assert _files(folder) == _files(tmp_path / "model")
    assert not [path for path in hub.paths_requested() if path.endswith(("metrics.jsonl", "trainer_state.pt"))]
    assert _same_weights(load_model(REPO), model)


def test_pull_of_a_tag_gets_that_commit(hub, tmp_path):
    first = _checkpoint(tmp_path / "first")
    _publish(hub, tmp_path / "first")
    hub.tag(REPO, "v1")
    _checkpoint(tmp_path / "second")
    hub.add_commit(REPO, _files(tmp_path / "second"))
    assert _files(pull(REPO, revision="v1")) == _files(tmp_path / "first")
    assert _files(pull(REPO)) == _files(tmp_path / "second")
    assert _same_weights(EmbeddingModel.from_pretrained(REPO, revision="v1"), first)


@pytest.mark.parametrize("token", [None, WRITE_TOKEN])
def test_pull_of_a_repo_the_hub_does_not_know(hub, monkeypatch, token):
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(HubError, match=r"The Hub has no model repo 'nobody/missing' that this machine may read\. "
                                       r"Check the spelling .* `hf auth login`"):
        pull("nobody/missing", timeout_s=1.5)
    assert hub.paths_requested() == ["/api/models/nobody/missing"]  # the look-up's answer ends it


def test_pull_of_a_private_repo_needs_a_token(hub, tmp_path, monkeypatch):
    model = _checkpoint(tmp_path / "model")
    _publish(hub, tmp_path / "model", private=True)
    with pytest.raises(HubError, match=r"no model repo 'someone/glyph-model' that this machine may read.*"
                                       r"for a private or gated repo pass token="):
        pull(REPO)
    with pytest.raises(HubError, match=r"no model repo 'someone/glyph-model'"):  # someone else's token
        pull(REPO, token=OTHER_TOKEN)
    assert _same_weights(load_model(REPO, token=READ_TOKEN), model)


def test_token_false_sends_no_token_even_where_this_machine_has_one(hub, tmp_path, monkeypatch):
    """token=False is a visitor without a sign-in on a Space: no request carries the machine's token (HF_TOKEN or the
    cached login), a private repo reads as not found to anyone, a public one is pulled, and a push is refused before
    any request."""
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    model = _checkpoint(tmp_path / "model")
    _publish(hub, tmp_path / "model", private=True)
    with pytest.raises(HubError, match=r"no model repo 'someone/glyph-model' that anyone may read"):
        pull(REPO, token=False)
    _publish(hub, tmp_path / "model", repo_id="someone/public-model")
    assert _same_weights(load_model("someone/public-model", token=False), model)
    assert hub.authorizations and set(hub.authorizations) == {None}
    run = tmp_path / "run"
    model.save_pretrained(run)
    requests = len(hub.requests)
    with pytest.raises(HubError, match="needs a Hugging Face token with write access"):
        push(run, "someone/new-model", token=False)
    assert len(hub.requests) == requests
    # the machine's own token is still what None means (the CLI, a local app)
    before = len(hub.requests)
    pull(REPO)
    look_up = hub.requests.index(("GET", f"/api/models/{REPO}"), before)
    assert hub.authorizations[look_up] == f"Bearer {WRITE_TOKEN}"


def test_pull_of_a_revision_the_repo_lacks(hub, tmp_path):
    _checkpoint(tmp_path)
    _publish(hub, tmp_path)
    with pytest.raises(HubError, match=rf"'{REPO}' has no revision 'v9'; pass an existing branch, tag or commit"):
        pull(REPO, revision="v9")


def test_pull_of_a_repo_without_weights_names_the_file(hub, tmp_path):
    _checkpoint(tmp_path)
    hub.create_repo(REPO)
    hub.add_commit(REPO, _files(tmp_path, ["config.json", "README.md"]))
    with pytest.raises(HubError, match=rf"the Hub repo '{REPO}' is not a checkpoint: model.safetensors missing"):
        pull(REPO)


def test_pull_when_the_hub_does_not_answer_says_so_within_its_limit(hub, silent_server, monkeypatch, tmp_path):
    model = _checkpoint(tmp_path / "model")
    _publish(hub, tmp_path / "model")
    point_client_at(monkeypatch, silent_server.url, tmp_path / "elsewhere")
    started = time.monotonic()
    with pytest.raises(HubError, match=r"Could not pull 'someone/glyph-model': the Hub could not be reached within "
                                       r"1.0 s \(ReadTimeout: timed out\), and the local Hub cache"):
        pull(REPO, timeout_s=1.0)
    assert time.monotonic() - started < 1.0 + 1  # the limit pull promises, plus a second

    cache = tmp_path / "cache"
    point_client_at(monkeypatch, hub.url, tmp_path / "elsewhere")
    pulled = pull(REPO, cache_dir=cache)  # cached once, online...
    point_client_at(monkeypatch, silent_server.url, tmp_path / "elsewhere")
    started = time.monotonic()
    assert pull(REPO, timeout_s=1.0, cache_dir=cache) == pulled  # ...the same silence falls back to the cache
    assert time.monotonic() - started < 1.0 + 1
    assert _same_weights(EmbeddingModel.from_pretrained(pulled), model)


def test_pull_offline_uses_what_an_online_pull_cached(hub, tmp_path, monkeypatch):
    _checkpoint(tmp_path / "model")
    _publish(hub, tmp_path / "model")
    online = pull(REPO)
    asked = len(hub.requests)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert pull(REPO) == online
    assert len(hub.requests) == asked  # offline: not one request


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("GET", rf"(?s)Downloading '{REPO}' from the Hub failed \(.*500 .*\); try again"),
        ("HEAD", rf"(?s)Could not pull '{REPO}': the download broke off \(An error happened while trying to locate the "
                 r"file on the Hub.*\), and the local Hub cache"),
    ],
)
def test_pull_when_the_download_fails_after_the_look_up(hub, tmp_path, method, message, monkeypatch):
    _checkpoint(tmp_path / "model")
    _publish(hub, tmp_path / "model")
    hub.fail(method, r"/resolve/.*/config\.json$", 500)  # the look-up and the listing answer; one file fails
    # huggingface_hub backs off between its retries of a 500 (1 + 2 + 4 + 8 + 8 s): the waits are noted, not slept
    waits = []
    monkeypatch.setattr(huggingface_hub.utils._http, "time", SimpleNamespace(sleep=waits.append))
    with pytest.raises(HubError, match=message):
        pull(REPO)
    assert all(0 < wait <= 8 for wait in waits)


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


def test_push_uploads_only_the_hub_files(hub, run_folder):
    url = push(run_folder, REPO, token=WRITE_TOKEN, private=True)
    assert url == f"{hub.url}/{REPO}"
    repo = hub.repos[REPO]
    assert repo.private is True
    head = repo.resolve("main")
    assert (head.author, head.title) == (USER, "Upload MemVir embedding model")
    assert hub.files_at(REPO) == {".gitattributes": hub.files_at(REPO, head.parent)[".gitattributes"],
                                  **_files(run_folder, [*HUB_FILES, "metrics.jsonl"])}
    weights = head.files["model.safetensors"]  # stored with LFS, as the Hub's .gitattributes say
    assert weights.lfs_sha256 == hashlib.sha256((run_folder / "model.safetensors").read_bytes()).hexdigest()
    assert head.files["config.json"].lfs_sha256 is None
    assert "/api/validate-yaml" in hub.paths_requested("POST")  # the card was checked before the upload


def test_push_to_an_existing_repo_adds_a_commit(hub, run_folder):
    push(run_folder, REPO, token=WRITE_TOKEN)
    first = hub.repos[REPO].refs["main"]
    (run_folder / "metrics.jsonl").unlink()
    _checkpoint(run_folder)  # new weights
    assert push(run_folder, REPO, token=WRITE_TOKEN) == f"{hub.url}/{REPO}"  # the Hub's 409 "exists" is fine
    head = hub.repos[REPO].resolve("main")
    assert head.parent == first
    assert {name: hub.files_at(REPO)[name] for name in HUB_FILES} == _files(run_folder)


def test_push_without_metrics_uploads_the_checkpoint_and_card(hub, run_folder):
    (run_folder / "metrics.jsonl").unlink()
    push(run_folder, REPO, token=WRITE_TOKEN)
    assert sorted(hub.files_at(REPO)) == [".gitattributes", *HUB_FILES]


def test_push_uses_the_cached_login(hub, run_folder, hf_home):
    hf_home.mkdir(parents=True)
    (hf_home / "token").write_text(WRITE_TOKEN)
    push(run_folder, REPO)
    assert hub.repos[REPO].resolve("main").author == USER


@pytest.mark.parametrize(
    ("token", "repo_id", "reason"),
    [
        ("hf_not_a_token", REPO, "401 .*Invalid credentials in Authorization header"),
        (READ_TOKEN, REPO, "403 .*no write access"),
        (WRITE_TOKEN, "other/glyph-model", "403 .*rights to create a model under the namespace \"other\""),
    ],
)
def test_push_refused_by_the_hub(hub, run_folder, token, repo_id, reason):
    with pytest.raises(HubError, match=rf"(?s)The Hub refused to push run '{run_folder.name}' to '{repo_id}': "
                                       rf".*{reason}.* Check that the token has write access"):
        push(run_folder, repo_id, token=token)
    assert hub.repos == {}


def test_push_whose_upload_the_storage_refuses(hub, run_folder):
    hub.fail("PUT", r"^/upload/", 403)
    with pytest.raises(HubError, match=r"(?s)The Hub refused to push .*Error while uploading 'model.safetensors' "
                                       r"to the Hub\..*403"):
        push(run_folder, REPO, token=WRITE_TOKEN)
    assert sorted(hub.files_at(REPO)) == [".gitattributes"]  # created, nothing committed


def test_push_when_the_hub_does_not_answer_says_so_within_its_limit(silent_server, run_folder, monkeypatch,
                                                                     hf_home):
    point_client_at(monkeypatch, silent_server.url, hf_home)
    started = time.monotonic()
    with pytest.raises(HubError, match=rf"Could not reach the Hub to push run '{run_folder.name}' within 1.0 s "
                                       r"\(ReadTimeout: timed out\); check the connection"):
        push(run_folder, REPO, token=WRITE_TOKEN, timeout_s=1.0)
    assert time.monotonic() - started < 1.0 + 1


def test_push_without_a_connection(run_folder, monkeypatch, hf_home):
    point_client_at(monkeypatch, f"http://127.0.0.1:{free_port()}", hf_home)  # a port nothing listens on
    with pytest.raises(HubError, match=r"Could not reach the Hub to push .* \(ConnectError: .*check the connection"):
        push(run_folder, REPO, token=WRITE_TOKEN)


# ---------------------------------------------------------------- push: refused before any request


def test_push_without_a_token_says_how_to_set_one(hub, run_folder):
    with pytest.raises(HubError) as caught:
        push(run_folder, REPO)
    message = str(caught.value)
    assert "needs a Hugging Face token with write access" in message
    assert "token=..." in message and "HF_TOKEN" in message and "hf auth login" in message
    assert hub.requests == []


def test_push_names_the_missing_weights(hub, run_folder):
    (run_folder / "model.safetensors").unlink()
    with pytest.raises(HubError, match=rf"{run_folder} lacks model.safetensors: push uploads config.json, "):
        push(run_folder, REPO, token=WRITE_TOKEN)
    assert hub.requests == []


def test_push_of_a_missing_folder(hub, tmp_path):
    with pytest.raises(HubError, match=r"is not a folder; push takes a run folder"):
        push(tmp_path / "nowhere", REPO, token=WRITE_TOKEN)
    assert hub.requests == []


def test_push_to_an_invalid_repo_id(hub, run_folder):
    with pytest.raises(HubError, match=r"'bad//id' is not a Hub repo id .* use 'owner/name'"):
        push(run_folder, "bad//id", token=WRITE_TOKEN)
    assert hub.requests == []


def test_push_while_offline(hub, run_folder, offline):
    with pytest.raises(HubError, match=r"HF_HUB_OFFLINE is set, so nothing can be pushed; unset it"):
        push(run_folder, REPO, token=WRITE_TOKEN)
    assert hub.requests == []
