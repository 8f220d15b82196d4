"""`hf:OWNER/NAME[@REVISION]`: a Hub dataset's name in MemVir Studio, parsed without importing 🤗 datasets (the model
card and the app read it too)."""

import re
from dataclasses import dataclass

from memvir.data.errors import DatasetError

HUB_PREFIX = "hf:"
HUB_NAME_FORM = "hf:OWNER/NAME or hf:OWNER/NAME@REVISION (a branch, tag or commit), e.g. hf:someone/birds@main"
# The Hub's own rule for a repo id's two parts (huggingface_hub.utils.validate_repo_id): letters, digits, - _ .
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")


@dataclass(frozen=True)
class HubDatasetName:
    """A Hub dataset repo and the revision to read (None: the repo's default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return HUB_PREFIX + self.repo_id + (f"@{self.revision}" if self.revision else "")


def is_hub_name(name: str) -> bool:
    return isinstance(name, str) and name.startswith(HUB_PREFIX)


def parse_hub_name(name: str) -> HubDatasetName:
    """The repo id and revision of `hf:OWNER/NAME[@REVISION]`; DatasetError saying the form otherwise."""
    body = name.removeprefix(HUB_PREFIX).strip()
    repo_id, _, revision = body.partition("@")
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id:
        raise DatasetError(f"{name!r} is not a Hub dataset name: write {HUB_NAME_FORM}")
    if "@" in body and (not _REVISION.fullmatch(revision) or ".." in revision):
        raise DatasetError(f"{name!r} names no usable revision after '@': write {HUB_NAME_FORM}")
    return HubDatasetName(repo_id, revision or None)
