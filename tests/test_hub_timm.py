"""A timm backbone with its pretrained weights from the Hub, as a practitioner uses one, over HTTP against a Hub on
127.0.0.1 (tests/hub_server.py): a small timm model's weights are written there as timm publishes its own (timm's
`save_for_hf`, then huggingface_hub's `upload_folder` to `timm/NAME`); `--backbone timm:NAME --pretrained` reads them
through timm's loader; `python -m memvir train` trains and evaluates with them, `eval` and `index` read the
checkpoint, `EmbeddingModel.from_pretrained` loads it and prepares a query as the run prepared its test images, and
`push` publishes it with a card that names the base model. A Hub dataset trained with a pretrained timm backbone
(`--dataset hf:OWNER/NAME --backbone timm:NAME --pretrained`) is tests/data/test_hub_datasets.py's CLI test, on the
Hub that holds its datasets."""

import json

import pytest
import torch
from hub_server import TOKENS, USER, WRITE_TOKEN, LoopbackHub, point_client_at
from huggingface_hub import HfApi, ModelCard
from safetensors.torch import load_file
from test_cli import last_json

from memvir.cli import main
from memvir.models.backbones import build_backbone
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import GalleryIndex, evaluation

NAME = "test_vit.r160_in1k"  # timm's own tiny ViT for tests
HUB_ID = f"timm/{NAME}"  # where timm's pretrained config says its weights are
TIMM_TOKEN = "hf_timm_write"
STEM = "patch_embed.proj.weight"

@pytest.fixture(scope="module")
def timm():
    """timm, imported by the tests that use it: its import takes seconds, which a test worker running none of them
    does not pay (memvir imports it itself only for a timm: backbone)."""
    import timm.data
    import timm.models

    return timm


def publish_timm_weights(hub_url: str, tmp_path_factory) -> dict:
    """timm's weights of NAME (random, seeded, in timm's published layout) written to HUB_ID on the Hub at `hub_url`
    as timm publishes its own (the Hub must know TIMM_TOKEN as "timm"); them. Shared with
    tests/data/test_hub_datasets.py, whose Hub holds them beside its datasets."""
    import timm.models

    folder = tmp_path_factory.mktemp("timm-weights")
    torch.manual_seed(0)
    timm.models.save_for_hf(timm.create_model(NAME), str(folder), safe_serialization=True)
    with pytest.MonkeyPatch.context() as patch:
        point_client_at(patch, hub_url, tmp_path_factory.mktemp("publisher"))
        api = HfApi(token=TIMM_TOKEN)  # made here: huggingface_hub's module-level `upload_folder` kept the endpoint
        api.create_repo(HUB_ID)        # of its import
        api.upload_folder(repo_id=HUB_ID, folder_path=folder)
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def timm_hub(timm, tmp_path_factory):
    """A loopback Hub holding timm's weights of NAME (`publish_timm_weights`), and them."""
    with LoopbackHub({**TOKENS, TIMM_TOKEN: "timm"}) as hub:
        yield hub, publish_timm_weights(hub.url, tmp_path_factory)
    assert hub.server_errors == []


def test_the_pretrained_weights_come_from_the_hub_through_timm_its_stem_summed_for_gray(timm_hub, tmp_path,
                                                                                        monkeypatch):
    hub, published = timm_hub
    point_client_at(monkeypatch, hub.url, tmp_path / "home")
    state = build_backbone(f"timm:{NAME}", in_channels=1, pretrained=True).features.state_dict()
    assert f"/{HUB_ID}/resolve/main/model.safetensors" in hub.paths_requested()
    assert set(state) == set(published) - {"head.weight", "head.bias"}  # the classifier left out: pooled features
    # one input channel: the RGB filters summed, so a gray image acts as the same image on R, G and B
    assert torch.allclose(state[STEM], published[STEM].sum(dim=1, keepdim=True))
    assert all(torch.equal(state[key], published[key]) for key in state if key != STEM)


@pytest.mark.slow
def test_train_evaluate_search_and_push_a_pretrained_timm_backbone_through_the_cli(timm, timm_hub, tmp_path,
                                                                                  monkeypatch, capsys):
    hub, _ = timm_hub
    point_client_at(monkeypatch, hub.url, tmp_path / "home")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")  # the CLI would set it in this process's environment
    run = tmp_path / "run"
    # 32 px instead of the model's own 160 keeps the test short; timm resamples the ViT's position embeddings
    assert main(["train", "--dataset", "glyphs-mini", "--backbone", f"timm:{NAME}", "--pretrained",
                 "--image-size", "32", "--embedding-dim", "32", "--memvir-n", "1", "--memvir-m", "1",
                 "--warmup-epochs", "0.5", "--batch-size", "32", "--epochs", "1", "--seed", "0",
                 "--out", str(run)]) == 0
    trained = last_json(capsys.readouterr().out)

    # the checkpoint's config: the model's preprocessing as timm's pretrained config gives it, for one channel
    reference = timm.data.resolve_model_data_config(timm.create_model(NAME))
    config = json.loads((run / "config.json").read_text())
    assert config["backbone"] == f"timm:{NAME}" and config["pretrained"] is True
    assert config["in_channels"] == 1 and config["image_size"] == 32
    assert config["mean"] == [sum(reference["mean"]) / 3] and config["std"] == [sum(reference["std"]) / 3]
    assert config["interpolation"] == reference["interpolation"] == "bicubic"

    # eval reads the checkpoint and scores it as the run did
    assert main(["eval", str(run)]) == 0
    evaluated = last_json(capsys.readouterr().out)
    metrics = ("recall@1", "r_precision", "map@r")
    assert all(abs(evaluated[name] - trained[name]) < 1e-6 for name in metrics), (evaluated, trained)

    # a query image prepared by the loaded model is the test image the run scored; searching finds it first
    model = EmbeddingModel.from_pretrained(run)
    _, _, split = evaluation.load_model_and_split(str(run))
    gallery, labels = evaluation.embed(model, split)
    queries = model.embed([split.image(i) for i in range(6)])
    assert torch.allclose(queries, gallery[:6], atol=1e-5)
    assert main(["index", str(run), "--out", str(tmp_path / "index")]) == 0
    index = GalleryIndex.load(tmp_path / "index")
    hits = [row[0] for row in index.search(queries, 1)]  # itself, or a render identical to it
    assert all(hit.score > 1 - 1e-5 for hit in hits)
    assert [hit.label for hit in hits] == labels[:6].tolist()

    # pushed, its card names the timm weights it was fine-tuned from, and it loads by repo id
    repo = f"{USER}/memvir-timm-glyphs-mini"
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    assert main(["push", str(run), "--repo-id", repo]) == 0
    card = ModelCard.load(repo, ignore_metadata_errors=False)
    assert card.data.base_model == HUB_ID
    assert f"initialised from {HUB_ID} through timm" in card.text
    loaded = EmbeddingModel.from_pretrained(repo).state_dict()
    saved = load_file(run / "model.safetensors")
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[key], saved[key]) for key in saved)
