#!/usr/bin/env python3
"""Run ``riffle-server`` with a loop watchdog: what held the event loop each time it stalled.

    python scripts/loop_watchdog.py --config server.toml [--port-file ...]   (the server's arguments)

A diagnosis tool (``scripts/bench_loop_lag.py --watchdog`` uses it), not part of the daemon. A timer
on the loop notes the time every 5 ms; a watchdog thread samples the loop thread's Python stack
(``sys._current_frames``) every ms while that note is over 20 ms old; ``gc.callbacks`` time every
cyclic-GC collection. Each stall over ``RIFFLE_WATCHDOG_MS`` (50) is appended as one JSON line to
``RIFFLE_WATCHDOG_OUT``: its length, the collections that ran in it (generation, ms) and the
innermost frames sampled, with counts. A stall with no samples was one C call holding the GIL
(a sample is only taken when the loop thread lets the GIL go).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PERIOD_S = 0.005
LATE_S = 0.020


class Watchdog:
    def __init__(self, out: str, threshold_s: float):
        self.out = open(out, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self.threshold_s = threshold_s
        self.beat = time.monotonic()
        self.samples: Counter[str] = Counter()
        self.gcs: list[tuple[int, float, float]] = []  # (generation, start, ms)
        self._gc_start = 0.0
        self.lock = threading.Lock()
        self.loop_thread = threading.get_ident()

    def start(self, loop) -> None:
        self.loop_thread = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        loop.call_later(PERIOD_S, self._tick, loop)
        threading.Thread(target=self._watch, name="loop-watchdog", daemon=True).start()

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        else:
            self.gcs.append((info["generation"], self._gc_start, (time.monotonic() - self._gc_start) * 1000))
            del self.gcs[:-64]

    def _tick(self, loop) -> None:
        now = time.monotonic()
        stall = now - self.beat - PERIOD_S
        if stall > self.threshold_s:
            with self.lock:
                samples, self.samples = self.samples, Counter()
            since = self.beat
            gcs = [(g, round(ms, 1)) for g, t0, ms in self.gcs if t0 >= since]
            self.out.write(json.dumps({"at": round(now, 3), "stall_ms": round(stall * 1000, 1), "gc": gcs,
                                       "samples": samples.most_common(8)}) + "\n")
        else:
            with self.lock:
                self.samples.clear()
        self.beat = time.monotonic()
        loop.call_later(PERIOD_S, self._tick, loop)

    def _watch(self) -> None:
        while True:
            time.sleep(0.001)
            if time.monotonic() - self.beat < LATE_S:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            names = []
            while frame is not None and len(names) < 6:
                code = frame.f_code
                names.append(f"{Path(code.co_filename).name}:{code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            with self.lock:
                self.samples[" < ".join(names)] += 1


def main() -> int:
    from riffle_actors import metrics, server

    dog = Watchdog(os.environ.get("RIFFLE_WATCHDOG_OUT", "watchdog.jsonl"),
                   float(os.environ.get("RIFFLE_WATCHDOG_MS", "50")) / 1000)
    original = metrics.LoopLagMonitor.start

    def start(self, loop=None):
        import asyncio

        original(self, loop)
        dog.start(loop or asyncio.get_running_loop())

    metrics.LoopLagMonitor.start = start
    return server.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
