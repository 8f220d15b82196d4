"""`load_dataset`: one entry point from a dataset name to its train and test splits."""

from pathlib import Path

from memvir.data.benchmarks import load_cars196, load_cub200, load_sop
from memvir.data.errors import DatasetError
from memvir.data.folder import load_folder
from memvir.data.glyphs.dataset import GLYPH_IMAGE_SIZE, GLYPH_VARIANTS, load_glyphs
from memvir.data.hub import HUB_PREFIX, load_hub_dataset
from memvir.data.image_files import PHOTO_IMAGE_SIZE
from memvir.data.splits import DatasetSplits
from memvir.data.transforms import PHOTO_NORMALIZATIONS

DATASET_NAMES = ("glyphs", "glyphs-mini", "glyphs-pretrain", "glyphs-few", "cub200", "cars196", "sop")
FOLDER_PREFIX = "folder:"
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 1024
_BENCHMARK_LOADERS = {"cub200": load_cub200, "cars196": load_cars196, "sop": load_sop}


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
    if name in GLYPH_VARIANTS:
        if normalization is not None:
            raise DatasetError(
                f"normalization={normalization!r} applies to photo datasets only; {name} uses its own mean and std "
                "(pass normalization=None)"
            )
        return load_glyphs(name, image_size=image_size or GLYPH_IMAGE_SIZE, seed=seed)
    normalization = normalization or "imagenet"
    if normalization not in PHOTO_NORMALIZATIONS:
        raise DatasetError(f"unknown normalization {normalization!r}: use one of {', '.join(PHOTO_NORMALIZATIONS)}")
    photo_size = image_size or PHOTO_IMAGE_SIZE
    if name.startswith(FOLDER_PREFIX):
        folder = Path(name.removeprefix(FOLDER_PREFIX)).expanduser()
        if not folder.parts:
            raise DatasetError(f"{name!r} names no folder: write folder:PATH, PATH holding one sub-folder per class")
        if data_root is not None and not folder.is_absolute():
            folder = Path(data_root).expanduser() / folder
        return load_folder(folder, photo_size, normalization, seed)
    if name.startswith(HUB_PREFIX):
        return load_hub_dataset(name, photo_size, normalization, seed, image_column, label_column)
    if name in _BENCHMARK_LOADERS:
        return _BENCHMARK_LOADERS[name](data_root, photo_size, normalization, seed)
    raise DatasetError(f"unknown dataset {name!r}: use one of {', '.join(DATASET_NAMES)}, folder:PATH or "
                       "hf:OWNER/NAME[@REVISION]")
