"""Fixtures the app's hostile-input tests share: a tiny checkpoint to serve, a glyph to query with, and `python app.py`
started as a Space, shared by the Space's start test and the hostile uploads."""

import pytest


def _train_tiny_checkpoint(root):
    """A checkpoints folder at `root` holding one glyphs-mini checkpoint trained for 5 steps."""
    from memvir import TrainConfig, Trainer

    Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, max_steps=5, eval_at_start=False, snapshot_every=0,
                        embedding_dim=32), root / "glyphs-mini-tiny").run()
    return root


def _save_glyph_query(path):
    from memvir.data import load_dataset

    load_dataset("glyphs-mini").test.image(40).save(path)
    return path


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """A checkpoints folder holding one glyphs-mini checkpoint trained for 5 steps."""
    return _train_tiny_checkpoint(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="module")
def glyph_query(tmp_path_factory):
    return _save_glyph_query(tmp_path_factory.mktemp("query") / "query.png")


@pytest.fixture(scope="session")
def space_app(tmp_path_factory):
    """`python app.py` started as a Space starts it (tests/served_app.start_as_space), serving a tiny checkpoint, its
    first search sent the moment it served; it serves on for the session. test_space checks that start, and the
    hostile uploads are sent to the same server: one interpreter start fewer (tests/conftest.py runs the two files on
    one worker)."""
    from served_app import free_port, space_environment, start_as_space

    root = tmp_path_factory.mktemp("space-app")
    checkpoints = _train_tiny_checkpoint(root / "checkpoints")
    query = _save_glyph_query(root / "query.png")
    env = space_environment(free_port(), root / "data", checkpoints)
    start = start_as_space(env, root / "app.log", str(checkpoints / "glyphs-mini-tiny"), query)
    yield start
    start.close()
