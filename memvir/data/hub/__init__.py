"""Image-classification datasets from the Hugging Face Hub, `hf:OWNER/NAME[@REVISION]`, read through 🤗 datasets.

`load_hub_dataset` returns the same `DatasetSplits` as every loader: the benchmarks' zero-shot protocol on the repo's
images (classes, not images, split), images decoded lazily in the data loader's workers. `datasets` is imported only
when a Hub dataset is loaded.

- `names`: the `hf:` name, parsed into repo id and revision (no third-party import).
- `columns`: the image and label columns, picked from the dataset's features or named by the user.
- `protocol`: which classes train and which test: the repo's own splits when they are class-disjoint, else all
  splits pooled and the classes halved in label order.
- `dataset`: `load_hub_dataset` and `HubImageDataset`, the split that decodes a row's image when it is read.
"""

from memvir.data.hub.dataset import HubImageDataset, load_hub_dataset
from memvir.data.hub.names import HUB_PREFIX, HubDatasetName, parse_hub_name

__all__ = ["HUB_PREFIX", "HubDatasetName", "HubImageDataset", "load_hub_dataset", "parse_hub_name"]
