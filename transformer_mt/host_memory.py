"""Keep freed memory inside the process on Linux (glibc), for training and decoding on a CPU.

glibc's malloc serves a request over its mmap threshold (128 KiB at start, raised as blocks are
freed, up to 32 MiB) with fresh pages from the kernel and gives them back on ``free``, and it
returns free memory at the top of its heap to the kernel as soon as 128 KiB gather there. A CPU
training step frees and allocates the same few hundred activation tensors of up to tens of MiB
every step, so it pays for page faults over and over: on the 2-core benchmark machine, copying
128 MiB into a fresh tensor took 37 ms and into a reused one 8 ms.

``keep_freed_memory`` fixes the threshold at its maximum (32 MiB) and lets the heap keep up to
``trim_threshold_bytes`` of free memory: every activation of a step comes from memory the
previous step freed. Decoding is alike: each search step allocates the same logits, caches and
activations again (the Multi30k test set with beam 4, 2 threads: fp32 3.09 -> 2.90 s, bf16 2.54
-> 2.28 s, resident size unchanged). Larger blocks still come from (and go back to) the kernel,
so the resident size stays bounded by the largest step. It is the in-process form of
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``; jemalloc or tcmalloc through
``LD_PRELOAD`` are the usual alternatives.

The price is fragmentation: validation decodes batches of ever-changing shapes, and the free
pages they leave between live blocks stay resident. ``release_freed_memory`` (glibc's
``malloc_trim``) hands those pages back; the trainer calls it after each validation, so the next
training step pays its page faults once per validation instead of once per step, and the
server's decode worker after a second without work.

The other grower is oneDNN, which runs bf16 matrix products on a CPU. It caches a compiled
kernel for every new shape, twice: in its primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
1,024 entries) and in the ideep layer PyTorch puts over it (``LRU_CACHE_CAPACITY``, 1,024).
Length-bucketed batches bring a new token count nearly every step, so both caches fill up over
an hour (about 2 MiB per new token count for one 256 x 1,024 layer, forward and backward).
``bound_kernel_caches`` lowers both limits to a size that still holds the ~40 products of one
step, which its layers repeat.
"""

import ctypes
import ctypes.util
import functools
import os
import platform

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit systems


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, where it is glibc on Linux; None elsewhere. Looked up once per process."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name)


def keep_freed_memory(trim_threshold_bytes: int = 1 << 30, top_pad_bytes: int = 64 << 20) -> bool:
    """Tell glibc's malloc to keep freed memory for reuse.

    Returns True when it was applied, False where it does not apply (not Linux, not glibc); it is
    process-wide and cannot be undone."""
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)  # mallopt returns 1 on success
    ok &= libc.mallopt(_M_TRIM_THRESHOLD, min(trim_threshold_bytes, 2**31 - 1))
    ok &= libc.mallopt(_M_TOP_PAD, min(top_pad_bytes, 2**31 - 1))
    return bool(ok)


def release_freed_memory() -> bool:
    """Return the free pages of every malloc heap to the kernel (``malloc_trim(0)``).

    Live blocks are untouched. Returns True when glibc released something, False otherwise or
    where it does not apply."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return bool(libc.malloc_trim(0))  # 1 when memory was released


def resident_mib() -> float | None:
    """This process's resident set size now, in MiB (Linux); None where /proc is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
    except OSError:
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def bound_kernel_caches(capacity: int = 64) -> None:
    """Cap oneDNN's two per-shape kernel caches at ``capacity`` entries each.

    Unless the user set
    the variables. They are read when the first oneDNN kernel is built, so call this first."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))
