"""The checkpoints shipped in checkpoints/ load offline, strictly, and score on glyphs what their model cards say."""

import re
from pathlib import Path

import pytest

from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval.metrics import retrieval_metrics

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"
BUNDLED = ("glyphs-norm-softmax-baseline", "glyphs-norm-softmax-memvir")


def card_metric(card: str, name: str) -> float:
    return float(re.search(rf"^\| {re.escape(name)} \| ([0-9.]+) \|$", card, re.MULTILINE).group(1))


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_checkpoint_reproduces_its_card(name):
    folder = CHECKPOINTS / name
    model = EmbeddingModel.from_pretrained(folder)
    card = (folder / "README.md").read_text()
    assert "python -m memvir train --dataset glyphs" in card
    test = load_dataset(model.config["dataset"], image_size=model.config["image_size"]).test
    import torch

    images = torch.utils.data.DataLoader(test, batch_size=512)
    embeddings = torch.cat([model.embed(batch) for batch, _ in images])
    metrics = retrieval_metrics(embeddings, test.labels)
    for key in ("recall@1", "map@r", "r_precision"):
        assert metrics[key] == pytest.approx(card_metric(card, key), abs=1e-4), key


def test_the_same_seed_and_budget_with_and_without_memvir_at_the_app_s_defaults():
    """Both checkpoints are the app's glyphs preset (demo.train.presets, the widened fair comparison's choices on
    validation classes): the MemVir one with its N, M, warm-up, reduction and optimiser, the baseline with N = 0 and
    the baseline's own tuned optimiser and loss multiplier after the warm-up, at the same seed, epochs and batch, each
    with the flags its command trained."""
    import shlex

    from demo.train.presets import PRESETS

    preset = PRESETS["glyphs"]
    cards = {name: (CHECKPOINTS / name / "README.md").read_text() for name in BUNDLED}
    commands = {name: shlex.split(re.search(r"python -m memvir train .*", card).group(0).strip("`"))
                for name, card in cards.items()}

    def flags(words):
        return {word: words[i + 1] for i, word in enumerate(words) if word.startswith("--")
                and i + 1 < len(words) and not words[i + 1].startswith("--")}

    memvir, baseline = flags(commands["glyphs-norm-softmax-memvir"]), flags(commands["glyphs-norm-softmax-baseline"])
    assert (int(memvir["--memvir-n"]), int(memvir["--memvir-m"]), float(memvir["--warmup-epochs"]),
            memvir["--memvir-reduction"]) == (preset.memvir_n, preset.memvir_m, preset.warmup_epochs,
                                              preset.memvir_reduction)
    assert baseline["--memvir-n"] == "0"
    for arm, optimiser in ((memvir, preset.optimiser), (baseline, preset.baseline)):
        assert (float(arm["--lr"]), float(arm["--class-lr"]), float(arm["--adam-eps"]), float(arm["--scale"]),
                float(arm.get("--loss-scale-after-warmup", 1))) == (
            optimiser.lr, optimiser.class_lr, optimiser.adam_eps, optimiser.scale, optimiser.loss_scale_after_warmup)
    for arm in (memvir, baseline):
        assert (arm["--seed"], int(arm["--epochs"]), int(arm["--batch-size"]), arm["--loss"]) == (
            "0", preset.epochs, preset.batch_size, "norm-softmax")
