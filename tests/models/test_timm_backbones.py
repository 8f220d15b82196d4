"""timm backbones (`timm:NAME`, memvir.models.timm_backbones) and a dataset read as such a model takes its images
(memvir.models.preprocessing), offline: names checked against timm's registry, the network timm builds ending in its
pooled features, the preprocessing of timm's pretrained config, the splits read that way. The pretrained weights,
served by a Hub on 127.0.0.1, are tested in tests/test_hub_timm.py."""

import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from memvir.config import TrainConfig
from memvir.data import load_dataset
from memvir.data.transforms import sample_seed
from memvir.models.backbones import build_backbone
from memvir.models.embedding_model import EmbeddingModel
from memvir.models.preprocessing import model_input, read_for_model
from memvir.models.timm_backbones import timm_preprocessing
from memvir.train.trainer import training_data

NAME = "test_vit.r160_in1k"  # timm's own tiny ViT for tests: 160 px, mean and std 0.5, bicubic resizing
BACKBONE = f"timm:{NAME}"

@pytest.fixture(scope="module")
def timm():
    """timm, imported by the tests that use it: its import takes seconds, which a test worker running none of them
    does not pay (memvir imports it itself only for a timm: backbone)."""
    import timm.data
    import timm.models

    return timm


def test_the_preprocessing_is_that_of_timms_pretrained_config(timm):
    reference = timm.data.resolve_model_data_config(timm.create_model(NAME))
    assert timm_preprocessing(BACKBONE, 3) == {
        "input_size": tuple(reference["input_size"][1:]), "mean": list(reference["mean"]),
        "std": list(reference["std"]), "interpolation": reference["interpolation"]}
    # one channel: the RGB statistics averaged (ImageNet's, where the three differ)
    gray = timm_preprocessing("timm:resnet50.a1_in1k", 1)
    assert gray["mean"] == pytest.approx([(0.485 + 0.456 + 0.406) / 3])
    assert gray["std"] == pytest.approx([(0.229 + 0.224 + 0.225) / 3])
    assert gray["input_size"] == (224, 224) and gray["interpolation"] == "bicubic"


def test_the_backbone_is_timms_network_ending_in_its_pooled_features(timm):
    torch.manual_seed(0)
    built = build_backbone(BACKBONE, in_channels=1, image_size=32)  # a ViT made for 160 px, built for 32
    reference = timm.create_model(NAME, in_chans=1, img_size=32)  # with its classifier
    reference.load_state_dict(built.features.state_dict(), strict=False)
    images = torch.randn(3, 1, 32, 32)
    with torch.no_grad():
        pooled = reference.forward_head(reference.forward_features(images), pre_logits=True)
        assert torch.equal(built.features.eval()(images), pooled)
    assert built.feature_dim == reference.num_features == pooled.shape[1]


def test_a_checkpoint_keeps_the_models_preprocessing_and_prepares_queries_with_it(tmp_path):
    model = EmbeddingModel(backbone=BACKBONE, embedding_dim=8, in_channels=1, image_size=32, mean=(0.5,),
                           std=(0.5,), interpolation="bicubic")
    model.save_pretrained(tmp_path)
    loaded = EmbeddingModel.from_pretrained(tmp_path)
    assert loaded.config == model.config and loaded.config["interpolation"] == "bicubic"
    query = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70), dtype=np.uint8))
    by_hand = np.asarray(query.resize((32, 32), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    expected = (torch.from_numpy(by_hand)[None] - 0.5) / 0.5
    assert torch.allclose(loaded.preprocess(query)[0], expected, atol=1e-5)
    images = torch.randn(2, 1, 32, 32)
    assert torch.equal(loaded.embed(images), model.embed(images))


def test_unknown_names_and_missing_weights_are_refused_in_words(timm, monkeypatch):
    with pytest.raises(ValueError, match=r"timm knows no model 'resnet5' .*did you mean resnet50"):
        TrainConfig(backbone="timm:resnet5")
    with pytest.raises(ValueError, match=r"timm has no weights 'bogus' for resnet50 .*resnet50\.a1_in1k"):
        TrainConfig(backbone="timm:resnet50.bogus")
    without_weights = sorted(set(timm.list_models()) - {name.split(".")[0] for name in timm.list_pretrained()})[0]
    TrainConfig(backbone=f"timm:{without_weights}")  # from scratch is fine
    with pytest.raises(ValueError, match=f"timm has no pretrained weights for {without_weights}"):
        TrainConfig(backbone=f"timm:{without_weights}", pretrained=True)
    with pytest.raises(ValueError, match=r"unknown backbone 'resnet5' \(did you mean 'resnet50'\?\): .*timm:NAME"):
        TrainConfig(backbone="resnet5")
    monkeypatch.setitem(sys.modules, "timm", None)  # as on a machine without timm
    with pytest.raises(ValueError, match=r"need the timm package.*pip install timm==1\.0\.31"):
        TrainConfig(backbone=BACKBONE)


def test_without_weights_in_reach_pretrained_says_where_they_were_looked_for(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    from memvir.models.backbones import PretrainedWeightsUnavailable

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PretrainedWeightsUnavailable, match=r"timm/test_vit\.r160_in1k.*HF_HUB_OFFLINE"):
        build_backbone(BACKBONE, in_channels=1, pretrained=True)


def _photo_folder(root, classes=4, per_class=2):
    rng = np.random.default_rng(1)
    for label in range(classes):
        (root / f"class{label}").mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, (36, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{label}" / f"{index}.png")
    return root


def test_a_dataset_is_read_at_the_models_size_mean_std_and_resizing(tmp_path):
    folder = _photo_folder(tmp_path / "photos")
    config = TrainConfig(dataset=f"folder:{folder}", backbone=BACKBONE)
    data, _ = training_data(config)
    assert data.info.image_size == 160  # timm's input size, the run having given none
    assert data.info.mean == (0.5, 0.5, 0.5) and data.info.std == (0.5, 0.5, 0.5)

    # the test split: the short side to 160 * 256 / 224 with bicubic, the centre 160, then timm's mean and std
    image = data.test.image(0)
    side = round(160 * 256 / 224)
    resized = image.resize((round(48 * side / 36), side), Image.Resampling.BICUBIC)
    left, top = round((resized.width - 160) / 2), round((resized.height - 160) / 2)  # CenterCrop's rounding
    by_hand = np.asarray(resized.crop((left, top, left + 160, top + 160)), dtype=np.float32) / 255
    expected = (torch.from_numpy(by_hand).permute(2, 0, 1) - 0.5) / 0.5
    assert torch.allclose(data.test[0][0], expected, atol=1e-5)

    # the training split: the dataset's own augmentation, its ImageNet normalisation changed to timm's
    own = load_dataset(f"folder:{folder}", image_size=160, seed=config.seed)
    with sample_seed(7):
        augmented = own.train[1][0]
    with sample_seed(7):
        read = data.train[1][0]
    imagenet_mean, imagenet_std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    pixels = augmented * imagenet_std[:, None, None] + imagenet_mean[:, None, None]
    assert torch.allclose(read, (pixels - 0.5) / 0.5, atol=1e-5)


def test_glyph_batches_are_renormalised_and_the_registry_backbones_read_the_dataset_as_it_is():
    glyphs = load_dataset("glyphs-mini", image_size=32)
    assert read_for_model(glyphs, model_input("convnet", glyphs.info)) is glyphs
    read = read_for_model(glyphs, model_input(BACKBONE, glyphs.info))
    raw = torch.stack([glyphs.train.raw(i)[0] for i in range(4)])
    torch.manual_seed(3)
    augmented = glyphs.train.batch_transform(raw)
    torch.manual_seed(3)
    renormalised = read.train.batch_transform(raw)
    pixels = augmented * glyphs.info.std[0] + glyphs.info.mean[0]
    assert torch.allclose(renormalised, (pixels - 0.5) / 0.5, atol=1e-5)
    render = torch.from_numpy(np.array(glyphs.test.image(0), dtype=np.float32)) / 255
    assert torch.allclose(read.test[0][0], (render[None] - 0.5) / 0.5, atol=1e-6)
    assert isinstance(read.test.transform, v2.Compose)
