"""Probe functions for the fault tests, run inside the probe worker processes (named by ``module:qualname``).

They are module-level so a worker process can import them. A test steers them through marker
files in the disk's root, which is the one channel that naturally reaches another process:

- ``HANG`` present: the probe blocks until the file is removed (a disk stuck in the kernel);
- ``FAIL_EIO`` present: the probe reports EIO on its write step (a disk returning errors);
- ``DIE`` present: the worker process exits in the middle of the probe (the machinery fails,
  not the disk).

Otherwise they run the real ``probe_disk``. ``announced_hang`` also creates ``HANGING`` when it
starts to hang, so that a test can wait until a worker is really stuck in its probe.
"""

from __future__ import annotations

import os
import time

from riffle_actors.io.probe import ProbeResult, probe_disk

HANG = "HANG"
HANGING = "HANGING"
FAIL_EIO = "FAIL_EIO"
DIE = "DIE"


def scripted_probe(root: str) -> ProbeResult:
    while os.path.exists(os.path.join(root, HANG)):
        time.sleep(0.02)
    if os.path.exists(os.path.join(root, DIE)):
        os._exit(3)
    if os.path.exists(os.path.join(root, FAIL_EIO)):
        real = probe_disk(root)
        return ProbeResult(False, real.capacity_bytes, real.used_bytes, "EIO", "write",
                           "OSError: [Errno 5] Input/output error (scripted)")
    return probe_disk(root)


def announced_hang(root: str) -> ProbeResult:
    """``scripted_probe``, creating ``HANGING`` first when it is about to hang."""
    if os.path.exists(os.path.join(root, HANG)):
        with open(os.path.join(root, HANGING), "w"):
            pass
    return scripted_probe(root)
