"""GalleryIndex: the embeddings of a gallery, searchable by cosine similarity, with labels and item names beside.

The vectors live L2-normalised in an exact faiss inner-product index (``IndexFlatIP``) or in a float32 array
searched by the chunked torch search, whichever ``memvir.metrics.search_backend`` finds faster on the machine (an
array where faiss is not installed). Either way the search is ``memvir.metrics``' own, so the app's results and
the metrics agree.

On disk a saved index is a folder: the vectors (``index.faiss`` written by ``faiss.write_index``, or
``vectors.npy`` when saved without faiss) and ``gallery.json`` (size, dimension, labels, items). Nothing is pickled.
"""

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from memvir.metrics import flat_inner_product_index, l2_normalized, search_backend, search_unit_gallery

SIDECAR_FILE = "gallery.json"
FAISS_VECTORS_FILE = "index.faiss"
NUMPY_VECTORS_FILE = "vectors.npy"
_FORMAT = "memvir.GalleryIndex"
_FORMAT_VERSION = 1


class SearchHit(NamedTuple):
    """One search result: gallery row, cosine similarity, and that row's label and item (None when not given)."""

    index: int
    score: float
    label: int | str | None
    item: str | None


def _as_label_list(labels, size):
    """Labels as a list of Python ints or strs (what JSON keeps exactly), one per gallery row."""
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if array.ndim != 1 or array.shape[0] != size:
        raise ValueError(f"labels must be 1-D with one label per embedding ({size}); got shape {array.shape}")
    if np.issubdtype(array.dtype, np.integer):
        return [int(label) for label in array]
    if np.issubdtype(array.dtype, np.str_):
        return [str(label) for label in array]
    raise ValueError(f"labels must be integers or strings; got dtype {array.dtype}")


def _as_item_list(items, size):
    items = list(items)
    if len(items) != size:
        raise ValueError(f"items must hold one name or path per embedding ({size}); got {len(items)}")
    not_text = [item for item in items if not isinstance(item, str | Path)]
    if not_text:
        raise ValueError(f"items must be strings (ids or paths); got {type(not_text[0]).__name__} {not_text[0]!r}")
    return [str(item) for item in items]


class GalleryIndex:
    """Gallery embeddings plus optional labels and items (ids or paths); build with ``GalleryIndex.build``.

    ``labels`` and ``items`` are lists aligned with the rows (or None); ``len(index)`` is the number of rows.
    """

    def __init__(self, vectors, labels=None, items=None):
        """``vectors``: a faiss index or a float32 [N, D] array of L2-normalised rows; use ``build`` or ``load``."""
        self._vectors = vectors
        self.labels = labels
        self.items = items

    @classmethod
    def build(cls, embeddings, labels=None, items=None, backend="auto"):
        """Index ``embeddings`` [N, D] (tensor on any device, any float dtype, or array); they are L2-normalised.

        labels: optional [N] integers or strings. items: optional N strings (ids, file paths). backend: "auto"
        (the faster search on this machine, see ``memvir.metrics.search_backend``), "faiss", or "torch" (a plain
        array searched by the torch search).
        """
        vectors = l2_normalized(embeddings, "embeddings").cpu().numpy()
        size = vectors.shape[0]
        labels = None if labels is None else _as_label_list(labels, size)
        items = None if items is None else _as_item_list(items, size)
        return cls(_vector_store(vectors, backend), labels, items)

    def __len__(self):
        return self._vectors.ntotal if self.uses_faiss else self._vectors.shape[0]

    def __repr__(self):
        return (
            f"GalleryIndex(size={len(self)}, dim={self.dim}, labels={self.labels is not None}, faiss={self.uses_faiss})"
        )

    @property
    def uses_faiss(self):
        """True when the vectors live in a faiss index, False when in an array searched by torch."""
        return not isinstance(self._vectors, np.ndarray)

    @property
    def dim(self):
        return self._vectors.d if self.uses_faiss else self._vectors.shape[1]

    def search_arrays(self, queries, k):
        """(scores [Nq, k] float32, gallery indices [Nq, k] int64) of the k nearest items of each query.

        queries: [Nq, D] or a single [D] vector (tensor or array). Rows are ordered by score, ties by lower index.
        Raises ValueError when D differs from the index's or k is not in 1..len(self).
        """
        queries = queries.detach() if isinstance(queries, torch.Tensor) else np.asarray(queries)
        if queries.ndim == 1:
            queries = queries[None]
        if self.uses_faiss:
            return search_unit_gallery(queries, self._vectors, k, backend="faiss")
        return search_unit_gallery(queries, torch.from_numpy(self._vectors), k, backend="torch")

    def search(self, queries, k):
        """The k nearest items of each query as ``SearchHit`` lists, best first (one list per query row).

        queries: [Nq, D] or a single [D] vector; errors as ``search_arrays``.
        """
        scores, indices = self.search_arrays(queries, k)
        return [
            [
                SearchHit(
                    index=int(index),
                    score=float(score),
                    label=None if self.labels is None else self.labels[index],
                    item=None if self.items is None else self.items[index],
                )
                for score, index in zip(row_scores, row_indices, strict=True)
            ]
            for row_scores, row_indices in zip(scores, indices, strict=True)
        ]

    def save(self, directory):
        """Write the index into ``directory`` (created if missing) and return its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.uses_faiss:
            import faiss

            vectors_file = FAISS_VECTORS_FILE
            faiss.write_index(self._vectors, str(directory / vectors_file))
        else:
            vectors_file = NUMPY_VECTORS_FILE
            np.save(directory / vectors_file, self._vectors, allow_pickle=False)
        sidecar = {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "vectors_file": vectors_file,
            "size": len(self),
            "dim": self.dim,
            "labels": self.labels,
            "items": self.items,
        }
        (directory / SIDECAR_FILE).write_text(json.dumps(sidecar), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory, backend="auto"):
        """Read an index written by ``save``. backend: as in ``build`` (a saved faiss index needs faiss to read).

        Raises ValueError naming the file expected when ``directory`` holds no index or a damaged one.
        """
        directory = Path(directory)
        sidecar = _read_sidecar(directory)
        vectors_path = directory / sidecar["vectors_file"]
        if not vectors_path.is_file():
            raise ValueError(
                f"{directory} is not a complete gallery index: {SIDECAR_FILE} names {sidecar['vectors_file']}, "
                "which is missing; save the index again"
            )
        if sidecar["vectors_file"] == FAISS_VECTORS_FILE:
            vectors = _read_faiss_index(vectors_path)
            if search_backend(backend) == "torch":
                vectors = vectors.reconstruct_n(0, vectors.ntotal)
        else:
            vectors = np.load(vectors_path, allow_pickle=False)
            if vectors.ndim != 2 or vectors.dtype != np.float32:
                raise ValueError(f"{vectors_path} holds {vectors.dtype} of shape {vectors.shape}, not [N, D] float32")
            vectors = _vector_store(vectors, backend)
        index = cls(vectors)
        if (len(index), index.dim) != (sidecar["size"], sidecar["dim"]):
            raise ValueError(
                f"{vectors_path} holds {len(index)} vectors of dimension {index.dim} but {SIDECAR_FILE} says "
                f"{sidecar['size']} of dimension {sidecar['dim']}; the folder mixes two indexes, save it again"
            )
        index.labels = None if sidecar["labels"] is None else _as_label_list(sidecar["labels"], len(index))
        index.items = None if sidecar["items"] is None else _as_item_list(sidecar["items"], len(index))
        return index


def _vector_store(unit_vectors, backend):
    """Where normalised float32 vectors [N, D] live: a faiss flat inner-product index, or the array itself."""
    return flat_inner_product_index(unit_vectors) if search_backend(backend) == "faiss" else unit_vectors


def _read_sidecar(directory):
    path = directory / SIDECAR_FILE
    if not path.is_file():
        raise ValueError(
            f"{directory} is not a gallery index: expected {SIDECAR_FILE} in it (written by GalleryIndex.save)"
        )
    try:
        sidecar = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); save the index again") from error
    if not isinstance(sidecar, dict) or sidecar.get("format") != _FORMAT:
        raise ValueError(f'{path} is not a GalleryIndex sidecar (no "format": "{_FORMAT}" in it)')
    if sidecar.get("version") != _FORMAT_VERSION:
        raise ValueError(f"{path} has format version {sidecar.get('version')!r}; this code reads {_FORMAT_VERSION}")
    if sidecar.get("vectors_file") not in (FAISS_VECTORS_FILE, NUMPY_VECTORS_FILE):
        raise ValueError(
            f"{path} names vectors file {sidecar.get('vectors_file')!r}; expected {FAISS_VECTORS_FILE} "
            f"or {NUMPY_VECTORS_FILE}"
        )
    return sidecar


def _read_faiss_index(path):
    """The faiss inner-product index saved at ``path`` (its vectors are already L2-normalised)."""
    try:
        import faiss
    except ImportError as error:
        raise ImportError(f"{path} was saved with faiss; reading it needs the faiss-cpu package") from error
    index = faiss.read_index(str(path))
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(f"{path} is not an inner-product faiss index; it was not written by GalleryIndex.save")
    return index
