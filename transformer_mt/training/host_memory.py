"""Keep freed memory inside the process on Linux (glibc), for training on a CPU.

glibc's malloc serves a request over its mmap threshold (at most 32 MiB) with fresh pages from the
kernel and hands them back on ``free``. A CPU training step allocates several tensors of 100 MiB
and more (the (tokens, vocabulary) logits, their gradient), so every step pays for hundreds of
thousands of page faults: on the 2-core benchmark machine, copying 128 MiB into a fresh tensor took
37 ms and into a reused one 8 ms. Turning the mmap path off and the heap trimming down makes freed
blocks serve the next step instead; it raised the training rate by about 30 % there (see
docs/BENCHMARKS.md) at the price of a higher resident size (the heap keeps its peak).

It is the in-process form of ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...``; jemalloc or
tcmalloc through ``LD_PRELOAD`` are the usual alternatives.
"""

import ctypes
import ctypes.util
import platform

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4


def keep_freed_memory(top_pad_bytes: int = 1 << 30, trim_threshold_bytes: int = 4 << 30) -> bool:
    """Tell glibc's malloc to keep freed memory for reuse. Returns True when it was applied, False
    where it does not apply (not Linux, not glibc); it is process-wide and cannot be undone."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = libc.mallopt(_M_MMAP_MAX, 0)  # mallopt returns 1 on success
    ok &= libc.mallopt(_M_TRIM_THRESHOLD, min(trim_threshold_bytes, 2**31 - 1))
    ok &= libc.mallopt(_M_TOP_PAD, min(top_pad_bytes, 2**31 - 1))
    return bool(ok)
