"""Fixtures the app's hostile-input tests share: a tiny checkpoint to serve, and a glyph to query with."""

import pytest


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """A checkpoints folder holding one glyphs-mini checkpoint trained for 5 steps."""
    from memvir import TrainConfig, Trainer

    root = tmp_path_factory.mktemp("checkpoints")
    Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, max_steps=5, eval_at_start=False, snapshot_every=0,
                        embedding_dim=32), root / "glyphs-mini-tiny").run()
    return root


@pytest.fixture(scope="module")
def glyph_query(tmp_path_factory):
    from memvir.data import load_dataset

    path = tmp_path_factory.mktemp("query") / "query.png"
    load_dataset("glyphs-mini").test.image(40).save(path)
    return path
