"""The embedding model: an image in, an L2-normalised embedding out, saved in the Hub format.

The backbones (memvir.models.backbones) end in global pooling; `EmbeddingModel` puts a linear head on top (as the MemVir
reference:
BN-Inception, global average pooling, Linear 1024 -> 512, L2 norm) and saves itself as `config.json` +
`model.safetensors` + `README.md` through huggingface_hub's `PyTorchModelHubMixin`. The config carries what retrieval
needs to preprocess a query, so a checkpoint folder or Hub repo is all an app needs.
"""

import json
import os
from collections.abc import Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from huggingface_hub import ModelCard, PyTorchModelHubMixin, hf_hub_download
from PIL import Image
from safetensors import SafetensorError
from torch import nn
from torchvision.transforms import v2

from memvir import _hub_shims, checkpoint
from memvir.checkpoint import CheckpointError
from memvir.data.registry import MAX_IMAGE_SIZE
from memvir.models.backbones import build_backbone
from memvir.models.card import MODEL_CARD_TEMPLATE, card_cell, describe_for_the_hub, metric_rows
from memvir.models.preprocessing import DEFAULT_INTERPOLATION, INTERPOLATIONS, query_transform
from memvir.models.timm_backbones import timm_hub_id

_hub_shims.check_mixin_internals()  # another huggingface_hub fails here, at import, saying what to install

MAX_IN_CHANNELS = 256
"""Most input channels a model may take (1 grayscale, 3 RGB; multispectral images have tens)."""

MAX_EMBEDDING_DIM = 65_536
"""Widest embedding a model may have: far above any metric-learning use (64 to 2048), low enough that a wrong value
(in a config.json, say) is refused instead of asking the allocator for terabytes."""

IMAGE_KINDS = ("glyph", "photo")
NORMALIZATIONS = (None, "caffe")

class EmbeddingModel(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="memvir",
    tags=["metric-learning", "image-retrieval", "memvir"],
    pipeline_tag="image-feature-extraction",
    model_card_template=MODEL_CARD_TEMPLATE,
):
    """Backbone -> global pooling -> Linear(feature_dim, embedding_dim) -> L2 normalisation.

    Every constructor argument is plain JSON and lands in `config.json`, which is what retrieval needs to
    preprocess a query. `embed` turns images into embeddings; `save_pretrained` and `from_pretrained` keep the model
    in the Hub format.

    Args:
        backbone: a name of the backbone registry (`memvir.models.available_backbones()`), or `timm:NAME` for a timm
            model (memvir.models.timm_backbones).
        embedding_dim: the dimension of the embeddings, the head's output.
        in_channels: 1 grayscale, 3 RGB.
        image_size: the side of the square images the model is given.
        mean: per-channel mean, one value per input channel.
        std: per-channel standard deviation, one positive value per input channel.
        dataset: the name of the dataset the model is trained on.
        image_kind: "glyph": plain resize; "photo": resize to image_size*256/224 and center crop.
        normalization: None: pixels in [0, 1] before mean/std; "caffe": pixels in [0, 255], mean/std given on that
            scale.
        pretrained: start the backbone from pretrained weights: ImageNet's from torchvision, or for `timm:NAME` the
            Hub's through timm (training only: loading a checkpoint never downloads).
        interpolation: how an image is resized to image_size (a torchvision InterpolationMode value: a timm model's
            own, from its pretrained config).

    Raises:
        ValueError: for an unknown backbone, `image_kind`, `normalization` or `interpolation`, a size that is not a
            positive integer or is past its limit, or a mean or std that does not fit `in_channels`.
        PretrainedWeightsUnavailable: `pretrained` asked for weights that cannot be had (offline, say).
    """

    def __init__(
        self,
        backbone: str = "convnet",
        embedding_dim: int = 128,
        in_channels: int = 1,
        image_size: int = 32,
        mean: tuple[float, ...] = (0.5,),
        std: tuple[float, ...] = (0.5,),
        dataset: str = "glyphs",
        image_kind: str = "glyph",
        normalization: str | None = None,
        pretrained: bool = False,
        interpolation: str = DEFAULT_INTERPOLATION,
    ):
        super().__init__()
        for name, value, maximum in (("embedding_dim", embedding_dim, MAX_EMBEDDING_DIM),
                                     ("in_channels", in_channels, MAX_IN_CHANNELS),
                                     ("image_size", image_size, MAX_IMAGE_SIZE)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            if value > maximum:  # refused before the layers are built: a typo must not ask for terabytes
                raise ValueError(f"{name} must be at most {maximum:,}, got {value:,}")
        embedding_dim, in_channels, image_size = int(embedding_dim), int(in_channels), int(image_size)
        mean, std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        if len(mean) != in_channels or len(std) != in_channels:
            raise ValueError(
                f"mean has {len(mean)} value(s) and std {len(std)} but in_channels is {in_channels}: "
                "give one mean and one std per input channel"
            )
        if any(value <= 0 for value in std):
            raise ValueError(f"std values must be positive, got {std}")
        if image_kind not in IMAGE_KINDS:
            raise ValueError(f"image_kind must be one of {IMAGE_KINDS}, got {image_kind!r}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")

        built = build_backbone(backbone, in_channels=in_channels, pretrained=pretrained, image_size=image_size)
        self.backbone = built.features
        self.head = nn.Linear(built.feature_dim, embedding_dim)
        # The mixin records the constructor arguments it can serialise and silently drops the rest (a numpy mean,
        # say). Writing the checked, plain-Python values here makes config.json always complete and exact.
        _hub_shims.set_config(self, {
            "backbone": backbone,
            "embedding_dim": embedding_dim,
            "in_channels": in_channels,
            "image_size": image_size,
            "mean": list(mean),
            "std": list(std),
            "dataset": str(dataset),
            "image_kind": image_kind,
            "normalization": normalization,
            "pretrained": bool(pretrained),
            "interpolation": interpolation,
        })

    @property
    def config(self) -> dict[str, Any]:
        """A copy of the configuration written to config.json."""
        return dict(_hub_shims.config_of(self))

    @property
    def in_channels(self) -> int:
        return _hub_shims.config_of(self)["in_channels"]

    @property
    def embedding_dim(self) -> int:
        return _hub_shims.config_of(self)["embedding_dim"]

    def forward(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """The embeddings of a preprocessed batch, with gradients (training); `embed` is the inference entry point.

        Args:
            images: [B, in_channels, H, W], preprocessed as the model's config says (`preprocess`).
            normalize: L2-normalise the embeddings; False gives the head's raw output, for a loss that takes
                un-normalised embeddings (the paper's Softmax). Retrieval always uses the normalised ones.

        Returns:
            [B, embedding_dim] embeddings.

        Raises:
            ValueError: a tensor that is not [B, in_channels, H, W].
        """
        if images.dim() != 4 or images.shape[1] != self.in_channels:
            raise ValueError(
                f"expected a batch of images [B, {self.in_channels}, H, W], got shape {tuple(images.shape)}"
            )
        embeddings = self.head(self.backbone(images))
        return F.normalize(embeddings, dim=1) if normalize else embeddings

    def embed(self, images: torch.Tensor | Image.Image | Sequence[Image.Image]) -> torch.Tensor:
        """L2-normalised embeddings [B, embedding_dim] without gradients, in eval mode (BatchNorm running stats).

        The training flag is restored afterwards, so this is safe between training steps (not concurrently with
        them).

        Args:
            images: a preprocessed batch tensor [B, in_channels, H, W], or PIL image(s), which go through
                `preprocess` first.

        Returns:
            The embeddings [B, embedding_dim], on the model's device.
        """
        if not isinstance(images, torch.Tensor):
            images = self.preprocess(images)
        device = next(self.parameters()).device
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self(images.to(device))
        finally:
            self.train(was_training)

    def preprocess(self, images: Image.Image | Sequence[Image.Image]) -> torch.Tensor:
        """PIL image(s) -> the float batch [B, in_channels, image_size, image_size] the model expects, per config."""
        batch = [images] if isinstance(images, Image.Image) else list(images)
        if not batch:
            raise ValueError("preprocess needs at least one image")
        for position, image in enumerate(batch):
            if not isinstance(image, Image.Image):
                raise ValueError(f"image {position} is a {type(image).__name__}, not a PIL image")
        if self.in_channels not in (1, 3):
            raise ValueError(
                f"preprocess handles 1-channel (grayscale) or 3-channel (RGB) models, this one has {self.in_channels}"
                " channels: prepare the tensor yourself and call embed(tensor)"
            )
        transform = self._query_transform()
        mode = "L" if self.in_channels == 1 else "RGB"
        return torch.stack([transform(image.convert(mode)) for image in batch]).as_subclass(torch.Tensor)

    def _query_transform(self) -> v2.Compose:
        return query_transform(_hub_shims.config_of(self))

    def save_pretrained(
        self,
        save_directory: str | Path,
        *,
        metrics: Mapping[str, float] | None = None,
        card_extra: Mapping[str, Any] | None = None,
        model_card_kwargs: dict[str, Any] | None = None,
        **mixin_kwargs,
    ) -> str | None:
        """Write config.json, model.safetensors and README.md (the model card) into `save_directory`.

        `metrics` (name -> number) becomes a table in the card, and its retrieval metrics the front matter's
        model-index (memvir.models.card.describe_for_the_hub). `card_extra` adds facts about the run: its
        "command" key (the command line that made the model) gets its own section, every other key a row of the
        card's summary table (mappings and lists shown as JSON). `model_card_kwargs` may give `backbone_origin`, the
        card's words for where the backbone's weights started (default: ImageNet or from scratch, as the config says).
        The card is rewritten on every save, so it shows the latest metrics.
        """
        card_kwargs = {**(model_card_kwargs or {})}
        card_kwargs.setdefault("metric_rows", metric_rows(metrics))  # checked before anything is written
        card_kwargs.setdefault("run_metrics", dict(metrics or {}))
        extra = dict(card_extra or {})
        card_kwargs.setdefault("command", extra.pop("command", None))
        card_kwargs.setdefault("extra_rows", [(str(name), card_cell(value)) for name, value in extra.items()])
        # The mixin unlinks config.json before rewriting it and never overwrites a README.md: written into a fresh
        # folder and renamed over the old files, a save killed at any moment leaves a folder that loads, and the
        # card is refreshed.
        with checkpoint.staged(save_directory) as stage:
            return super().save_pretrained(stage, model_card_kwargs=card_kwargs, **mixin_kwargs)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        """The mixin's card, rendered from MODEL_CARD_TEMPLATE with this model's config, its front matter completed
        with the dataset and the metrics (`run_metrics`) as the Hub reads them."""
        run_metrics = kwargs.pop("run_metrics", None)
        kwargs.setdefault("metric_rows", [])
        kwargs.setdefault("command", None)
        kwargs.setdefault("extra_rows", [])
        config = self.config
        # where the backbone's weights started: a caller that knows better (a run with --init) says so
        # the Hub repo a timm backbone's weights came from: the card's base_model, as the Hub links fine-tunes
        base_model = timm_hub_id(config["backbone"]) if config["pretrained"] else None
        if not kwargs.get("backbone_origin"):
            kwargs["backbone_origin"] = (
                f"initialised from {base_model} through timm" if base_model
                else "ImageNet-initialised" if config["pretrained"] else "trained from scratch")
        size = config["image_size"]
        interpolation = config.get("interpolation", DEFAULT_INTERPOLATION)
        input_summary = (
            f"{config['in_channels']} channel(s), {size}x{size}, {config['image_kind']} preprocessing, "
            f"mean {config['mean']}, std {config['std']}"
            + (" on the 0-255 scale (caffe)" if config["normalization"] == "caffe" else "")
            + (f", {interpolation} resizing" if interpolation != DEFAULT_INTERPOLATION else "")
        )
        card = super().generate_model_card(*args, config=config, input_summary=input_summary, **kwargs)
        # card.data is what the card writes as its front matter, so filling it in here shapes the saved YAML
        describe_for_the_hub(card.data, backbone=config["backbone"], dataset=config["dataset"], metrics=run_metrics,
                             base_model=base_model)
        return card

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, **kwargs) -> "EmbeddingModel":
        """Load from a folder written by `save_pretrained` or from a Hub repo id (the Hub cache when offline).

        Keys are checked strictly: a weight missing from the file or one the model does not have is an error.
        For a repo id, `memvir.hub.load_model` adds a time limit and plain errors when the Hub cannot be reached.

        Args:
            pretrained_model_name_or_path: a checkpoint folder or a Hub repo id ("owner/name").
            **kwargs: the mixin's (revision, cache_dir, local_files_only, token, force_download) and its loading
                options `map_location` (default "cpu") and `strict` (default True here; False loads the keys that
                match and leaves the others as built).

        Returns:
            The model, built from config.json, its weights from model.safetensors.

        Raises:
            CheckpointError: a missing, damaged or mismatched file, named.
        """
        folder = Path(pretrained_model_name_or_path)
        if folder.is_dir():
            missing = [name for name in checkpoint.MODEL_FILES if not (folder / name).is_file()]
            if missing:
                raise CheckpointError(
                    f"{folder} is not an EmbeddingModel checkpoint: {', '.join(missing)} missing. A checkpoint "
                    "folder holds config.json and model.safetensors, as EmbeddingModel.save_pretrained writes them."
                )
            config_file = folder / checkpoint.CONFIG_FILE
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise CheckpointError(f"{config_file} is not valid JSON ({error}): it is damaged; save the model "
                                      "again") from error
            if not isinstance(config, dict):
                raise CheckpointError(f"{config_file} holds a JSON {type(config).__name__}, not the object of "
                                      "settings save_pretrained writes: it is damaged; save the model again")
        try:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except json.JSONDecodeError as error:  # the config.json of a repo id, read by the mixin
            raise CheckpointError(f"the config.json of {pretrained_model_name_or_path} is not valid JSON ({error}); "
                                  "pull it again") from error

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | Path | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        map_location: str = "cpu",
        strict: bool = True,
        **model_kwargs,
    ) -> "EmbeddingModel":
        """Build from the config with pretrained=False, then load model.safetensors (key checking as `strict`).

        The checkpoint overwrites every weight, so fetching ImageNet weights first would only cost a download (or
        fail offline). The config keeps the saved `pretrained` value, so a re-saved card stays truthful.
        Only safetensors are read: the mixin's pytorch_model.bin fallback is deliberately not offered.
        """
        saved_pretrained = bool(model_kwargs.get("pretrained", False))
        try:
            model = cls(**{**model_kwargs, "pretrained": False})
        except (TypeError, ValueError) as error:  # bounds and types are checked before anything is allocated
            raise CheckpointError(
                f"the config.json of {model_id} (with the keyword arguments given) describes no valid model: {error}"
            ) from error
        _hub_shims.config_of(model)["pretrained"] = saved_pretrained
        if os.path.isdir(model_id):
            weights_file = os.path.join(model_id, checkpoint.WEIGHTS_FILE)
        else:
            weights_file = hf_hub_download(
                repo_id=model_id,
                filename=checkpoint.WEIGHTS_FILE,
                revision=revision,
                cache_dir=cache_dir,
                force_download=force_download,
                token=token,
                local_files_only=local_files_only,
            )
        try:
            return _hub_shims.load_safetensors(cls, model, weights_file, map_location, strict)
        except SafetensorError as error:  # truncated, random bytes, an absurd header length...
            raise CheckpointError(
                f"{weights_file} is not a readable safetensors file ({error}): it is truncated or damaged. Save the "
                "model again, or pull it again from the Hub."
            ) from error
        except RuntimeError as error:  # torch and safetensors report missing, unexpected or mis-shaped keys so
            raise CheckpointError(
                f"{weights_file} does not fit the model its config.json describes "
                f"(backbone {model.config['backbone']!r}, embedding_dim {model.embedding_dim}, in_channels "
                f"{model.in_channels}): {error}\nconfig.json and model.safetensors must come from the same "
                "save_pretrained call; save the model again."
            ) from error
