"""Datasets for deep metric learning: the embedded glyphs, the three benchmarks, class folders and uploaded zips.

`load_dataset(name, ...)` returns the train and test splits (disjoint classes) and a `DatasetInfo`;
`ClassBalancedSampler` draws P classes x K images per batch. All bad input raises `DatasetError` (a ValueError).
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
