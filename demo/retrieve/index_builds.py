"""Gallery index builds in flight: one per (checkpoint, gallery) at a time, with their progress for the page.

A gallery takes seconds to minutes to embed. Visitors who ask for an index already being built (a run's gallery
indexed in the background when the run finished, or another visitor's first search) wait for that build rather
than start a second one on the same two cores, and a page can ask how far it has got. A finished build leaves only
its outcome (done, or the error that stopped it) behind, not the index: the service's cache keeps indexes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")
_OUTCOMES_KEPT = 32  # finished builds remembered for progress queries; older ones read as never built


class _Build:
    def __init__(self):
        self.finished = threading.Event()
        self.fraction = 0.0
        self.result = None
        self.error: BaseException | None = None


class _Outcome:
    def __init__(self, error: BaseException | None):
        self.fraction = 1.0 if error is None else 0.0
        self.error = error


class IndexBuilds:
    """Runs builds so that each key builds once at a time; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Build | _Outcome] = OrderedDict()

    def run(self, key: Hashable, build: Callable[[Callable[[float], None]], T]) -> T:
        """`build(report)` for `key`, or, when it is being built already, that build's result (or its error).

        `report(fraction)` is how the build tells its progress (0 to 1).
        """
        with self._lock:
            entry = self._entries.get(key)
            joining = isinstance(entry, _Build)
            if not joining:
                entry = self._entries[key] = _Build()
        if joining:
            entry.finished.wait()
            if entry.error is not None:
                raise entry.error
            return entry.result

        def report(fraction: float) -> None:
            entry.fraction = min(max(float(fraction), 0.0), 1.0)

        try:
            entry.result = build(report)
        except BaseException as error:
            entry.error = error
            raise
        finally:
            with self._lock:
                self._entries[key] = _Outcome(entry.error)
                self._entries.move_to_end(key)
                outcomes = [known for known, kept in self._entries.items() if isinstance(kept, _Outcome)]
                for forgotten in outcomes[:-_OUTCOMES_KEPT]:
                    del self._entries[forgotten]
            entry.finished.set()
        return entry.result

    def progress(self, key: Hashable) -> tuple[float, BaseException | None] | None:
        """(fraction built, the error that stopped it or None) of the latest build of `key`; None when none is
        known."""
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else (entry.fraction, entry.error)
