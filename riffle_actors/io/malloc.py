"""glibc malloc settings of the ``riffle-server`` process, applied once at start.

This module owns ``tune_malloc()``. The server's large allocations are block payloads and reply
buffers of up to 14 MiB, allocated and freed many times a second. With glibc's defaults a buffer
above the mmap threshold is mapped and unmapped each time (page faults on every touch), and the
heap's top is trimmed back to the kernel after each burst, only to be grown again. Measured with
``python3 scripts/bench_ingest.py --transport grpc --clients 2 --total-mib 1024 --no-baseline``,
four runs interleaved on the 2-core box: glibc defaults (forced with ``--server-env
MALLOC_TOP_PAD_=131072``, which turns this tuning off) against these settings (applied by mallopt):

| gRPC server | write MB/s | write CPU s/GB | read MB/s | read CPU s/GB |
|---|---|---|---|---|
| glibc defaults | 200, 205 | 5.24, 4.78 | 175, 208 | 6.32, 5.10 |
| tuned | 214, 262 | 4.27, 3.47 | 336, 367 | 3.03, 2.58 |

The price is resident memory: freed buffers stay in the heap, up to ``TRIM_THRESHOLD`` (256 MiB)
above what is in use (issue 10 measured about +100 MB RSS with these settings; not re-measured here).

The settings are those of the environment variables glibc reads at start-up
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``); an operator who sets any of
them keeps full control and nothing is changed here. On a libc without ``mallopt`` (musl) this
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from loguru import logger

# mallopt parameter numbers from <malloc.h>
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, 32 << 20),  # glibc's maximum: 14 MiB buffers stay in the heap
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, 256 << 20),  # keep up to 256 MiB of freed heap top
    ("MALLOC_TOP_PAD_", M_TOP_PAD, 64 << 20),  # grow the heap 64 MiB at a time
)


def tune_malloc(environ: dict[str, str] | None = None) -> dict[str, int]:
    """Apply ``SETTINGS`` with ``mallopt`` unless the environment sets any of them; returns what was set."""
    env = os.environ if environ is None else environ
    overridden = [name for name, _, _ in SETTINGS if name in env]
    if overridden:
        logger.info("malloc settings left to the environment ({})", ", ".join(overridden))
        return {}
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        logger.info("no mallopt in this libc ({}): malloc settings unchanged", path)
        return {}
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = {}
    for name, param, value in SETTINGS:
        if mallopt(param, value) == 1:
            applied[name] = value
        else:
            logger.warning("mallopt refused {}={}", name, value)
    logger.debug("malloc settings: {}", applied)
    return applied
