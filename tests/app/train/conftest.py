"""What the Train tab's tests share: a RunManager of a test's own (`runs`), UMAP off."""

import pytest

from demo.common.settings import AppSettings
from demo.runs.manager import RunManager


@pytest.fixture
def runs(tmp_path):
    manager = RunManager(AppSettings(data_dir=tmp_path / "data", checkpoints_dir=tmp_path / "checkpoints",
                                     umap=False))
    yield manager
    manager.close()
