"""A Hugging Face Hub cache laid out by hand, for offline loading tests (of memvir.hub and EmbeddingModel)."""

from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache_snapshot(cache_dir: Path, repo_id: str) -> Path:
    """huggingface_hub's cache layout: models--owner--name/{refs/main, snapshots/<commit>/...}; returns the
    (empty) snapshot folder for the test to fill."""
    repo_folder = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (repo_folder / "refs").mkdir(parents=True)
    (repo_folder / "refs" / "main").write_text(COMMIT)
    snapshot = repo_folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    return snapshot
