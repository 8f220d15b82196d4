"""`load_dataset`: one entry point from a dataset name to its train and test splits.

The named datasets sit in `DATASET_REGISTRY` (memvir._registry's one shape), each as a loader
`(name, data_root, image_size, normalization, seed) -> DatasetSplits`; `folder:PATH` and `hf:OWNER/NAME[@REVISION]`
name a folder or a Hub dataset rather than an entry, so they are read by prefix.
"""

from collections.abc import Callable
from pathlib import Path

from memvir._registry import Registry
from memvir.data.benchmarks import load_cars196, load_cub200, load_sop
from memvir.data.errors import DatasetError
from memvir.data.folder import load_folder
from memvir.data.glyphs.dataset import GLYPH_IMAGE_SIZE, GLYPH_VARIANTS, load_glyphs
from memvir.data.hub import HUB_PREFIX, load_hub_dataset
from memvir.data.image_files import PHOTO_IMAGE_SIZE
from memvir.data.splits import DatasetSplits
from memvir.data.transforms import PHOTO_NORMALIZATIONS

FOLDER_PREFIX = "folder:"
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 1024

DatasetLoader = Callable[..., DatasetSplits]  # (name, data_root, image_size, normalization, seed)
DATASET_REGISTRY: Registry[DatasetLoader] = Registry(
    "dataset", other_forms=(f"{FOLDER_PREFIX}PATH", f"{HUB_PREFIX}OWNER/NAME[@REVISION]"), error=DatasetError)
"""The datasets `load_dataset` knows by name (the glyph variants, then the benchmarks)."""


def _photo_settings(image_size: int | None, normalization: str | None) -> tuple[int, str]:
    """The side and normalization of a photo dataset: the defaults for None, a DatasetError for an unknown recipe."""
    normalization = normalization or "imagenet"
    if normalization not in PHOTO_NORMALIZATIONS:
        raise DatasetError(f"unknown normalization {normalization!r}: use one of {', '.join(PHOTO_NORMALIZATIONS)}")
    return image_size or PHOTO_IMAGE_SIZE, normalization


def _load_glyph_variant(name, data_root, image_size, normalization, seed) -> DatasetSplits:
    if normalization is not None:
        raise DatasetError(
            f"normalization={normalization!r} applies to photo datasets only; {name} uses its own mean and std "
            "(pass normalization=None)"
        )
    return load_glyphs(name, image_size=image_size or GLYPH_IMAGE_SIZE, seed=seed)


def _benchmark_loader(load) -> DatasetLoader:
    """A registry loader for a benchmark loader `load(data_root, image_size, normalization, seed)`."""

    def load_benchmark(name, data_root, image_size, normalization, seed) -> DatasetSplits:
        return load(data_root, *_photo_settings(image_size, normalization), seed)

    return load_benchmark


for _variant in GLYPH_VARIANTS:
    DATASET_REGISTRY.register(_variant)(_load_glyph_variant)
for _benchmark, _load in (("cub200", load_cub200), ("cars196", load_cars196), ("sop", load_sop)):
    DATASET_REGISTRY.register(_benchmark)(_benchmark_loader(_load))

DATASET_NAMES = DATASET_REGISTRY.names()


def _check_arguments(name, image_size, seed) -> None:
    if not isinstance(name, str):
        raise DatasetError(f"dataset name must be a string such as 'glyphs', got {name!r}")
    if image_size is not None and (
        isinstance(image_size, bool)
        or not isinstance(image_size, int)
        or not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE
    ):
        raise DatasetError(
            f"image_size must be an integer from {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} (or None for the dataset's "
            f"default), got {image_size!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DatasetError(f"seed must be a non-negative integer, got {seed!r}")


def load_dataset(
    name: str,
    data_root: str | Path | None = None,
    image_size: int | None = None,
    seed: int = 0,
    normalization: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
) -> DatasetSplits:
    """Load a dataset by name: `glyphs`, `glyphs-mini`, `glyphs-pretrain`, `glyphs-few`, `cub200`, `cars196`, `sop`,
    `folder:PATH` or `hf:OWNER/NAME[@REVISION]` (glyphs-pretrain and glyphs-few: a pretraining set and a disjoint
    fine-tuning set, memvir.data.glyphs.dataset; hf: a Hub image-classification dataset, memvir.data.hub).

    data_root: the benchmark's folder (needed for cub200, cars196 and sop); a relative `folder:PATH` is taken
        inside it when given.
    image_size: the side of the square model input; None gives 32 for glyphs and 224 for photos.
    seed: seeds the train split's augmentation stream (see `transforms.SeededTransform`). Class splits never
        depend on it: every run tests on the same classes.
    normalization: for photos, "imagenet" (the default) or "caffe" (0-255 pixels, BN-Inception's means);
        glyphs have their own and take None.
    image_column, label_column: for `hf:` datasets, the columns holding the images and the classes (None: the
        dataset's one Image and one ClassLabel feature).
    """
    _check_arguments(name, image_size, seed)
    if (image_column or label_column) and not name.startswith(HUB_PREFIX):
        raise DatasetError(f"image_column and label_column (--image-column, --label-column) name the columns of a "
                           f"Hub dataset (hf:OWNER/NAME); {name!r} has none: leave them out")
    if not name.startswith((FOLDER_PREFIX, HUB_PREFIX)):
        return DATASET_REGISTRY.get(name)(name, data_root, image_size, normalization, seed)
    photo_size, normalization = _photo_settings(image_size, normalization)
    if name.startswith(FOLDER_PREFIX):
        folder = Path(name.removeprefix(FOLDER_PREFIX)).expanduser()
        if not folder.parts:
            raise DatasetError(f"{name!r} names no folder: write folder:PATH, PATH holding one sub-folder per class")
        if data_root is not None and not folder.is_absolute():
            folder = Path(data_root).expanduser() / folder
        return load_folder(folder, photo_size, normalization, seed)
    return load_hub_dataset(name, photo_size, normalization, seed, image_column, label_column)
