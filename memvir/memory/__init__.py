"""The paper's algorithm (docs/method.md, "Algorithm"): the memory of past steps that becomes virtual classes.

- `virtual_classes`: `MemVir`, the nn.Module a training step calls: a ring of N(M+1) steps, the step pacing of the
  curriculum (or all at once), live changes of N, M and U; `AugmentedBatch`, what a call returns, with its `LiveBlock`
  and `StoredSets` (which stored steps its virtual sets are); `virtual_sets_at`, the virtual sets in use at a step, and
  `SCHEDULES`.
- `state`: its part of a state_dict (settings, call counter, stored steps), read back checked, so a resumed run
  continues its curriculum.
- `size`: how many bytes a memory takes (`ring_bytes`, `format_bytes`), and the limit past which a setting is refused
  before any allocation (`memory_limit`, `check_ring`, `MemoryLimitError`); `STORE_DTYPES`, the dtypes it may store.
- `checks`: what MemVir accepts besides memvir._validate's tensor contract: N, M, U, the label range, finite
  values; `NonFiniteError`.

`from memvir.memory import MemVir`, and so for each name given with its part above: resolved on first use, so
`import memvir.memory` imports none of the parts.
"""

from memvir._lazy import lazy_exports

_EXPORTS = {
    "MemVir": "memvir.memory.virtual_classes",
    "AugmentedBatch": "memvir.memory.virtual_classes",
    "LiveBlock": "memvir.memory.virtual_classes",
    "StoredSets": "memvir.memory.virtual_classes",
    "SCHEDULES": "memvir.memory.virtual_classes",
    "virtual_sets_at": "memvir.memory.virtual_classes",
    "STORE_DTYPES": "memvir.memory.size",
    "MemoryLimitError": "memvir.memory.size",
    "check_ring": "memvir.memory.size",
    "format_bytes": "memvir.memory.size",
    "memory_limit": "memvir.memory.size",
    "ring_bytes": "memvir.memory.size",
    "NonFiniteError": "memvir.memory.checks",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
