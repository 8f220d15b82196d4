"""GalleryIndex: the embeddings of a gallery, searchable by cosine similarity, with labels and item names beside.

Three kinds of index, chosen at build time:

- "exact" (the default): every similarity is computed. The vectors live L2-normalised in a faiss inner-product
  index (``IndexFlatIP``) or in a float32 array searched by the chunked torch search, whichever
  ``memvir.retrieval.knn.search_backend`` finds faster on the machine (an array where faiss is not installed). Either
  way the search is ``memvir.retrieval.knn``'s, the one the metrics use, so the app's results and the metrics agree.
- "ivf" (faiss ``IndexIVFFlat``): the vectors are split into ``nlist`` cells by spherical k-means and a query scans
  only the ``nprobe`` cells nearest to it. For galleries that outgrow exact search (a million images); its recall
  against exact search is measured in docs/benchmarks.md.
- "hnsw" (faiss ``IndexHNSWFlat``): a graph of ``m`` links per vector, walked with a beam of ``ef_search``; faster
  to query than IVF at the same recall, slower to build and larger.

The approximate kinds need faiss and keep the vectors themselves (no compression), so a result's score is its exact
cosine similarity; what they may miss is a neighbour. Raising nprobe / ef_search trades speed for recall, also
after building (``set_search_options``).

On disk a saved index is a folder: the vectors (``index.faiss`` written by ``faiss.write_index``, which keeps the
kind and its search options, or ``vectors.npy`` for an exact index saved without faiss) and ``gallery.json``
(size, dimension, labels, items). Nothing is pickled.
"""

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from memvir.retrieval.knn import BACKENDS, flat_inner_product_index, l2_normalized, search_backend, search_unit_gallery

SIDECAR_FILE = "gallery.json"
FAISS_VECTORS_FILE = "index.faiss"
NUMPY_VECTORS_FILE = "vectors.npy"
_FORMAT = "memvir.GalleryIndex"
_FORMAT_VERSION = 1

KINDS = ("exact", "ivf", "hnsw")
# What each kind accepts when built, and which of those can change after building.
BUILD_OPTIONS = {"exact": (), "ivf": ("nlist", "nprobe"), "hnsw": ("m", "ef_construction", "ef_search")}
SEARCH_OPTIONS = {"exact": (), "ivf": ("nprobe",), "hnsw": ("ef_search",)}

# IVF: nlist = 4 sqrt(N) cells (faiss's usual guidance), but never fewer than 39 vectors a cell (below that faiss's
# k-means warns its centroids are unreliable). k-means trains on a sample of 64 vectors a cell, a quarter of
# faiss's default and of its training work; the default nprobe still finds all of the exact top 10 at a million
# vectors (docs/benchmarks.md).
_IVF_CELLS_PER_SQRT_SIZE = 4
_IVF_MIN_POINTS_PER_CELL = 39
_IVF_TRAINING_POINTS_PER_CELL = 64
# nprobe = nlist / 16 cells scanned, a sixteenth of the gallery: recall@10 1.000 at a million vectors, 0.998 at
# 200,000, 0.96 at 4,000 on clustered sets, for a search 12 to 20 times faster than exact. Fewer is faster still.
_IVF_PROBED_FRACTION = 16
# HNSW: 32 links a vector, a construction beam of 80, a search beam of 64: recall@10 1.000 at 200,000 vectors,
# 67 times faster than exact for one query (a beam of 16, faiss's default, gives 0.976).
_HNSW_DEFAULTS = {"m": 32, "ef_construction": 80, "ef_search": 64}


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
    ``search`` finds a query's nearest items, ``save`` and ``load`` keep the index in a folder.

    Args:
        vectors: a faiss index or a float32 [N, D] array of L2-normalised rows; use ``build`` or ``load``, which
            make them.
        labels: each row's label (int or str), or None.
        items: each row's item (an id or a path), or None.
    """

    def __init__(self, vectors, labels=None, items=None):
        self._vectors = vectors
        self.labels = labels
        self.items = items

    @classmethod
    def build(cls, embeddings, labels=None, items=None, backend="auto", kind="exact", **options):
        """Index ``embeddings`` [N, D] (tensor on any device, any float dtype, or array); they are L2-normalised.

        Args:
            embeddings: [N, D], one row per gallery item.
            labels: optional [N] integers or strings.
            items: optional N strings (ids, file paths).
            backend: for "exact": "auto" (the faster search on this machine, see
                ``memvir.retrieval.knn.search_backend``), "faiss", or "torch" (a plain array searched by the torch
                search); the approximate kinds are faiss indexes and take "auto" or "faiss".
            kind: "exact", "ivf" or "hnsw" (see the module's notes).
            **options: for "ivf", nlist (cells; default 4 sqrt(N), at most N / 39) and nprobe (cells scanned per
                query; default nlist / 16). For "hnsw", m (links per vector, default 32), ef_construction (default
                80) and ef_search (default 64; a search for k neighbours walks a beam of at least k).

        Returns:
            The ``GalleryIndex``.

        Raises:
            ValueError: for an unknown kind, option or backend, or labels or items not one per row.
            ImportError: for an approximate kind without faiss installed.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
        unknown = sorted(set(options) - set(BUILD_OPTIONS[kind]))
        if unknown:
            raise ValueError(f"kind={kind!r} takes the options {BUILD_OPTIONS[kind]}; got {', '.join(unknown)}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        if kind != "exact":
            if backend == "torch":
                raise ValueError(f"kind={kind!r} is a faiss index; pass backend='auto' or 'faiss', or kind='exact'")
            _require_faiss(f"kind={kind!r}")
        vectors = l2_normalized(embeddings, "embeddings").cpu().numpy()
        size = vectors.shape[0]
        labels = None if labels is None else _as_label_list(labels, size)
        items = None if items is None else _as_item_list(items, size)
        if kind == "ivf":
            store = _ivf_index(vectors, **options)
        elif kind == "hnsw":
            store = _hnsw_index(vectors, **options)
        else:
            store = _vector_store(vectors, backend)
        return cls(store, labels, items)

    def __len__(self):
        return self._vectors.ntotal if self.uses_faiss else self._vectors.shape[0]

    def __repr__(self):
        kind = "" if self.kind == "exact" else f", kind={self.kind!r}"
        return (
            f"GalleryIndex(size={len(self)}, dim={self.dim}, labels={self.labels is not None}, "
            f"faiss={self.uses_faiss}{kind})"
        )

    @property
    def uses_faiss(self):
        """True when the vectors live in a faiss index, False when in an array searched by torch."""
        return not isinstance(self._vectors, np.ndarray)

    @property
    def kind(self):
        """How the index searches: "exact", "ivf" or "hnsw" (see ``build``)."""
        return _kind_of(self._vectors) if self.uses_faiss else "exact"

    @property
    def dim(self):
        return self._vectors.d if self.uses_faiss else self._vectors.shape[1]

    @property
    def options(self):
        """The options of an approximate index as it stands: {"nlist", "nprobe"} (ivf) or {"m", "ef_construction",
        "ef_search"} (hnsw); {} for an exact index."""
        if self.kind == "ivf":
            return {"nlist": int(self._vectors.nlist), "nprobe": int(self._vectors.nprobe)}
        if self.kind == "hnsw":
            graph = self._vectors.hnsw
            return {
                "m": int(graph.nb_neighbors(1)),
                "ef_construction": int(graph.efConstruction),
                "ef_search": int(graph.efSearch),
            }
        return {}

    def vectors(self) -> np.ndarray:
        """The gallery's L2-normalised vectors, [N, D] float32 in row order (read back from faiss where they live
        there): what an exact ranking of every item (memvir.retrieval.diagnosis.ranking) searches."""
        if not self.uses_faiss:
            return self._vectors
        if self.kind == "ivf":
            self._vectors.make_direct_map()  # an IVF index finds a row's vector only through this map
        return self._vectors.reconstruct_n(0, self._vectors.ntotal)

    def set_search_options(self, **options):
        """Change how an approximate index searches: nprobe (ivf) or ef_search (hnsw); more is slower and finds
        more of the exact neighbours. The options are saved with the index."""
        unknown = sorted(set(options) - set(SEARCH_OPTIONS[self.kind]))
        if unknown:
            raise ValueError(
                f"a {self.kind!r} index takes the search options {SEARCH_OPTIONS[self.kind]}; got {', '.join(unknown)}"
            )
        if "nprobe" in options:
            self._vectors.nprobe = _positive_int(options["nprobe"], "nprobe", largest=self._vectors.nlist)
        if "ef_search" in options:
            self._vectors.hnsw.efSearch = _positive_int(options["ef_search"], "ef_search")

    def search_arrays(self, queries, k):
        """(scores [Nq, k] float32, gallery indices [Nq, k] int64) of the k nearest items of each query.

        Rows are ordered by score, ties by lower index. An approximate index may find fewer than k items for a query
        (an IVF search whose scanned cells hold fewer): the missing places are last, with index -1 and the lowest
        float32 score.

        Args:
            queries: [Nq, D] or a single [D] vector (tensor on any device, any float dtype, or array).
            k: how many items to find for each query, in 1..len(self).

        Returns:
            (scores, indices): numpy arrays [Nq, k], float32 cosine similarities and int64 gallery rows.

        Raises:
            ValueError: when D differs from the index's or k is not in 1..len(self).
        """
        queries = queries.detach() if isinstance(queries, torch.Tensor) else np.asarray(queries)
        if queries.ndim == 1:
            queries = queries[None]
        if self.uses_faiss:
            return search_unit_gallery(queries, self._vectors, k, backend="faiss")
        return search_unit_gallery(queries, torch.from_numpy(self._vectors), k, backend="torch")

    def search(self, queries, k):
        """The k nearest items of each query as ``SearchHit`` lists, best first (one list per query row).

        Errors as ``search_arrays``. A list is shorter than k only where an approximate index found fewer items.

        Args:
            queries: [Nq, D] or a single [D] vector (tensor on any device, any float dtype, or array).
            k: how many items to find for each query, in 1..len(self).

        Returns:
            One list of ``SearchHit`` (index, score, label, item) per query row, best first.
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
                if index >= 0
            ]
            for row_scores, row_indices in zip(scores, indices, strict=True)
        ]

    def save(self, directory):
        """Write the index into ``directory`` (created if missing) and return its path.

        Args:
            directory: the folder to write ``gallery.json`` and the vectors (``index.faiss`` or ``vectors.npy``) into.

        Returns:
            ``directory`` as a Path.
        """
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
        """Read an index written by ``save``.

        Args:
            directory: a folder written by ``save``.
            backend: as in ``build``; an exact index is loaded into the backend chosen (a saved faiss index needs
                faiss to read), an approximate one stays a faiss index.

        Returns:
            The ``GalleryIndex``, with its labels and items.

        Raises:
            ValueError: naming the file expected when ``directory`` holds no index or a damaged one.
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
            kind = _kind_of(vectors)
            if kind != "exact" and backend == "torch":
                raise ValueError(f"{vectors_path} holds an approximate ({kind!r}) faiss index; load it with faiss")
            if kind == "exact" and search_backend(backend) == "torch":
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


def _require_faiss(what):
    try:
        import faiss  # noqa: F401
    except ImportError as error:
        raise ImportError(f"{what} needs the faiss-cpu package; install it or use kind='exact'") from error


def _vector_store(unit_vectors, backend):
    """Where an exact index keeps normalised float32 vectors [N, D]: a faiss flat index, or the array itself."""
    return flat_inner_product_index(unit_vectors) if search_backend(backend) == "faiss" else unit_vectors


def _positive_int(value, name, largest=None):
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if largest is not None and value > largest:
        raise ValueError(f"{name}={value} is out of range: the largest valid value is {largest}")
    return int(value)


def _ivf_index(unit_vectors, nlist=None, nprobe=None):
    """A trained faiss IndexIVFFlat holding ``unit_vectors``; for inner product faiss trains its cells by spherical
    k-means (unit centroids), the cells of cosine similarity."""
    import faiss

    size, dim = unit_vectors.shape
    most_cells = max(1, size // _IVF_MIN_POINTS_PER_CELL)
    if nlist is None:
        nlist = min(most_cells, max(1, round(_IVF_CELLS_PER_SQRT_SIZE * size**0.5)))
    nlist = _positive_int(nlist, "nlist", largest=size)
    nprobe = max(1, nlist // _IVF_PROBED_FRACTION) if nprobe is None else _positive_int(nprobe, "nprobe", nlist)
    index = faiss.index_factory(dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    index.cp.max_points_per_centroid = _IVF_TRAINING_POINTS_PER_CELL
    index.train(unit_vectors)
    index.add(unit_vectors)
    index.nprobe = nprobe
    return index


def _hnsw_index(unit_vectors, m=None, ef_construction=None, ef_search=None):
    """A faiss IndexHNSWFlat (inner product) holding ``unit_vectors``."""
    import faiss

    m = _HNSW_DEFAULTS["m"] if m is None else _positive_int(m, "m")
    ef_construction = _HNSW_DEFAULTS["ef_construction"] if ef_construction is None else ef_construction
    ef_search = _HNSW_DEFAULTS["ef_search"] if ef_search is None else ef_search
    index = faiss.IndexHNSWFlat(unit_vectors.shape[1], m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = _positive_int(ef_construction, "ef_construction")
    index.hnsw.efSearch = _positive_int(ef_search, "ef_search")
    index.add(unit_vectors)
    return index


def _kind_of(faiss_index):
    import faiss

    if isinstance(faiss_index, faiss.IndexIVF):
        return "ivf"
    if isinstance(faiss_index, faiss.IndexHNSW):
        return "hnsw"
    return "exact"


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
    if not isinstance(index, faiss.IndexFlat | faiss.IndexIVFFlat | faiss.IndexHNSWFlat):
        raise ValueError(
            f"{path} holds a faiss {type(index).__name__}; GalleryIndex.save writes only flat, IVF-Flat and "
            "HNSW-Flat indexes"
        )
    return index
