"""The paper's algorithm (docs/method.md, "Algorithm"): the memory of past steps that becomes virtual classes.

- `virtual_classes`: `MemVir`, the nn.Module a training step calls: a ring of N(M+1) steps, the step pacing of the
  curriculum (or all at once), live changes of N, M and U.
- `state`: its part of a state_dict (settings, call counter, stored steps), read back checked, so a resumed run
  continues its curriculum.
- `size`: how many bytes a memory takes, and the limit past which a setting is refused before any allocation.
- `checks`: what MemVir accepts besides memvir._validate's tensor contract: N, M, U, the label range, finite
  values; `NonFiniteError`.
"""
