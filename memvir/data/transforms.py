"""Image transforms: glyph augmentation, the photo recipes of the DML literature, and seeded train-time randomness.

Everything is torchvision.transforms.v2; written here is only what it lacks: a random stroke width for glyphs and
a wrapper that makes a random transform reproducible from a seed.
"""

import contextlib
import contextvars
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import get_worker_info
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# BN-Inception's Caffe means, listed in RGB order (its Caffe weights list them as BGR 104, 117, 128) on 0-255 pixels
# with unit std. The channel order stays RGB: a model that wants BGR flips its first layer, not every image.
CAFFE_MEAN = (128.0, 117.0, 104.0)
CAFFE_STD = (1.0, 1.0, 1.0)
PHOTO_NORMALIZATIONS = ("imagenet", "caffe")


def _filter3x3(images: torch.Tensor, pick, fill: float) -> torch.Tensor:
    """3x3 max (or min) filter of [B, 1, H, W] images, separably: 4 element-wise ops instead of max_pool2d, whose
    CPU kernel is far slower on one-channel images (docs/benchmarks.md, "The Trainer")."""
    padded = F.pad(images, (1, 1, 1, 1), value=fill)
    rows = pick(pick(padded[..., :, :-2], padded[..., :, 1:-1]), padded[..., :, 2:])
    return pick(pick(rows[..., :-2, :], rows[..., 1:-1, :]), rows[..., 2:, :])


class GlyphAugment:
    """Random glyph augmentation on a whole batch at once: stroke width, a small affine, noise, then normalisation.

    Takes uint8 renders [B, 1, H, W] (or one [1, H, W]), light ink on black, and returns normalised float images.
    Batched because per-image torchvision transforms cost more than the small CPU model's own step; the randomness
    comes from torch's global generator, so seed it (SeededTransform, or fork_rng + manual_seed per batch).
    - Stroke width: blend towards a 3x3 dilation (thicker) or erosion (thinner) by an amount drawn from
      [-max_thinning, max_thickening]; blending keeps hairline strokes of a 32-pixel glyph from vanishing.
    - Affine: rotation within +-degrees, scale within `scale`, shift within +-2 pixels at 32 px (scaled with size).
      Never a flip: a mirrored glyph is another character (or none).
    - Gaussian noise of std `noise`, clipped to [0, 1].
    """

    def __init__(self, image_size: int, mean: tuple[float, ...], std: tuple[float, ...], degrees: float = 4.0,
                 scale: tuple[float, float] = (0.9, 1.1), max_thinning: float = 0.5, max_thickening: float = 1.0,
                 noise: float = 0.05):
        if not (0.0 <= max_thinning <= 1.0 and 0.0 <= max_thickening <= 1.0):
            raise ValueError(
                f"GlyphAugment stroke amounts must lie in [0, 1], got max_thinning={max_thinning}, "
                f"max_thickening={max_thickening}"
            )
        self.image_size = image_size
        self.mean, self.std = float(mean[0]), float(std[0])
        self.degrees, self.scale, self.noise = degrees, scale, noise
        self.max_thinning, self.max_thickening = max_thinning, max_thickening
        self.max_shift_px = 2.0 * image_size / 32  # rounded to whole pixels per image, as torchvision's RandomAffine

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        single = pixels.dim() == 3
        images = (pixels.unsqueeze(0) if single else pixels).float().div_(255.0)
        count = images.shape[0]

        amount = torch.empty(count, 1, 1, 1).uniform_(-self.max_thinning, self.max_thickening)
        thicker = _filter3x3(images, torch.maximum, float("-inf"))  # = max_pool2d(3, stride 1, padding 1)
        thinner = _filter3x3(images, torch.minimum, float("inf"))
        images = images + amount.abs() * (torch.where(amount >= 0, thicker, thinner) - images)

        angle = torch.empty(count).uniform_(-self.degrees, self.degrees).deg2rad_()
        zoom = torch.empty(count).uniform_(*self.scale)
        shift_px = torch.empty(count, 2).uniform_(-self.max_shift_px, self.max_shift_px).round_()
        shift = shift_px * (2.0 / images.shape[-1])  # in affine_grid's [-1, 1] coordinates
        cos, sin = angle.cos() / zoom, angle.sin() / zoom  # affine_grid maps output to input: the inverse map
        theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
        grid = F.affine_grid(theta, list(images.shape), align_corners=False)
        images = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

        images = (images + self.noise * torch.randn_like(images)).clamp_(0.0, 1.0)
        images = (images - self.mean) / self.std
        return images[0] if single else images

    def __repr__(self) -> str:
        return (f"GlyphAugment(size={self.image_size}, degrees={self.degrees}, scale={self.scale}, "
                f"stroke=[-{self.max_thinning}, +{self.max_thickening}], noise={self.noise})")


def eval_transform(image_kind: str, image_size: int, mean, std, normalization: str | None = None) -> v2.Compose:
    """A model's deterministic input, the one transform of every test split and every query: an image (PIL or
    uint8 tensor) -> float [C, size, size], normalised.

    image_kind: "glyph" (resized to the square: glyphs fill the frame, a crop would cut strokes off) or "photo"
    (the short side resized to size * 256/224, the centre cropped, the usual evaluation crop). normalization, as in
    `EmbeddingModel`'s config and `DatasetInfo`: None scales pixels to [0, 1] before (x - mean) / std; "caffe" keeps
    them on the 0-255 scale, with mean and std given on that scale.
    """
    if image_kind == "photo":
        resize = [v2.Resize(photo_resize_size(image_size)), v2.CenterCrop(image_size)]
    else:
        resize = [v2.Resize((image_size, image_size))]
    return v2.Compose([*resize, v2.ToImage(), v2.ToDtype(torch.float32, scale=normalization is None),
                       v2.Normalize(mean=list(mean), std=list(std)), v2.ToPureTensor()])


def glyph_test_transform(image_size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> v2.Compose:
    """The deterministic glyph transform: uint8 [1, H, W] -> float in [0, 1] -> normalised."""
    return eval_transform("glyph", image_size, mean, std)


def photo_normalization(normalization: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of a photo normalisation preset: "imagenet" (on 0-1 pixels) or "caffe" (on 0-255 pixels)."""
    if normalization == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    if normalization == "caffe":
        return CAFFE_MEAN, CAFFE_STD
    raise ValueError(f"unknown normalization {normalization!r}: use one of {', '.join(PHOTO_NORMALIZATIONS)}")


def _to_normalised_tensor(normalization: str) -> list:
    mean, std = photo_normalization(normalization)
    return [
        v2.ToImage(),
        # Caffe-style models take 0-255 pixels: convert the dtype without rescaling.
        v2.ToDtype(torch.float32, scale=normalization != "caffe"),
        v2.Normalize(mean=list(mean), std=list(std)),
        v2.ToPureTensor(),
    ]


def photo_train_transform(image_size: int, normalization: str = "imagenet") -> v2.Compose:
    """The DML training recipe for RGB photos: RandomResizedCrop(image_size) + horizontal flip, normalised."""
    return v2.Compose(
        [v2.RandomResizedCrop(image_size), v2.RandomHorizontalFlip(), *_to_normalised_tensor(normalization)]
    )


def photo_resize_size(image_size: int) -> int:
    """The shorter-side resize before the centre crop: 256 for a 224 crop, in proportion for other sizes."""
    return round(image_size * 256 / 224)


def photo_test_transform(image_size: int, normalization: str = "imagenet") -> v2.Compose:
    """The DML evaluation recipe for RGB photos: Resize(256/224 * image_size) + CenterCrop(image_size), normalised
    by the preset `normalization` ("imagenet" or "caffe")."""
    mean, std = photo_normalization(normalization)
    return eval_transform("photo", image_size, mean, std, "caffe" if normalization == "caffe" else None)


_SAMPLE_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("memvir_sample_seed", default=None)


@contextlib.contextmanager
def sample_seed(seed: int):
    """Within this block, a SeededTransform draws its randomness from `seed` alone instead of its stream.

    The Trainer gives every sample a seed made of (run seed, epoch, position), so the augmentation of a sample does
    not depend on what came before it: a run stopped at any step and resumed sees exactly the same images.
    """
    token = _SAMPLE_SEED.set(seed)
    try:
        yield
    finally:
        _SAMPLE_SEED.reset(token)


class SeededTransform:
    """Runs a random torchvision transform with its randomness drawn from a stream seeded by `seed`
    (or from the seed of `sample_seed`, when the caller gives one).

    torchvision's v2 transforms draw from torch's global generator. Here each call first seeds that generator (CPU
    only, inside `torch.random.fork_rng`, so the caller's own random state is left as it was) with the next number
    of a per-process stream. In the main process the stream is seeded by `seed` alone, so a run with
    `num_workers=0` augments identically for the same seed. In a DataLoader worker it is seeded by `seed` and the
    worker's own seed, which the DataLoader draws afresh for every epoch from the main process's torch generator:
    workers never repeat each other or the previous epoch, and the run is reproducible given the trainer's seed.
    """

    def __init__(self, transform, seed: int):
        self.transform = transform
        self.seed = seed
        self._stream: np.random.Generator | None = None
        self._stream_owner: tuple | None = None

    def _next_seed(self) -> int:
        worker = get_worker_info()
        owner = (os.getpid(), worker.seed if worker is not None else None)
        if owner != self._stream_owner:
            entropy = [self.seed] if worker is None else [self.seed, worker.seed]
            self._stream = np.random.default_rng(entropy)
            self._stream_owner = owner
        return int(self._stream.integers(2**63))

    def __call__(self, image):
        explicit = _SAMPLE_SEED.get()
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(self._next_seed() if explicit is None else explicit)
            return self.transform(image)

    def __repr__(self) -> str:
        return f"SeededTransform(seed={self.seed}, transform={self.transform!r})"
