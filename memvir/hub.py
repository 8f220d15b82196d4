"""Pull checkpoints from the Hugging Face Hub (or a local folder) and push run folders to it, failing fast and clearly.

A checkpoint is a folder with `config.json` + `model.safetensors` (+ `README.md`), as `EmbeddingModel.save_pretrained`
writes it. Offline, a wrong repo id, a missing token or an incomplete folder each give a `HubError` that says what was
tried and what to do, within seconds: huggingface_hub's own repository look-up has no time limit, so `pull` makes
that look-up itself with one, and falls back to the local Hub cache when the Hub cannot be reached.
"""

from pathlib import Path

import huggingface_hub
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from memvir.checkpoint import HUB_FILES, METRICS_LOG, MODEL_FILES
from memvir.models.embedding_model import EmbeddingModel

try:  # the HTTP client huggingface_hub raises from: httpx2 since its 2.0, httpx in 1.x (the lent GPU image's 1.33)
    import httpx2 as _http
except ImportError:
    import httpx as _http

OPTIONAL_PUSH_FILES = (METRICS_LOG,)
"""Uploaded beside HUB_FILES (what a pull fetches and a push must find) when the run folder has them."""

DEFAULT_TIMEOUT_S = 2.0
"""Seconds the Hub gets to answer a look-up before `pull` settles for the local cache."""

PUSH_TIMEOUT_S = 10.0
"""Seconds the Hub gets to answer `push`'s first look-up. huggingface_hub gives creating a repo and uploading no time
limit, so a Hub that takes the connection and never answers would hold a push for good; a look-up with one first
makes that a clear error instead (the upload itself may take as long as it needs)."""

_HUB_UNREACHABLE = (OfflineModeIsEnabled, _http.TransportError)
"""Errors meaning "no answer from the Hub" (offline mode, no network, timeout), as opposed to an answer of "no"."""


class HubError(ValueError):
    """A checkpoint could not be pulled or pushed; the message says what was tried and what to do."""


def pull(
    repo_id_or_path: str | Path,
    revision: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    cache_dir: str | Path | None = None,
    token: str | bool | None = None,
) -> Path:
    """The local folder holding a checkpoint: `repo_id_or_path` itself if it is a folder, else a Hub snapshot.

    A repo id is looked up on the Hub with a `timeout_s` limit and its `HUB_FILES` downloaded into the Hub cache
    (`cache_dir`, default HF_HUB_CACHE). When the Hub cannot be reached (HF_HUB_OFFLINE=1, no network, timeout),
    the cached snapshot is used if there is one.

    Args:
        repo_id_or_path: a checkpoint folder (a run folder, or one `EmbeddingModel.save_pretrained` wrote), or a Hub
            model repo id, "owner/name".
        revision: for a repo id, the branch, tag or commit to fetch; None for the default branch.
        timeout_s: how long the Hub may take to answer the look-up before the cache is used.
        cache_dir: the Hub cache to download into and read from; None for HF_HUB_CACHE.
        token: the Hub token to read with: None for this machine's (HF_TOKEN, else the cached login), False for none
            at all (a private repo then reads as not found), or a token.

    Returns:
        The folder holding config.json and model.safetensors.

    Raises:
        HubError: neither a folder nor a repo id, a repo or revision the Hub does not have, a Hub that cannot be
            reached with nothing cached, or a folder without the model's files, in words that say what to do.
    """
    folder = Path(repo_id_or_path).expanduser()
    if folder.is_dir():
        return _checked_checkpoint_folder(folder, f"the local folder {folder}")

    repo_id = str(repo_id_or_path)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise HubError(
            f"{repo_id!r} is neither an existing folder nor a Hub repo id ({error}). Pass a checkpoint folder "
            "(config.json + model.safetensors) or a repo id such as 'owner/name'."
        ) from error

    wanted = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    hub_unreachable = _look_up(repo_id, revision, timeout_s, token)
    try:
        snapshot = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            allow_patterns=list(HUB_FILES),
            etag_timeout=timeout_s,
            local_files_only=hub_unreachable is not None,
        )
    except LocalEntryNotFoundError as error:
        raise _not_cached(wanted, hub_unreachable, error, timeout_s, cache_dir) from error
    except (*_HUB_UNREACHABLE, HfHubHTTPError) as error:  # the Hub answered the look-up, then failed mid-download
        raise HubError(f"Downloading {wanted} from the Hub failed ({error}); try again.") from error
    return _checked_checkpoint_folder(Path(snapshot), f"the Hub repo {wanted}")


def _not_cached(wanted: str, hub_unreachable: Exception | None, error: Exception, timeout_s: float,
                cache_dir: str | Path | None) -> HubError:
    """Why a pull found no snapshot: the Hub out of reach (and why) or a download cut off, and nothing cached."""
    if isinstance(hub_unreachable, OfflineModeIsEnabled):
        reason = "HF_HUB_OFFLINE is set"
    elif hub_unreachable is not None:
        failure = f"{type(hub_unreachable).__name__}: {hub_unreachable}"
        reason = f"the Hub could not be reached within {timeout_s} s ({failure})"
    else:
        reason = f"the download broke off ({error})"
    cache = cache_dir or huggingface_hub.constants.HF_HUB_CACHE
    return HubError(
        f"Could not pull {wanted}: {reason}, and the local Hub cache ({cache}) holds no complete snapshot of it. "
        "Connect to the internet (unset HF_HUB_OFFLINE, or raise timeout_s) and pull once to cache it, or pass "
        "a local checkpoint folder instead."
    )


def _look_up(repo_id: str, revision: str | None, timeout_s: float, token: str | bool | None) -> Exception | None:
    """Ask the Hub, within `timeout_s`, whether it has the repo at `revision`: None when it does, the error that kept
    it from answering when it cannot be reached (the cache may then serve), HubError when it answers no."""
    try:
        HfApi(token=token).repo_info(repo_id, revision=revision, timeout=timeout_s)
    except RepositoryNotFoundError as error:  # includes gated repos
        raise HubError(
            f"The Hub has no model repo {repo_id!r} that {'anyone' if token is False else 'this machine'} may read. "
            "Check the spelling ('owner/name'); for a private or gated repo pass token=... or log in with "
            "`hf auth login`."
        ) from error
    except RevisionNotFoundError as error:
        raise HubError(f"{repo_id!r} has no revision {revision!r}; pass an existing branch, tag or commit.") from error
    except (*_HUB_UNREACHABLE, HfHubHTTPError) as error:  # HfHubHTTPError here: a Hub-side failure (5xx and such)
        return error
    return None


def _checked_checkpoint_folder(folder: Path, described_as: str) -> Path:
    missing = [name for name in MODEL_FILES if not (folder / name).is_file()]
    if missing:
        raise HubError(
            f"{described_as} is not a checkpoint: {', '.join(missing)} missing. A checkpoint holds "
            f"{' and '.join(MODEL_FILES)}, as EmbeddingModel.save_pretrained and `python -m memvir train` write."
        )
    return folder


def load_model(
    repo_id_or_path: str | Path,
    revision: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **pull_kwargs,
) -> EmbeddingModel:
    """`pull` the checkpoint, then load it with `EmbeddingModel.from_pretrained` (strict keys, eval mode)."""
    return EmbeddingModel.from_pretrained(pull(repo_id_or_path, revision, timeout_s, **pull_kwargs))


def push(
    run_dir: str | Path,
    repo_id: str,
    token: str | bool | None = None,
    private: bool = False,
    commit_message: str = "Upload MemVir embedding model",
    timeout_s: float = PUSH_TIMEOUT_S,
) -> str:
    """Upload a run folder's Hub files (HUB_FILES, plus metrics.jsonl when present) to `repo_id`; its URL back.

    The repo is created when it does not exist. The token is `token`, else (None) HF_TOKEN, else the cached login
    (`hf auth login`); it needs write access. `token=False` (no token at all) is refused before any request.
    Nothing else in the run folder (trainer state, logs) is uploaded. A Hub that does not answer within `timeout_s`
    is an error (PUSH_TIMEOUT_S). The messages name the run folder by its name only: the app shows them to
    visitors, who have no business with the server's paths.

    Args:
        run_dir: a run folder written by `python -m memvir train --out` (or any folder holding the HUB_FILES).
        repo_id: the model repo to upload into, "owner/name".
        token: the Hub token to write with: None for this machine's (HF_TOKEN, else the cached login), False for
            none (refused), or a token.
        private: create the repo private (an existing repo keeps its visibility).
        commit_message: the message of the upload's commit.
        timeout_s: how long the Hub may take to answer the first request.

    Returns:
        The URL of the repo.

    Raises:
        HubError: a folder without the Hub files, a bad repo id, no token, an unreachable Hub or a refusal, in
            words that say what to do.
    """
    folder = Path(run_dir)
    if not folder.is_dir():
        raise HubError(f"{folder} is not a folder; push takes a run folder written by `python -m memvir train --out`")
    missing = [name for name in HUB_FILES if not (folder / name).is_file()]
    if missing:
        raise HubError(
            f"{folder} lacks {', '.join(missing)}: push uploads {', '.join(HUB_FILES)} as EmbeddingModel."
            "save_pretrained writes them. Point it at a finished run folder, or save the model into this one."
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise HubError(f"{repo_id!r} is not a Hub repo id ({error}); use 'owner/name'.") from error
    if token is None:
        token = huggingface_hub.get_token()
    if not token:
        raise HubError(
            "Pushing needs a Hugging Face token with write access: pass token=..., set the HF_TOKEN environment "
            "variable, or log in once with `hf auth login` (tokens: https://huggingface.co/settings/tokens)."
        )

    files = [name for name in (*HUB_FILES, *OPTIONAL_PUSH_FILES) if (folder / name).is_file()]
    api = HfApi(token=token)
    try:
        try:
            api.repo_info(repo_id, timeout=timeout_s)  # the one call given a time limit: see PUSH_TIMEOUT_S
        except RepositoryNotFoundError:
            pass  # a new repo (or one this token may not read, which create_repo then refuses)
        repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=repo_url.repo_id,
            repo_type="model",
            folder_path=folder,
            allow_patterns=files,  # exact names: nothing else in the run folder leaves the machine
            commit_message=commit_message,
        )
    except OfflineModeIsEnabled as error:
        raise HubError("HF_HUB_OFFLINE is set, so nothing can be pushed; unset it and push again.") from error
    except _http.TransportError as error:
        raise HubError(f"Could not reach the Hub to push run {folder.name!r} within {timeout_s} s "
                       f"({type(error).__name__}: {error}); check the connection.") from error
    except HfHubHTTPError as error:
        raise _refused(folder, repo_id, error) from error
    except RuntimeError as error:  # huggingface_hub wraps a failed LFS upload: "Error while uploading 'x' to the Hub."
        if not isinstance(error.__cause__, (HfHubHTTPError, _http.TransportError)):
            raise
        raise _refused(folder, repo_id, f"{error} {error.__cause__}") from error
    return str(repo_url)


def _refused(folder: Path, repo_id: str, reason) -> HubError:
    return HubError(
        f"The Hub refused to push run {folder.name!r} to {repo_id!r}: {reason}. Check that the token has write access "
        "to that owner and that the repo id is spelled right."
    )
