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
from torchvision import tv_tensors
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# BN-Inception's Caffe means, listed in RGB order (its Caffe weights list them as BGR 104, 117, 128) on 0-255 pixels
# with unit std. The channel order stays RGB: a model that wants BGR flips its first layer, not every image.
CAFFE_MEAN = (128.0, 117.0, 104.0)
CAFFE_STD = (1.0, 1.0, 1.0)
PHOTO_NORMALIZATIONS = ("imagenet", "caffe")


class RandomStrokeWidth(v2.Transform):
    """Thicken or thin the strokes of a light-on-dark image by a random amount.

    Dilation is a 3x3 max-pool, erosion a 3x3 max-pool of the inverted image; the output blends the image towards
    one of them by an amount drawn from [-max_thinning, max_thickening] (negative thins). Blending rather than a full
    pool keeps hairline strokes of a 32-pixel glyph from vanishing under erosion.
    """

    _transformed_types = (torch.Tensor,)

    def __init__(self, max_thinning: float = 0.5, max_thickening: float = 1.0):
        super().__init__()
        if not (0.0 <= max_thinning <= 1.0 and 0.0 <= max_thickening <= 1.0):
            raise ValueError(
                f"RandomStrokeWidth amounts must lie in [0, 1], got max_thinning={max_thinning}, "
                f"max_thickening={max_thickening}"
            )
        self.max_thinning = max_thinning
        self.max_thickening = max_thickening

    def make_params(self, flat_inputs: list) -> dict:
        amount = torch.empty(()).uniform_(-self.max_thinning, self.max_thickening).item()
        return {"amount": amount}

    def transform(self, inpt: torch.Tensor, params: dict) -> torch.Tensor:
        amount = params["amount"]
        image = inpt.as_subclass(torch.Tensor)
        if amount >= 0:
            target = F.max_pool2d(image, kernel_size=3, stride=1, padding=1)
        else:
            target = -F.max_pool2d(-image, kernel_size=3, stride=1, padding=1)
        blended = image + abs(amount) * (target - image)
        return tv_tensors.wrap(blended, like=inpt) if isinstance(inpt, tv_tensors.TVTensor) else blended


def glyph_train_transform(image_size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> v2.Compose:
    """Random augmentation of a glyph (uint8 tensor [1, H, W], ink light): stroke width, small affine, noise.

    Never a flip: a mirrored glyph is another character (or none). Shifts are 2 pixels at 32 px, scaled with size.
    """
    return v2.Compose(
        [
            v2.ToDtype(torch.float32, scale=True),
            RandomStrokeWidth(max_thinning=0.5, max_thickening=1.0),
            v2.RandomAffine(
                degrees=4.0,
                translate=(2 / 32, 2 / 32),
                scale=(0.9, 1.1),
                interpolation=v2.InterpolationMode.BILINEAR,
                fill=0.0,
            ),
            v2.GaussianNoise(sigma=0.05, clip=True),
            v2.Normalize(mean=list(mean), std=list(std)),
            v2.ToPureTensor(),
        ]
    )


def glyph_test_transform(mean: tuple[float, ...], std: tuple[float, ...]) -> v2.Compose:
    """The deterministic glyph transform: uint8 [1, H, W] -> float in [0, 1] -> normalised."""
    return v2.Compose(
        [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=list(mean), std=list(std)), v2.ToPureTensor()]
    )


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
    """The DML evaluation recipe for RGB photos: Resize(256/224 * image_size) + CenterCrop(image_size), normalised."""
    return v2.Compose(
        [v2.Resize(photo_resize_size(image_size)), v2.CenterCrop(image_size), *_to_normalised_tensor(normalization)]
    )


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
