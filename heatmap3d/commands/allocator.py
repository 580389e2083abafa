"""How the ``heatmap3d`` command's processes keep memory they free for their next step.

torch's CPU tensors come from the C library's ``malloc``. glibc gives back to the system
the free memory at the top of its heap beyond a small threshold (128 KB at first) and
maps blocks above another threshold (128 KB at first, raised as blocks are freed, to at
most 32 MB) straight from the kernel. A training step frees its activations and asks for
them again a few milliseconds later: each time the kernel maps fresh pages and zeroes
them. A CPU training step of the plan's model (8 channels, 2 or 4 crops of 32^3) faulted
12-16 thousand pages in (50-65 MB) every step; keeping freed memory took that to none,
the step 1.06-1.10x faster, and a float32 prediction with the packaged AFIDs model 1.14x
faster with the same landmarks (``benchmarks/allocator.py``, 2 cores).

The command sets two of glibc's ``mallopt`` parameters at its start, for its own
processes only (what a library imported into someone else's program does to their
allocator is theirs to decide): blocks up to 32 MB come from the heap, and up to
:data:`KEEP_BYTES` of free memory stay with the process. Larger blocks (a whole CT scan,
the heatmaps of a large volume) are still mapped and returned at once. Processes forked
from it (the data loader's workers) inherit the setting. Elsewhere than glibc (macOS,
musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import platform

# glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MAP_BYTES = 32 << 20  # glibc's own ceiling for the mapping threshold
# Free memory a process keeps: a CPU training step of the plan's models turns over about
# 60 MB; a quarter of a GiB leaves room for larger patches and batches.
KEEP_BYTES = 256 << 20


def keep_freed_memory() -> bool:
    """Make this process's ``malloc`` keep freed memory for reuse (module docstring);
    whether it could (False where the C library is not glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; the order matters: each call turns glibc's own
    # adjustment of both thresholds off, so both are set.
    return bool(mallopt(M_MMAP_THRESHOLD, MAP_BYTES) and mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
