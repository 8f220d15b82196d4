"""Datasets for deep metric learning: the embedded glyphs, the three benchmarks, class folders, uploaded zips and
image-classification datasets from the Hugging Face Hub.

`load_dataset(name, ...)` returns the train and test splits (disjoint classes) and a `DatasetInfo`;
`ClassBalancedSampler` draws P classes x K images per batch. All bad input raises `DatasetError` (a ValueError).

- `registry`: `load_dataset`, a name to its splits. `splits`: the splits' interface and facts.
- `glyphs/`: the embedded dataset. `benchmarks`: CUB-200-2011, CARS196, SOP in their published layouts.
- `image_files`: photo datasets as image files, and the class-wise split. `folder`: `folder:PATH`. `zips`: uploads.
- `hub/`: `hf:OWNER/NAME[@REVISION]`, a Hub dataset through 🤗 datasets, split by class as the benchmarks are.
- `transforms`: glyph augmentation and the photo recipes. `batches`, `samplers`: seeded training batches.
- `validation`: validation classes (and class-disjoint folds) held out of training. `errors`: `DatasetError`.
"""

from memvir.data.errors import DatasetError
from memvir.data.registry import DATASET_NAMES, load_dataset
from memvir.data.samplers import ClassBalancedSampler
from memvir.data.splits import DatasetInfo, DatasetSplits, SplitDataset
from memvir.data.zips import extract_class_zip

__all__ = [
    "DATASET_NAMES",
    "ClassBalancedSampler",
    "DatasetError",
    "DatasetInfo",
    "DatasetSplits",
    "SplitDataset",
    "extract_class_zip",
    "load_dataset",
]
