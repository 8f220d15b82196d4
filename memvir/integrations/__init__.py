"""Adapters that bring MemVir to other libraries' losses; each needs its library only when imported.

- `pml`: `MemVirLoss`, a pytorch-metric-learning proxy or classifier loss with memory-based virtual classes
  (docs/method.md, "Losses from pytorch-metric-learning").
"""
