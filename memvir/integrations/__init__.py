"""Adapters that bring MemVir to other libraries' losses; each needs its library only when imported.

- `pml`: `MemVirLoss`, a pytorch-metric-learning proxy or classifier loss with memory-based virtual classes
  (docs/method.md, "Losses from pytorch-metric-learning"); `SUPPORTED_LOSSES`, and `UnsupportedLossError` for the
  others.

`from memvir.integrations import MemVirLoss`, and so for each name given with its part above: resolved on first use,
so `import memvir.integrations` imports none of the adapters.
"""

from memvir._lazy import lazy_exports

_EXPORTS = {
    "SUPPORTED_LOSSES": "memvir.integrations.pml",
    "MemVirLoss": "memvir.integrations.pml",
    "UnsupportedLossError": "memvir.integrations.pml",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
