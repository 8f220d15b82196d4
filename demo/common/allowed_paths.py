"""Which server paths a visitor may name: checkpoints to load, and folders to train on.

On a public Space, a typed path is a visitor reaching into the server: any folder could be loaded as a checkpoint,
and `../../etc`-style paths could tell which folders exist. So a checkpoint must be a bundled one, a run of this app,
a folder under one the operator lists in MEMVIR_ALLOWED_FOLDERS, or a Hub repo id; a training folder must lie under
one of those listed folders. Anything else is refused with one message that is the same whether the path exists or
not: paths are compared as strings (`..` removed, and links resolved against the listed folders), and nothing
outside the allowed places is looked at.
"""

from __future__ import annotations

import os
from pathlib import Path

from demo.common.settings import AppSettings

CHECKPOINT_REFUSED = ("the checkpoint typed is neither an existing folder nor a Hub repo id this app may load: choose "
                      "a bundled checkpoint or a run of this app from the list, or type a Hub repo id such as "
                      "owner/name")


class PathRefused(ValueError):
    """A path outside the places this app may read."""


def _resolved(text: str) -> Path | None:
    try:
        return Path(text).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte, an unknown ~user
        return None


def _normalized(path: str | Path) -> Path:
    """Absolute, with `..` removed as written (links kept: the app's own folders may hold linked checkpoints)."""
    return Path(os.path.normpath(os.path.abspath(os.path.expanduser(path))))


def _under_allowed_folder(path: Path, settings: AppSettings) -> bool:
    return any(path.is_relative_to(root.expanduser().resolve()) for root in settings.allowed_folders)


def _is_repo_id(text: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def checkpoint_source(choice: str, settings: AppSettings) -> Path | str:
    """The checkpoint `choice` names: an allowed local folder (absolute) or a Hub repo id; PathRefused otherwise.

    Local: a folder directly in the bundled checkpoints folder or the app's runs folder, or anywhere under an
    allowed folder (MEMVIR_ALLOWED_FOLDERS) once links are resolved. A repo id that is also the relative path of
    something on this machine is refused too: the Hub pull would read that local path instead.
    """
    if "\0" not in choice and _normalized(choice).parent in (_normalized(settings.checkpoints_dir),
                                                             _normalized(settings.runs_dir)):
        return _normalized(choice)
    path = _resolved(choice)
    if path is not None and _under_allowed_folder(path, settings):
        return path
    if _is_repo_id(choice) and not Path(choice).exists():
        return choice
    raise PathRefused(CHECKPOINT_REFUSED)


def dataset_folder(text: str, settings: AppSettings) -> Path:
    """The training folder `text` names (resolved), when it lies under an allowed folder; PathRefused otherwise."""
    path = _resolved(text)
    if path is None or not _under_allowed_folder(path, settings):
        if not settings.allowed_folders:
            raise PathRefused("this app trains on no folder of its machine (its operator may list some in "
                              "MEMVIR_ALLOWED_FOLDERS): upload a zip of class folders instead")
        listed = ", ".join(str(root) for root in settings.allowed_folders)
        raise PathRefused(f"the folder typed is not under a folder this app may read ({listed}): type a folder "
                          "there, or upload a zip of class folders")
    if not path.is_dir():
        raise PathRefused(f"{path} is not a folder")
    return path
