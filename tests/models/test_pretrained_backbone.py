"""The bundled backbone checkpoints/glyphs-pretrain-convnet: small, loads offline and strictly, was made by the
Makefile's recipe (its card's command is `make pretrained`'s), and scores on glyphs-pretrain's test classes what its
card says (Recall@1 recomputed here by brute force in float64)."""

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.models.initialisation import PRETRAINED_GLYPHS_BACKBONE

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / PRETRAINED_GLYPHS_BACKBONE


def flags(words: list[str]) -> dict[str, str]:
    return {word: words[i + 1] for i, word in enumerate(words)
            if word.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--")}


def test_it_is_a_small_convnet_checkpoint_for_glyph_inputs():
    assert sorted(path.name for path in FOLDER.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert (FOLDER / "model.safetensors").stat().st_size < 4 * 1024**2
    model = EmbeddingModel.from_pretrained(FOLDER)
    assert (model.config["backbone"], model.config["dataset"], model.in_channels, model.embedding_dim) == (
        "convnet", "glyphs-pretrain", 1, 128)
    assert model.config["mean"] == [0.096] and model.config["std"] == [0.272]  # glyphs' own, as glyphs-few's


def test_its_card_s_command_is_the_makefile_recipe():
    card = (FOLDER / "README.md").read_text()
    command = shlex.split(re.search(r"python -m memvir train .*", card).group(0))
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^pretrained:.*?\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    recipe_words = shlex.split(recipe.replace("\\\n", " ").replace("$(PY)", "python").replace(
        "$(PRETRAINED)", "glyphs-pretrain-convnet").splitlines()[1])
    assert flags(command) == flags(recipe_words)
    assert flags(command)["--dataset"] == "glyphs-pretrain" and flags(command)["--memvir-n"] == "0"


@pytest.mark.slow
def test_it_scores_what_its_card_says_on_glyphs_pretrain():
    model = EmbeddingModel.from_pretrained(FOLDER)
    test = load_dataset("glyphs-pretrain").test
    loader = torch.utils.data.DataLoader(test, batch_size=1024)
    embeddings = torch.cat([model.embed(images) for images, _ in loader]).double().numpy()
    nearest = np.empty(len(test), dtype=np.int64)
    for start in range(0, len(test), 1024):  # 1,024 rows at a time: the whole matrix would be 0.9 GB
        similarity = embeddings[start:start + 1024] @ embeddings.T  # unit vectors: the cosine
        rows = np.arange(similarity.shape[0])
        similarity[rows, start + rows] = -np.inf  # not itself
        nearest[start:start + 1024] = similarity.argmax(axis=1)
    recall_at_1 = float(np.mean(test.labels[nearest] == test.labels))
    card = (FOLDER / "README.md").read_text()
    stated = float(re.search(r"^\| recall@1 \| ([0-9.]+) \|$", card, re.MULTILINE).group(1))
    assert recall_at_1 == pytest.approx(stated, abs=1e-4 + 2 / len(test))
