"""The checkpoints to search with: bundled ones, the app's runs and Hub repos, which to offer first, each loaded once
and kept (a few at a time)."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

from demo.common.allowed_paths import checkpoint_source
from demo.common.hub_access import ANONYMOUS
from demo.common.settings import AppSettings
from memvir.checkpoint import RunFolder
from memvir.hub import pull
from memvir.models.embedding_model import EmbeddingModel

CACHE_ENTRIES = 4
# A bundled checkpoint trained with MemVir says so in its model card's summary table (memvir.train.trainer writes the
# row).
_MEMVIR_CARD_ROW = re.compile(r"^\| MemVir \| N=[1-9]", re.MULTILINE)

log = logging.getLogger(__name__)


class RetrievalError(ValueError):
    """A checkpoint, gallery or query that cannot be used; the message says what to do instead."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A model ready to embed, and where it came from. `key` changes when the folder's weights are rewritten."""

    key: str
    folder: Path
    name: str
    model: EmbeddingModel

    @property
    def config(self) -> dict:
        return self.model.config

    @property
    def is_glyph_model(self) -> bool:
        return self.config["image_kind"] == "glyph"


class LruCache(OrderedDict):
    """A small least-recently-used dict: models and indexes are large, visitors few."""

    def __init__(self, capacity: int = CACHE_ENTRIES):
        super().__init__()
        self.capacity = capacity

    def get_or_make(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        while len(self) > self.capacity:
            self.popitem(last=False)
        return value

    def recent(self, key):
        """The value of `key`, marked as just used; None when it is not kept."""
        if key not in self:
            return None
        self.move_to_end(key)
        return self[key]


def folder_key(folder: Path) -> str:
    """A checkpoint folder's identity: its path and when its weights were last written."""
    weights = RunFolder(folder).weights_file
    return f"{folder.resolve()}@{weights.stat().st_mtime_ns}"


def checkpoint_folders(root: Path, need_weights: bool) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        (path for path in root.iterdir() if RunFolder(path).has_model(weights=need_weights)),
        key=lambda path: path.name,
    )


def _trained_with_memvir(folder: Path) -> bool:
    card = folder / "README.md"
    text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    return bool(_MEMVIR_CARD_ROW.search(text))


def _visitor_message(choice: str, error: Exception, space: bool) -> str:
    """What a visitor is told when a checkpoint cannot be had: a Hub repo neither cached here nor reachable, or on a
    Space one that anyone may not read, is said in the visitor's words (memvir.hub's message is the operator's: the
    cache's path, HF_HUB_OFFLINE, how to log in)."""
    if space and isinstance(error.__cause__, RepositoryNotFoundError):
        return (f"the Hub has no public model repo {choice!r}: check the spelling ('owner/name'). This Space reads "
                "the Hub without any token, so a private repo cannot be opened here")
    if isinstance(error.__cause__, LocalEntryNotFoundError):
        log.info("%s could not be pulled: %s", choice, error)
        return (f"{choice!r} is not on this server and the Hub cannot be reached from this server; pick a bundled "
                "checkpoint (or one of this app's runs)")
    return str(error)


class Catalogue:
    """The checkpoints a visitor may search with, loaded on demand and kept; thread-safe.

    A checkpoint is a folder in the Hub layout (config.json + model.safetensors): bundled under `checkpoints/`, a run
    folder of this app, or a Hub repo id pulled by `memvir.hub.pull` (which fails within seconds when offline).
    """

    def __init__(self, settings: AppSettings):
        self.settings = settings
        self._lock = threading.Lock()
        self._models = LruCache()

    def choices(self) -> list[tuple[str, str]]:
        """(label, folder) of the bundled checkpoints and of the app's runs that have saved weights."""
        bundled = [(f"bundled: {path.name}", str(path))
                   for path in checkpoint_folders(self.settings.checkpoints_dir, need_weights=False)]
        runs = [(f"run: {path.name}", str(path))
                for path in reversed(checkpoint_folders(self.settings.runs_dir, need_weights=True))]
        return bundled + runs

    def default(self) -> str | None:
        """The checkpoint the Retrieve tab starts on: the bundled one trained with MemVir (as its model card says),
        else the first listed; None when none is listed."""
        for folder in checkpoint_folders(self.settings.checkpoints_dir, need_weights=True):
            if _trained_with_memvir(folder):
                return str(folder)
        choices = self.choices()
        return choices[0][1] if choices else None

    def comparison(self, first: str | None = None) -> str | None:
        """The checkpoint to compare `first` (default: `default`) with: the first bundled one whose model card names
        no MemVir (its baseline), else the first other listed; None when there is no other."""
        first = first or self.default()
        others = [folder for folder in checkpoint_folders(self.settings.checkpoints_dir, need_weights=True)
                  if str(folder) != first]
        for folder in others:
            if not _trained_with_memvir(folder):
                return str(folder)
        listed = [choice for _, choice in self.choices() if choice != first]
        return listed[0] if listed else None

    def load(self, choice: str) -> LoadedCheckpoint:
        """The model of a listed folder or a Hub repo id ('owner/name'); RetrievalError when it cannot be had or is
        a path outside the places visitors may name (demo.common.allowed_paths). On a Space a repo id is read with
        no token at all (demo.common.hub_access): the server's token never reads for a visitor, so a private repo
        reads as not found."""
        choice = (choice or "").strip()
        if not choice:
            raise RetrievalError("choose a checkpoint, or type a Hub repo id such as owner/name")
        try:
            source = checkpoint_source(choice, self.settings)
            folder = pull(source, token=ANONYMOUS if self.settings.space else None)
            key = folder_key(folder)
        except (ValueError, OSError) as error:  # HubError and PathRefused are ValueErrors
            raise RetrievalError(_visitor_message(choice, error, self.settings.space)) from None

        def load():
            try:
                model = EmbeddingModel.from_pretrained(folder)
            except (ValueError, OSError) as error:
                raise RetrievalError(f"{choice} could not be loaded: {error}") from None
            return LoadedCheckpoint(key, folder, folder.name if isinstance(source, Path) else choice, model.eval())

        with self._lock:
            return self._models.get_or_make(key, load)

    def may_save_beside(self, checkpoint: LoadedCheckpoint) -> bool:
        """Whether an index embedded by this loaded model may be kept in the checkpoint's folder: only one of the
        app's own runs, whose weights are still the ones the model was loaded from (a run may have saved new ones
        since). Never a bundled checkpoint (its folder is tracked in the repository, or a Space's read-only copy), a
        Hub snapshot (the Hugging Face cache's) or a folder a visitor may only read: their rebuilt indexes go to the
        app's own cache (demo.retrieve.index_builds)."""
        folder = checkpoint.folder
        return (folder.resolve().parent == self.settings.runs_dir.resolve() and os.access(folder, os.W_OK)
                and folder_key(folder) == checkpoint.key)
