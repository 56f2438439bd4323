"""Probe functions for the fault tests, run inside the thespian probe workers (pickled by reference).

They are module-level so a spawned worker can import them. A test steers them through marker
files in the disk's root, which is the one channel that naturally reaches another process:

- ``HANG`` present: the probe blocks until the file is removed (a disk stuck in the kernel);
- ``FAIL_EIO`` present: the probe reports EIO on its write step (a disk returning errors).

Otherwise they run the real ``probe_disk``.
"""

from __future__ import annotations

import os
import time

from riffle_actors.io.probe import ProbeResult, probe_disk

HANG = "HANG"
FAIL_EIO = "FAIL_EIO"


def scripted_probe(root: str) -> ProbeResult:
    while os.path.exists(os.path.join(root, HANG)):
        time.sleep(0.02)
    if os.path.exists(os.path.join(root, FAIL_EIO)):
        real = probe_disk(root)
        return ProbeResult(False, real.capacity_bytes, real.used_bytes, "EIO", "write",
                           "OSError: [Errno 5] Input/output error (scripted)")
    return probe_disk(root)
