"""On a Space every visitor acts on the Hub as themselves: the loopback Hub (tests/hub_server.py) is told who each
request came from by its Authorization header, and the server's own token (HF_TOKEN here, someone's) must never be
among them for a visitor's push or pull. Gradio injects a signed-in visitor's `gr.OAuthToken` into the handlers;
these tests call the handlers with one, as gradio does after "Sign in with Hugging Face"."""

import shutil
import time
from pathlib import Path

import gradio as gr
import pytest
from hub_server import OTHER_TOKEN, WRITE_TOKEN, point_client_at

from demo.common.hub_access import ANONYMOUS, on_space, sign_in_offered, visitor_token
from demo.common.settings import AppSettings
from demo.retrieve.service import RetrievalError, RetrievalService
from demo.runs.live_run import LiveRun
from demo.runs.manager import RunManager
from demo.train import tab as train_tab
from demo.train import words
from demo.train.poll import PollState
from memvir.config import TrainConfig

SERVER_AUTHORIZATION = f"Bearer {WRITE_TOKEN}"  # the owner's token, which the Space holds as HF_TOKEN
VISITOR = gr.OAuthToken(token=OTHER_TOKEN, scope="openid profile write-repos", expires_at=int(time.time()) + 3600)


@pytest.fixture
def hub(loopback_hub, monkeypatch, tmp_path):
    """A simulated Space: SPACE_ID and the owner's HF_TOKEN set, the Hub client pointed at the loopback Hub."""
    point_client_at(monkeypatch, loopback_hub.url, tmp_path / "hf-home")
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    monkeypatch.setenv("SPACE_ID", "someone/memvir-studio")
    monkeypatch.delenv("OAUTH_CLIENT_ID", raising=False)
    return loopback_hub


def _settings(tmp_path, space=True) -> AppSettings:
    return AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints", umap=False, space=space)


@pytest.fixture
def finished(tiny_checkpoints, tmp_path, hub):
    """(run manager on a Space, the handlers, the poll state of alice's finished run)."""
    settings = _settings(tmp_path)
    folder = settings.runs_dir / "alice-run"
    shutil.copytree(tiny_checkpoints / "glyphs-mini-tiny", folder)
    runs = RunManager(settings)
    config = TrainConfig.from_json((folder / "train_config.json").read_text())
    run = LiveRun.from_folder(folder, "alice", config, "main")
    runs._runs[run.id] = run  # as a run that trained on this server and finished
    yield runs, train_tab.TrainHandlers(runs), PollState(run_id=run.id)
    runs.close()


def test_the_settings_know_a_space_and_the_token_policy_follows(monkeypatch, tmp_path):
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert not on_space() and AppSettings.from_env().space is False
    assert visitor_token(None, space=False) is None  # locally: the machine's own login
    monkeypatch.setenv("SPACE_ID", "someone/memvir-studio")
    assert on_space() and AppSettings.from_env().space is True
    assert visitor_token(None, space=True) is ANONYMOUS is False  # huggingface_hub's "no token at all"
    assert visitor_token(VISITOR, space=True) == OTHER_TOKEN
    assert not sign_in_offered()  # the Space's README did not ask for OAuth
    monkeypatch.setenv("OAUTH_CLIENT_ID", "an-id")
    assert not sign_in_offered()  # gradio would mock the sign-in here, with this machine's login
    monkeypatch.setenv("SYSTEM", "spaces")
    assert sign_in_offered()


def test_an_anonymous_visitor_cannot_push_and_no_request_leaves(finished, hub):
    runs, train, state = finished
    with pytest.warns(UserWarning):
        message = train.push_to_hub(state, "someone/stolen", visitor="alice")
    assert message == f"⚠️ {words.NO_SIGN_IN_ON_THIS_SPACE}"
    assert hub.requests == [] and hub.repos == {}
    # the page tells them at once: Push is off until they sign in
    _, button, note = train_tab.opened(runs, "alice")
    assert button == gr.update(interactive=False) and note == words.NO_SIGN_IN_ON_THIS_SPACE


def test_a_signed_in_visitor_pushes_with_their_own_token_only(finished, hub):
    runs, train, state = finished
    assert train.push_to_hub(state, "other/my-model", visitor="alice", oauth_token=VISITOR) == (
        f"Pushed to {hub.url}/other/my-model")
    assert sorted(hub.files_at("other/my-model")) == [".gitattributes", "README.md", "config.json", "metrics.jsonl",
                                                       "model.safetensors"]
    api_calls = [auth for (method, path), auth in zip(hub.requests, hub.authorizations, strict=True)
                 if not path.startswith("/upload/")]  # the LFS storage host is sent no token, as on the Hub
    assert api_calls and set(api_calls) == {f"Bearer {OTHER_TOKEN}"}
    assert SERVER_AUTHORIZATION not in hub.authorizations
    _, button, note = train_tab.opened(runs, "alice", VISITOR)
    assert button == gr.update(interactive=True) and note == words.PUSH_AS_YOURSELF


def test_a_signed_in_visitor_cannot_write_where_their_token_may_not_and_sees_no_server_path(finished, hub):
    """The owner's namespace is the visitor's to read at most: the Hub refuses their token, and the refusal names
    the run by its name, not the server's folder."""
    runs, train, state = finished
    with pytest.warns(UserWarning):
        message = train.push_to_hub(state, "someone/overwrite-me", visitor="alice", oauth_token=VISITOR)
    assert message.startswith("⚠️ The Hub refused to push run 'alice-run' to 'someone/overwrite-me': ")
    assert str(runs.settings.data_dir) not in message and "/runs/" not in message
    assert "someone/overwrite-me" not in hub.repos
    assert SERVER_AUTHORIZATION not in hub.authorizations


def test_an_anonymous_pull_by_repo_id_sends_no_token_and_a_private_repo_reads_as_not_found(
        tiny_checkpoints, hub, tmp_path):
    files = {name: (tiny_checkpoints / "glyphs-mini-tiny" / name).read_bytes()
             for name in ("config.json", "model.safetensors", "README.md")}
    for repo_id, private in (("someone/private-model", True), ("someone/public-model", False)):
        hub.create_repo(repo_id, private=private)
        hub.add_commit(repo_id, files)
    retrieval = RetrievalService(_settings(tmp_path))
    with pytest.raises(RetrievalError, match=r"the Hub has no public model repo 'someone/private-model'.* This Space "
                                             r"reads the Hub without any token"):
        retrieval.load_checkpoint("someone/private-model")
    assert retrieval.load_checkpoint("someone/public-model").model is not None
    assert hub.authorizations and set(hub.authorizations) == {None}
    # locally the one user's login still reads their private repo, as the command line does
    local = RetrievalService(_settings(tmp_path / "local", space=False))
    assert local.load_checkpoint("someone/private-model").model is not None
    assert SERVER_AUTHORIZATION in hub.authorizations


def test_a_space_asks_its_visitors_to_sign_in_and_installs_what_gradio_needs_for_it():
    """The README's Space header asks for OAuth with the scope a push needs (create a repo, write to it), and
    requirements.txt brings gradio's oauth extra (tests/app/test_space.py starts the app with a Space's sign-in)."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    header = yaml.safe_load((root / "README.md").read_text().split("---")[1])
    assert header["hf_oauth"] is True and header["hf_oauth_scopes"] == ["contribute-repos"]
    pins = {line.split("==")[0] for line in (root / "requirements.txt").read_text().splitlines() if "==" in line}
    assert {"authlib", "itsdangerous"} <= pins
