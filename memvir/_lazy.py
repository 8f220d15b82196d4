"""Lazy package faces: a package's public names, each imported from its defining module on first use.

Importing any module of a package runs its `__init__.py` first, so a face that imported its parts eagerly would
charge every caller for all of them (and for faiss, umap or huggingface_hub wherever a part needs one at import).
"""

import sys
from importlib import import_module


def lazy_exports(package: str, exports: dict[str, str]):
    """The module-level `__getattr__` and `__dir__` of `package`, which resolve each name of `exports` (name ->
    defining module) on first use."""

    def __getattr__(name):
        if name in exports:
            return getattr(import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
