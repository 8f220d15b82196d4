"""Who is watching each run, and how often each page should ask: a crowd's polls are spread out so that what they
cost the server stays bounded however many pages are open (docs/benchmarks.md, "Many watchers").

On a small machine the server runs below its runs' processes (demo.common.cores) and every poll is taken from a
training thread; a poll a second from every page would let the crowd, not the run, set how busy the cores are. The
run's owner's page, and every page of a run few watch, still polls every second.
"""

from __future__ import annotations

import math
import threading
import time

POLL_SECONDS = 1.0  # how often a page polls the run it shows, unless a crowd watches it
FULL_RATE_PAGES = 4  # up to this many pages of a run each poll every second
# Beyond, the other visitors' pages share about this many polls a second: with the server only a little below its
# runs (demo.common.cores), a crowd's polls are most of what it costs a run (docs/benchmarks.md, "Many watchers").
CROWD_POLLS_PER_S = 4.0
SLOWEST_S = 10.0  # no page waits longer than this between its polls
WATCHING_S = SLOWEST_S + 2.0  # a page counts as watching while it polled within this long (a slowed page too)


class Audience:
    """The pages that polled each run lately (by visitor key), and each page's poll interval."""

    def __init__(self, every_s: float = POLL_SECONDS, clock=time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, dict[str, float]] = {}  # run id -> visitor -> when it last polled

    def watching(self, run_id: str, visitor: str) -> int:
        """Record that `visitor`'s page polled `run_id` now; how many pages watch it."""
        now = self._clock()
        with self._lock:
            pages = self._seen.setdefault(run_id, {})
            pages[visitor] = now
            for key in [key for key, when in pages.items() if now - when > WATCHING_S]:
                del pages[key]  # closed, or moved to another run
            return len(pages)

    def interval(self, run, visitor: str) -> tuple[float, int]:
        """(seconds until this page's next poll, pages watching the run): every second for the run's owner and for
        a run few watch, else the crowd's share of CROWD_POLLS_PER_S, in whole seconds."""
        if run is None:
            return self.every_s, 0
        pages = self.watching(run.id, visitor)
        if visitor == run.owner or pages <= FULL_RATE_PAGES:
            return self.every_s, pages
        return float(min(SLOWEST_S, max(self.every_s, math.ceil(pages / CROWD_POLLS_PER_S)))), pages
