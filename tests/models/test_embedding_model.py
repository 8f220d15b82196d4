"""EmbeddingModel and backbones: shapes, unit norms, grayscale stems, pretrained weights offline, Hub format, loading.

Reference values are computed here by hand (PIL + numpy, explicit loops), never by the code under test.
"""

import json
import math
from pathlib import Path
from urllib.error import URLError

import huggingface_hub
import numpy as np
import pytest
import torch
import torchvision
from hub_cache import COMMIT, hub_cache_snapshot
from PIL import Image
from safetensors.torch import load_file, save_file

from memvir.models import backbones
from memvir.models.backbones import (
    PretrainedWeightsUnavailable,
    adapt_stem_weight,
    available_backbones,
    build_backbone,
    register_backbone,
)
from memvir.models.embedding_model import CheckpointError, EmbeddingModel

FEATURE_DIMS = {"convnet": 256, "convnet-gn": 256, "resnet18": 512, "resnet50": 2048, "googlenet": 1024}
RESNET18_FILE = "resnet18-f37072fd.pth"  # the file name in ResNet18_Weights.IMAGENET1K_V1's URL


def _row_norms(embeddings: torch.Tensor) -> list[float]:
    return [math.sqrt(sum(float(v) ** 2 for v in row)) for row in embeddings]


def _trained_a_little(model: EmbeddingModel, channels: int, size: int) -> EmbeddingModel:
    """One train-mode forward moves the BatchNorm running stats off their defaults, so buffers matter in a test."""
    torch.manual_seed(1)
    model.train()
    model(torch.randn(4, channels, size, size))
    return model


@pytest.fixture
def no_weight_downloads(monkeypatch):
    """Any attempt to fetch ImageNet weights fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("ImageNet weights must not be fetched here")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)


# ---------------------------------------------------------------- backbones


def test_registry_lists_the_backbones():
    assert available_backbones() == ("convnet", "convnet-gn", "googlenet", "resnet18", "resnet50")


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("backbone", sorted(FEATURE_DIMS))
def test_every_backbone_gives_unit_norm_embeddings(backbone, channels):
    torch.manual_seed(0)
    size = 32 if backbone == "convnet" else 64
    model = EmbeddingModel(backbone=backbone, embedding_dim=16, in_channels=channels, image_size=size,
                           mean=(0.5,) * channels, std=(0.25,) * channels)
    assert model.head.in_features == FEATURE_DIMS[backbone]
    model.train()
    images = torch.randn(2, channels, size, size)
    embeddings = model.embed(images)
    assert embeddings.shape == (2, 16)
    assert _row_norms(embeddings) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert model.training, "embed must restore the training flag"
    assert not embeddings.requires_grad
    trained_output = model(images)
    assert trained_output.requires_grad and _row_norms(trained_output.detach()) == pytest.approx([1.0, 1.0], abs=1e-5)


def test_a_registered_backbone_is_buildable_by_name(monkeypatch):
    monkeypatch.setattr(backbones, "BACKBONE_REGISTRY", backbones.BACKBONE_REGISTRY.copy())  # the real one untouched

    @register_backbone("flat-test")
    def build_flat(in_channels, pretrained):
        return backbones.Backbone(torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()), in_channels)

    assert "flat-test" in available_backbones()
    model = EmbeddingModel(backbone="flat-test", embedding_dim=4)
    assert model.head.in_features == 1 and model.embed(torch.ones(2, 1, 8, 8)).shape == (2, 4)


def test_registering_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="backbone 'convnet' is already registered; pick another name"):
        register_backbone("convnet")(lambda in_channels, pretrained: None)


def test_unknown_backbone_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown backbone 'vit': use one of convnet, convnet-gn, resnet18, resnet50, "
                                         r"googlenet or timm:NAME"):
        EmbeddingModel(backbone="vit")
    with pytest.raises(ValueError, match=r"unknown backbone 'convnet_gn' \(did you mean 'convnet-gn'\?\)"):
        EmbeddingModel(backbone="convnet_gn")


def test_convnet_has_no_pretrained_weights():
    with pytest.raises(ValueError, match=r"'convnet' has no pretrained weights; set pretrained=False"):
        build_backbone("convnet", in_channels=1, pretrained=True)


def test_zero_input_channels_rejected():
    with pytest.raises(ValueError, match="in_channels must be at least 1, got 0"):
        build_backbone("resnet18", in_channels=0)


def test_gray_stem_is_the_sum_of_the_rgb_filters():
    torch.manual_seed(0)
    rgb = torch.randn(4, 3, 2, 2)
    gray = adapt_stem_weight(rgb, 1)
    assert gray.shape == (4, 1, 2, 2)
    for out in range(4):
        for i in range(2):
            for j in range(2):
                expected = float(rgb[out, 0, i, j]) + float(rgb[out, 1, i, j]) + float(rgb[out, 2, i, j])
                assert float(gray[out, 0, i, j]) == pytest.approx(expected, abs=1e-6)


def test_gray_stem_on_gray_input_equals_rgb_stem_on_replicated_input():
    torch.manual_seed(0)
    rgb = torch.randn(8, 3, 3, 3)
    gray_image = torch.randn(1, 1, 9, 9)
    via_gray = torch.nn.functional.conv2d(gray_image, adapt_stem_weight(rgb, 1))
    via_rgb = torch.nn.functional.conv2d(gray_image.repeat(1, 3, 1, 1), rgb)
    torch.testing.assert_close(via_gray, via_rgb)


def test_four_channel_stem_cycles_rgb_and_rescales():
    rgb = torch.arange(2 * 3 * 1 * 1, dtype=torch.float32).reshape(2, 3, 1, 1)
    four = adapt_stem_weight(rgb, 4)
    for out in range(2):
        expected = [float(rgb[out, c % 3, 0, 0]) * 3 / 4 for c in range(4)]
        assert four[out, :, 0, 0].tolist() == pytest.approx(expected)
    assert torch.equal(adapt_stem_weight(rgb, 3), rgb)


def test_stem_weight_must_be_rgb():
    with pytest.raises(ValueError, match=r"expected an RGB stem weight \[out, 3, kh, kw\], got shape \(2, 1, 3, 3\)"):
        adapt_stem_weight(torch.zeros(2, 1, 3, 3), 1)


def _known_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A fake "ImageNet" state: every tensor filled with seeded values, so loaded weights can be recognised."""
    generator = torch.Generator().manual_seed(7)
    return {key: torch.randn(value.shape, generator=generator).to(value.dtype) if value.is_floating_point()
            else value.clone() for key, value in model.state_dict().items()}


def test_pretrained_resnet18_gray_stem_from_fake_imagenet_state(monkeypatch):
    fake = _known_state(torchvision.models.resnet18(weights=None))
    requested = []

    def fake_download(url, **kwargs):
        requested.append((url, kwargs))
        return fake

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", fake_download)
    features = build_backbone("resnet18", in_channels=1, pretrained=True).features
    url, kwargs = requested[0]
    assert url == torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url
    assert kwargs["weights_only"] is True
    expected_stem = fake["conv1.weight"][:, 0:1] + fake["conv1.weight"][:, 1:2] + fake["conv1.weight"][:, 2:3]
    torch.testing.assert_close(features.conv1.weight.detach(), expected_stem)
    assert torch.equal(features.layer3[1].conv2.weight.detach(), fake["layer3.1.conv2.weight"])
    assert torch.equal(features.bn1.running_var, fake["bn1.running_var"])


def test_pretrained_googlenet_drops_aux_heads_and_adapts_the_stem(monkeypatch):
    # torchvision's ImageNet GoogLeNet file holds the auxiliary heads too; the backbone has them off.
    fake = _known_state(torchvision.models.googlenet(weights=None, aux_logits=True, init_weights=False))
    assert any(key.startswith("aux1.") for key in fake)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda url, **kwargs: fake)
    gray = build_backbone("googlenet", in_channels=1, pretrained=True).features
    expected_stem = fake["conv1.conv.weight"].sum(dim=1, keepdim=True)
    torch.testing.assert_close(gray.conv1.conv.weight.detach(), expected_stem)
    assert torch.equal(gray.inception5b.branch1.conv.weight.detach(), fake["inception5b.branch1.conv.weight"])
    assert gray.aux1 is None and gray.aux2 is None
    assert gray.transform_input is False  # it indexes R, G, B: impossible on one channel
    rgb = build_backbone("googlenet", in_channels=3, pretrained=True).features
    assert rgb.transform_input is True
    assert torch.equal(rgb.conv1.conv.weight.detach(), fake["conv1.conv.weight"])


def test_pretrained_weights_come_from_the_torch_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cached = _known_state(torchvision.models.resnet18(weights=None))
    cached = {key: value.half() if value.is_floating_point() else value for key, value in cached.items()}  # smaller
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(cached, tmp_path / "hub" / "checkpoints" / RESNET18_FILE)

    def no_network(*args, **kwargs):
        raise AssertionError("the cached file must be used, not downloaded")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    features = build_backbone("resnet18", in_channels=1, pretrained=True).features
    stem = cached["conv1.weight"].float()
    torch.testing.assert_close(features.conv1.weight.detach(), stem[:, :1] + stem[:, 1:2] + stem[:, 2:])


def test_offline_without_cached_weights_says_what_is_missing_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def offline(url, dst, *args, **kwargs):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(PretrainedWeightsUnavailable) as caught:
        EmbeddingModel(backbone="resnet18", in_channels=3, mean=(0.5,) * 3, std=(0.5,) * 3, pretrained=True)
    message = str(caught.value)
    assert RESNET18_FILE in message
    assert str(tmp_path / "hub" / "checkpoints" / RESNET18_FILE) in message
    assert "Run once with network access" in message and "set pretrained=False" in message
    assert "name resolution" in message


# ---------------------------------------------------------------- configuration and forward checks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embedding_dim": 0}, "embedding_dim must be a positive integer, got 0"),
        ({"image_size": 32.0}, "image_size must be a positive integer, got 32.0"),
        ({"mean": (0.5, 0.5)}, "mean has 2 value.* and std 1 but in_channels is 1: give one mean and one std"),
        ({"std": (0.0,)}, r"std values must be positive, got \(0.0,\)"),
        ({"image_kind": "video"}, r"image_kind must be one of \('glyph', 'photo'\), got 'video'"),
        ({"normalization": "bgr"}, r"normalization must be one of \(None, 'caffe'\), got 'bgr'"),
    ],
)
def test_bad_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingModel(**kwargs)


def test_forward_rejects_wrong_channel_count():
    model = EmbeddingModel()
    with pytest.raises(ValueError, match=r"expected a batch of images \[B, 1, H, W\], got shape \(2, 3, 32, 32\)"):
        model(torch.zeros(2, 3, 32, 32))


def test_config_holds_plain_values_even_from_numpy_inputs():
    model = EmbeddingModel(in_channels=np.int64(3), embedding_dim=np.int32(8), mean=np.array([0.4, 0.5, 0.6]),
                           std=np.array([0.2, 0.2, 0.2]))
    config = model.config
    assert config["mean"] == pytest.approx([0.4, 0.5, 0.6]) and all(type(v) is float for v in config["mean"])
    assert type(config["in_channels"]) is int and type(config["embedding_dim"]) is int
    json.dumps(config)  # every value must serialise


# ---------------------------------------------------------------- preprocessing


def _random_image(width: int, height: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, mode="RGB")


def test_glyph_preprocess_is_plain_resize_then_normalise():
    image = _random_image(40, 50)
    model = EmbeddingModel(image_size=32, mean=(0.4,), std=(0.2,))
    batch = model.preprocess(image)
    gray = np.asarray(image.convert("L").resize((32, 32), Image.BILINEAR), dtype=np.float64)
    expected = (gray / 255.0 - 0.4) / 0.2
    assert type(batch) is torch.Tensor and batch.dtype == torch.float32
    assert batch.shape == (1, 1, 32, 32)
    np.testing.assert_allclose(batch[0, 0].numpy(), expected, atol=1e-5)


def _photo_reference(image: Image.Image, size: int) -> np.ndarray:
    """Resize the short side to round(size*256/224) (the long side truncated as torchvision does), center crop."""
    short_target = round(size * 256 / 224)
    width, height = image.size
    if width <= height:
        new_width, new_height = short_target, int(short_target * height / width)
    else:
        new_width, new_height = int(short_target * width / height), short_target
    resized = image.resize((new_width, new_height), Image.BILINEAR)
    top = int(round((new_height - size) / 2.0))
    left = int(round((new_width - size) / 2.0))
    return np.asarray(resized.crop((left, top, left + size, top + size)), dtype=np.float64)  # [H, W, 3]


def test_photo_preprocess_is_resize_center_crop_then_normalise():
    image = _random_image(100, 80)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    model = EmbeddingModel(in_channels=3, image_size=64, mean=mean, std=std, image_kind="photo")
    batch = model.preprocess([image, image.rotate(90, expand=True)])
    assert batch.shape == (2, 3, 64, 64)
    for index, source in enumerate([image, image.rotate(90, expand=True)]):
        crop = _photo_reference(source, 64)
        for channel in range(3):
            expected = (crop[:, :, channel] / 255.0 - mean[channel]) / std[channel]
            np.testing.assert_allclose(batch[index, channel].numpy(), expected, atol=1e-5)


def test_caffe_normalization_keeps_the_0_255_scale():
    image = _random_image(32, 32)
    mean = (123.0, 117.0, 104.0)
    model = EmbeddingModel(in_channels=3, image_size=32, mean=mean, std=(1.0, 1.0, 1.0), normalization="caffe")
    batch = model.preprocess(image)
    pixels = np.asarray(image, dtype=np.float64)
    for channel in range(3):
        np.testing.assert_allclose(batch[0, channel].numpy(), pixels[:, :, channel] - mean[channel], atol=1e-4)


def test_embed_accepts_pil_images():
    model = EmbeddingModel()
    images = [_random_image(20, 20, seed) for seed in range(3)]
    torch.testing.assert_close(model.embed(images), model.embed(model.preprocess(images)))
    assert model.embed(images[0]).shape == (1, 128)


@pytest.mark.parametrize(
    ("images", "message"),
    [([], "preprocess needs at least one image"), ([np.zeros((4, 4))], "image 0 is a ndarray, not a PIL image")],
)
def test_preprocess_rejects_bad_input(images, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingModel().preprocess(images)


def test_preprocess_needs_one_or_three_channels():
    model = EmbeddingModel(in_channels=2, mean=(0.5, 0.5), std=(0.5, 0.5))
    with pytest.raises(ValueError, match="1-channel .* or 3-channel .* this one has 2 channels"):
        model.preprocess(_random_image(8, 8))


# ---------------------------------------------------------------- Hub format: save and load


def test_save_pretrained_writes_config_weights_and_card(tmp_path):
    model = EmbeddingModel(embedding_dim=64, dataset="glyphs-mini")
    model.save_pretrained(
        tmp_path,
        metrics={"recall@1": 0.8125, "map@r": np.float32(0.40625), "epoch": 3},
        card_extra={"command": "python -m memvir train --dataset glyphs-mini --out runs/x", "loss": "norm-softmax"},
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "backbone": "convnet", "embedding_dim": 64, "in_channels": 1, "image_size": 32, "mean": [0.5],
        "std": [0.5], "dataset": "glyphs-mini", "image_kind": "glyph", "normalization": None, "pretrained": False,
        "interpolation": "bilinear",
    }
    assert set(load_file(tmp_path / "model.safetensors")) == set(model.state_dict())
    card = (tmp_path / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: memvir" in card
    assert "convnet on glyphs-mini" in card and "64-d, L2-normalised" in card
    assert "| metric | value |\n|---|---|\n| recall@1 | 0.8125 |\n| map@r | 0.4062 |\n| epoch | 3 |" in card
    assert "```bash\npython -m memvir train --dataset glyphs-mini --out runs/x\n```" in card
    assert "| loss | norm-softmax |" in card


def test_card_rows_show_containers_as_json_and_keep_the_table_intact(tmp_path):
    card_extra = {"train_config": {"loss": "arcface", "memvir_n": 45}, "note": "a|b\nc"}
    EmbeddingModel().save_pretrained(tmp_path, card_extra=card_extra)
    card = (tmp_path / "README.md").read_text()
    assert '| train_config | `{"loss": "arcface", "memvir_n": 45}` |' in card
    assert "| note | a\\|b c |" in card


def test_saving_again_refreshes_the_card(tmp_path):
    model = EmbeddingModel()
    model.save_pretrained(tmp_path, metrics={"recall@1": 0.25})
    model.save_pretrained(tmp_path, metrics={"recall@1": 0.75})
    card = (tmp_path / "README.md").read_text()
    assert "| recall@1 | 0.7500 |" in card and "0.2500" not in card


def test_card_without_metrics_has_no_metrics_section(tmp_path):
    EmbeddingModel().save_pretrained(tmp_path)
    assert "## Metrics" not in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({"recall@1": "high"}, r"metrics\['recall@1'\] is 'high' \(str\); metrics must be numbers"),
        ({"converged": True}, r"metrics\['converged'\] is True \(bool\); metrics must be numbers"),
        ([0.5], "metrics must be a mapping of names to numbers, got list"),
    ],
)
def test_metrics_must_be_numbers(tmp_path, metrics, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingModel().save_pretrained(tmp_path, metrics=metrics)
    assert not (tmp_path / "model.safetensors").exists()  # checked before anything is written


@pytest.mark.parametrize("backbone", ["convnet", "resnet18"])
def test_round_trip_gives_identical_embeddings(tmp_path, backbone):
    model = _trained_a_little(EmbeddingModel(backbone=backbone, embedding_dim=32), 1, 32)
    model.save_pretrained(tmp_path)
    loaded = EmbeddingModel.from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert not loaded.training
    images = torch.randn(5, 1, 32, 32)
    assert torch.equal(loaded.embed(images), model.embed(images))


def test_loading_a_pretrained_config_never_fetches_imagenet_weights(tmp_path, no_weight_downloads):
    EmbeddingModel(backbone="resnet18").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "pretrained": True}))
    loaded = EmbeddingModel.from_pretrained(tmp_path)
    assert loaded.config["pretrained"] is True  # the saved fact is kept for the card


def _rewrite_weights(folder: Path, change) -> None:
    state = load_file(folder / "model.safetensors")
    change(state)
    save_file(state, folder / "model.safetensors")


def test_strict_loading_rejects_a_missing_key(tmp_path):
    EmbeddingModel().save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, lambda state: state.pop("head.bias"))
    with pytest.raises(CheckpointError, match=r'(?s)Missing key\(s\) in state_dict: "head.bias".*same save_pretrained'):
        EmbeddingModel.from_pretrained(tmp_path)


def test_strict_loading_rejects_an_extra_key(tmp_path):
    EmbeddingModel().save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, lambda state: state.update({"head.scale": torch.ones(1)}))
    with pytest.raises(CheckpointError, match=r'Unexpected key\(s\) in state_dict: "head.scale"'):
        EmbeddingModel.from_pretrained(tmp_path)


def test_loading_rejects_weights_of_another_shape(tmp_path):
    EmbeddingModel(embedding_dim=64).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "embedding_dim": 32}))
    with pytest.raises(CheckpointError, match=r"(?s)embedding_dim 32.*size mismatch for head.weight"):
        EmbeddingModel.from_pretrained(tmp_path)


def test_loading_a_folder_without_config_names_it(tmp_path):
    EmbeddingModel().save_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"is not an EmbeddingModel checkpoint: config.json missing"):
        EmbeddingModel.from_pretrained(tmp_path)


def test_from_pretrained_offline_from_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model = _trained_a_little(EmbeddingModel(embedding_dim=32), 1, 32)
    model.save_pretrained(hub_cache_snapshot(tmp_path, "someone/glyph-model"))
    images = torch.randn(3, 1, 32, 32)
    for revision in (None, COMMIT):
        loaded = EmbeddingModel.from_pretrained("someone/glyph-model", cache_dir=tmp_path, revision=revision)
        assert loaded.config == model.config
        assert torch.equal(loaded.embed(images), model.embed(images))
