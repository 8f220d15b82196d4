"""The embedded glyph dataset: Unicode characters in twelve DejaVu faces; works offline, with nothing to download.

`glyphs` holds every character that survives the checks in `glyph_render` (about 2,000 classes); `glyphs-mini` is
48 characters drawn from the same candidates by a fixed shuffle and checked the same way, for fast tests. A face whose
glyph for a kept character is another character's (`misdrawn`) loses that one image, not the class: the class keeps
its other faces, and the class list, hence the split, stays what the renders alone decide. Classes,
not images, are split: half train, half test, by a fixed project seed. The clean renders are cached on disk (one
.npz per variant and image size), so only the first start renders (docs/benchmarks.md, "The Trainer", has the
time); later starts load the file.

Two more variants stage the paper's setting, a backbone pretrained on a large class set and fine-tuned on about a
hundred classes of another domain (docs/method.md, "Pretraining and fine-tuning"), from `glyphs`' own classes:

- `glyphs-few`: the letters of the three alphabets in `FINE_TUNE_BLOCKS` (Cyrillic, Armenian, Georgian), split in
  half by the project seed into fine-tuning (train) and test classes, about 116 each, each half mixing the three.
  Two of the scripts share no letter shape with the rest; Cyrillic does in part, but its characters that render
  like a Latin or Greek one were already dropped from `glyphs` (`glyph_render`).
- `glyphs-pretrain`: everything else, split as `glyphs` splits it: its train classes are `glyphs`' train classes
  outside those scripts (Latin in all its blocks, Greek, phonetic letters, arrows, box drawing, mathematical and
  other symbols: about 900), its test classes `glyphs`' test classes outside them. So a backbone pretrained on it
  has seen no character of `glyphs-few` and none of `glyphs`' test classes either.
"""

import hashlib

import numpy as np
import torch
from PIL import Image

from memvir.data.glyphs.cache import cache_dir, load_arrays, save_arrays
from memvir.data.glyphs.misdrawn import misdrawn_faces
from memvir.data.glyphs.render import (
    FACE_FILES,
    FONT_DIR,
    NUM_FACES,
    SCRIPT_BLOCKS,
    candidate_code_points,
    class_name,
    render_glyph_classes,
)
from memvir.data.splits import DatasetInfo, DatasetSplits, SplitDataset
from memvir.data.transforms import GlyphAugment, SeededTransform, glyph_test_transform

GLYPH_VARIANTS = ("glyphs", "glyphs-mini", "glyphs-pretrain", "glyphs-few")
GLYPH_IMAGE_SIZE = 32
# Project constants, not training seeds: every run, whatever its seed, trains and tests on the same classes.
GLYPH_SPLIT_SEED = 2021
GLYPH_MINI_SAMPLE_SEED = 224
GLYPH_MINI_CLASSES_PER_SPLIT = 24
# glyphs-few's scripts (names of render.SCRIPT_BLOCKS): whole alphabets, so that fine-tuning and test classes are of
# another kind than the pretraining ones (as cars are beside ImageNet), and a few hundred letters in all.
FINE_TUNE_BLOCKS = ("Cyrillic", "Cyrillic Supplement", "Armenian", "Georgian")
# Measured on the clean 32-pixel train renders of `glyphs` (ink is 1, background 0), rounded: most pixels are
# background, so centring on 0.5 would leave inputs far off zero mean. Every variant uses them, so a backbone
# pretrained on one variant sees its inputs on the same scale when fine-tuned on another.
GLYPH_MEAN = (0.096,)
GLYPH_STD = (0.272,)
# Part of the cache key: raise it whenever the rendering changes, so no stale cache is read.
_RENDER_VERSION = 2


class GlyphDataset(SplitDataset):
    """One split of the glyph dataset: its items are the (class, face) renders, class by class, face by face.

    `renders` holds the clean uint8 renders [classes, 12, H, W] (ink 255 on 0). A face whose glyph draws another
    character is left blank there (`glyph_classes`) and is no item, so that class has eleven items; every other
    class has twelve (in a split with no image dropped, item i is face i % 12 of class i // 12). `transform` maps a
    uint8 tensor [1, H, W] to the model's input (random augmentation for train, plain normalisation for test).
    """

    def __init__(self, code_points: np.ndarray, renders: np.ndarray, transform, batch_transform=None):
        # a clean render is never blank (the renderer rejects blank glyphs), so blank marks a dropped image
        self.items = np.flatnonzero(renders.any(axis=(2, 3)).ravel())  # class * NUM_FACES + face
        super().__init__(
            labels=self.items // NUM_FACES,
            class_names=[class_name(int(code_point)) for code_point in code_points],
        )
        self.code_points = code_points
        self.renders = renders
        self.transform = transform
        self.batch_transform = batch_transform

    def image(self, index: int) -> Image.Image:
        label, face = divmod(int(self.items[index]), NUM_FACES)
        return Image.fromarray(self.renders[label, face])

    def raw(self, index: int) -> tuple[torch.Tensor, int]:
        """The clean uint8 render [1, H, W] and label of item `index`, for `batch_transform`."""
        label, face = divmod(int(self.items[index]), NUM_FACES)
        return torch.from_numpy(self.renders[label, face]).unsqueeze(0), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        pixels, label = self.raw(index)
        return self.transform(pixels), label


def _variant_candidates(variant: str) -> tuple[list[int], int | None]:
    """The candidate code points of a variant, in the order they are tried, and how many classes it keeps."""
    candidates = candidate_code_points()
    if variant == "glyphs":
        return candidates, None
    if variant != "glyphs-mini":  # the other variants are cut from glyphs' classes (variant_classes)
        raise ValueError(f"glyph_classes renders glyphs or glyphs-mini, not {variant!r}: use variant_classes")
    # glyphs-mini: the first survivors of a fixed shuffle, so scripts mix and only about a hundred are rendered.
    order = np.random.default_rng(GLYPH_MINI_SAMPLE_SEED).permutation(len(candidates))
    return [candidates[i] for i in order], 2 * GLYPH_MINI_CLASSES_PER_SPLIT


def _cache_key(candidates: list[int], limit: int | None, image_size: int) -> str:
    """A digest of everything the renders depend on: the fonts' bytes, the candidates, the limit, the size."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"v{_RENDER_VERSION} size={image_size} limit={limit}".encode())
    digest.update(np.asarray(candidates, dtype=np.int32).tobytes())
    for file_name in FACE_FILES:
        digest.update((FONT_DIR / file_name).read_bytes())
    return digest.hexdigest()


def glyph_classes(variant: str, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The classes of `glyphs` or `glyphs-mini`: (code points int32 [n], clean renders uint8 [n, 12, size, size]).

    A face whose glyph for the character draws another character (`misdrawn_faces`) is left blank. Read from the
    disk cache when a valid file is there; otherwise rendered and written to it.
    """
    candidates, limit = _variant_candidates(variant)
    path = cache_dir() / f"{variant}-{image_size}px-{_cache_key(candidates, limit, image_size)}.npz"
    stored = load_arrays(path, ("code_points", "renders"))
    if stored is not None:
        code_points, renders = stored["code_points"], stored["renders"]
        expected_shape = (len(code_points), NUM_FACES, image_size, image_size)
        if code_points.ndim == 1 and renders.dtype == np.uint8 and renders.shape == expected_shape:
            return code_points, renders
    code_points, renders = render_glyph_classes(candidates, image_size, limit=limit)
    by_code_point = np.argsort(code_points)  # glyphs-mini is found in shuffled order; classes read better sorted
    code_points, renders = code_points[by_code_point], renders[by_code_point]
    # Checked after the classes are chosen, so that dropping an image never changes which characters are classes.
    for label, code_point in enumerate(code_points):
        for face in misdrawn_faces(int(code_point)):
            renders[label, face] = 0
    save_arrays(path, code_points=code_points, renders=renders)
    return code_points, renders


def split_glyph_classes(num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Class indices (ascending) of the train and test halves: a permutation by the fixed project seed."""
    order = np.random.default_rng(GLYPH_SPLIT_SEED).permutation(num_classes)
    return np.sort(order[: num_classes // 2]), np.sort(order[num_classes // 2 :])


def in_fine_tune_blocks(code_points: np.ndarray) -> np.ndarray:
    """Whether each code point lies in one of `FINE_TUNE_BLOCKS` (bool [n])."""
    code_points = np.asarray(code_points)
    inside = np.zeros(code_points.shape, dtype=bool)
    for name, first, last in SCRIPT_BLOCKS:
        if name in FINE_TUNE_BLOCKS:
            inside |= (code_points >= first) & (code_points <= last)
    return inside


def variant_classes(variant: str, image_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(code points [n], clean renders [n, 12, size, size], train class indices, test class indices) of a variant.

    `glyphs-pretrain` and `glyphs-few` are cut from `glyphs`' classes (and its cache): the first keeps `glyphs`'
    split less the fine-tuning scripts, the second splits those scripts' classes in half by the project seed.
    """
    if variant in ("glyphs", "glyphs-mini"):
        code_points, renders = glyph_classes(variant, image_size)
        return (code_points, renders, *split_glyph_classes(len(code_points)))
    code_points, renders = glyph_classes("glyphs", image_size)
    few = in_fine_tune_blocks(code_points)
    if variant == "glyphs-few":
        train, test = split_glyph_classes(int(few.sum()))
        chosen = np.flatnonzero(few)
        return code_points, renders, chosen[train], chosen[test]
    train, test = split_glyph_classes(len(code_points))
    return code_points, renders, train[~few[train]], test[~few[test]]


def load_glyphs(variant: str, image_size: int = GLYPH_IMAGE_SIZE, seed: int = 0) -> DatasetSplits:
    """The train and test splits of a glyph variant (`GLYPH_VARIANTS`) at `image_size` pixels (grayscale).

    Train items are the (class, face) renders with fresh random augmentation at every read, drawn from a
    stream seeded by `seed` (see `SeededTransform`); test items are the clean renders, normalised, the same pixels
    in every run and process.
    """
    code_points, renders, train_classes, test_classes = variant_classes(variant, image_size)
    augment = GlyphAugment(image_size, GLYPH_MEAN, GLYPH_STD)
    train = GlyphDataset(code_points[train_classes], renders[train_classes], SeededTransform(augment, seed), augment)
    test = GlyphDataset(code_points[test_classes], renders[test_classes],
                        glyph_test_transform(image_size, GLYPH_MEAN, GLYPH_STD))
    info = DatasetInfo(
        name=variant,
        kind="glyph",
        channels=1,
        image_size=image_size,
        mean=GLYPH_MEAN,
        std=GLYPH_STD,
        num_train_classes=train.num_classes,
        num_test_classes=test.num_classes,
    )
    return DatasetSplits(train=train, test=test, info=info)
