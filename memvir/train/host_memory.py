"""Keep the memory a training step frees for the next step, instead of handing it back to the kernel (glibc's malloc).

A training step on the CPU allocates and frees the same tens of megabytes of activations and gradients at every
step. glibc's malloc serves a block above its mmap threshold with a fresh mapping and returns it to the kernel when
freed, and trims the top of its heap once more than its trim threshold lies free there. Both thresholds start low
(128 KiB) and glibc raises them as it sees large blocks freed, but how far depends on the order in which blocks
happened to be freed: a glyphs run's steps took page faults by the thousand for memory they had just returned, the
kernel zeroing every page again, and the count, so the speed, changed from run to run and within a run
(docs/benchmarks.md, "The trainer in its own process", has the counts).

Fixed thresholds stop that: blocks of up to MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of free heap is
kept, so a step's memory is mapped once and reused. The process's resident memory then stays near the largest step's
working set, which it needs at every step anyway. Only glibc has these settings (Linux, not musl, not macOS);
elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import platform

# mallopt's parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit machines (4 MiB * sizeof(long))
# the smallest of the thresholds tried that left a run only its start's page faults (docs/benchmarks.md)
TRIM_THRESHOLD = 1 << 30

_kept = False


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed blocks for reuse, for the whole process (once). True when the settings hold,
    False where the C library is not glibc or refused them."""
    global _kept
    if _kept:
        return True
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    # the mmap threshold first: setting either one turns off glibc's own adjusting of both
    _kept = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(_M_TRIM_THRESHOLD,
                                                                                             TRIM_THRESHOLD))
    return _kept
