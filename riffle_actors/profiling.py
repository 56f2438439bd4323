"""Profiler: where a running riffle-server spends CPU and holds memory, asked over HTTP.

The service behind Riffle's profiling URLs (``/debug/pprof/profile``, ``/debug/heap/profile``,
``/await-tree``; the HTTP adapter is ``riffle_actors.transport.profiling_http``). It owns:

- **CPU profiles**: ``cpu_profile(seconds, frequency)`` samples the stack of every thread of the
  process (the event loop, the disk and HDFS pools, the gRPC threads) ``frequency`` times a
  second for ``seconds`` from a sampler thread of its own, and returns the samples as folded
  stacks (``thread;outer;...;inner`` -> count). The loop is never blocked: the sampler only holds
  the GIL while it walks the frames of one sample.
- **Heap profiles**: ``heap_profile(seconds)`` traces Python allocations with ``tracemalloc`` for
  ``seconds`` and returns what of them is still held at the end, as folded stacks weighted by
  bytes (with ``PYTHONTRACEMALLOC`` set at start, what is held since start, without waiting).
  Buffers allocated outside Python's allocators (CRoaring, grpc core) are not traced.
- **The await tree**: ``await_tree()`` says what every actor and every asyncio task is doing now
  (mailbox depth and state; the coroutine stack each task is suspended in).
- **Bounds**: ``seconds`` in ``[1, MAX_SECONDS]`` and ``frequency`` in ``[1, MAX_FREQUENCY]``, as
  Riffle's; one CPU and one heap profile at a time (``ProfilerBusy`` otherwise); stacks deeper than
  ``MAX_DEPTH`` frames are cut at the root side.
- **Rendering**: ``render_flamegraph(folded, ...)`` draws folded stacks as a self-contained SVG
  flame graph (no script, so a browser shows it as an image), widest frames first.

It holds no server state: it reads the interpreter (frames, tasks, tracemalloc) and the actor
statistics it is handed.
"""

from __future__ import annotations

import asyncio
import html
import re
import sys
import threading
import time
import tracemalloc
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from riffle_actors.runtime import MailboxStatistics

__all__ = [
    "MAX_DEPTH",
    "MAX_FREQUENCY",
    "MAX_SECONDS",
    "Profile",
    "Profiler",
    "ProfilerBusy",
    "render_flamegraph",
]

MAX_SECONDS = 60  # Riffle refuses seconds > 60
MAX_FREQUENCY = 1000  # and frequency > 1000
MAX_DEPTH = 128
_HEAP_FRAMES = 32  # tracemalloc frames kept per allocation


class ProfilerBusy(Exception):
    """A profile of the same kind is already running (one at a time, as Riffle)."""


@dataclass(slots=True)
class Profile:
    """Folded stacks with their weight (samples for CPU, bytes for heap) and what was measured."""

    kind: str  # "cpu" | "heap"
    unit: str  # "samples" | "bytes"
    seconds: float
    folded: Counter[str] = field(default_factory=Counter)
    samples: int = 0  # CPU: sampling rounds taken; heap: allocations still held

    @property
    def total(self) -> int:
        return sum(self.folded.values())

    def to_folded_text(self) -> str:
        """Brendan Gregg's collapsed format: one ``stack weight`` line per stack, heaviest first."""
        return "".join(f"{stack} {weight}\n" for stack, weight in self.folded.most_common())


def _check_bounds(seconds: float, frequency: int | None = None) -> None:
    if not 1 <= seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be between 1 and {MAX_SECONDS}, got {seconds:g}")
    if frequency is not None and not 1 <= frequency <= MAX_FREQUENCY:
        raise ValueError(f"frequency must be between 1 and {MAX_FREQUENCY}, got {frequency}")


_PYTHON_LIB = re.compile(r".*/lib/python3\.\d+/(site-packages/)?")


def _where(filename: str, lineno: int) -> str:
    short = _PYTHON_LIB.sub("", filename).rsplit("/riffle_actors/", 1)[-1]
    return f"{short}:{lineno}".replace(";", ":")


def _frame_label(code_name: str, filename: str, lineno: int) -> str:
    return f"{code_name} ({_where(filename, lineno)})".replace(";", ":")


def _fold_frame(frame: FrameType | None) -> list[str]:
    """Labels of ``frame`` and its callers, innermost last, at most ``MAX_DEPTH`` of them."""
    labels: list[str] = []
    while frame is not None and len(labels) < MAX_DEPTH:
        code = frame.f_code
        labels.append(_frame_label(code.co_name, code.co_filename, frame.f_lineno))
        frame = frame.f_back
    labels.reverse()
    return labels


class Profiler:
    """See the module docstring. ``actor_statistics`` lists the actors for ``await_tree``."""

    def __init__(self, actor_statistics: Callable[[], Sequence[MailboxStatistics]] | None = None) -> None:
        self._actor_statistics = actor_statistics
        self._cpu_lock = asyncio.Lock()
        self._heap_lock = asyncio.Lock()

    # ------------------------------------------------------------------ CPU
    async def cpu_profile(self, seconds: float, frequency: int = 100) -> Profile:
        _check_bounds(seconds, frequency)
        if self._cpu_lock.locked():
            raise ProfilerBusy("a CPU profile is already running; try again when it ends")
        async with self._cpu_lock:
            profile = Profile("cpu", "samples", seconds)
            done = threading.Event()
            sampler = threading.Thread(target=self._sample, args=(profile, seconds, 1.0 / frequency, done),
                                       name="riffle-cpu-profiler", daemon=True)
            sampler.start()
            try:
                await asyncio.get_running_loop().run_in_executor(None, sampler.join)
            finally:
                done.set()  # a cancelled request ends the sampling too
            return profile

    @staticmethod
    def _sample(profile: Profile, seconds: float, interval: float, done: threading.Event) -> None:
        """On-CPU sampling: a thread is sampled only if it used CPU since the last round (its
        ``pthread`` CPU clock moved), so idle pool threads and a loop waiting in ``epoll`` do not
        drown what works."""
        me = threading.get_ident()
        names = {t.ident: t.name for t in threading.enumerate()}
        cpu_seen: dict[int, float] = {}
        deadline = time.monotonic() + seconds
        while not done.is_set():
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                try:
                    used = time.clock_gettime(time.pthread_getcpuclockid(ident))
                except (OSError, OverflowError):  # the thread ended meanwhile
                    continue
                last = cpu_seen.get(ident)
                cpu_seen[ident] = used
                if last is None or used <= last:
                    continue
                name = names.get(ident)
                if name is None:
                    names = {t.ident: t.name for t in threading.enumerate()}
                    name = names.get(ident, f"thread-{ident}")
                profile.folded[";".join([name.replace(";", ":"), *_fold_frame(frame)])] += 1
            profile.samples += 1
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(min(interval, left))

    # ----------------------------------------------------------------- heap
    async def heap_profile(self, seconds: float) -> Profile:
        """What Python allocations made while profiling (or since start) are still held."""
        _check_bounds(seconds)
        if self._heap_lock.locked():
            raise ProfilerBusy("a heap profile is already running; try again when it ends")
        async with self._heap_lock:
            loop = asyncio.get_running_loop()
            already = tracemalloc.is_tracing()  # PYTHONTRACEMALLOC: everything since start
            if not already:
                tracemalloc.start(_HEAP_FRAMES)
                try:
                    await asyncio.sleep(seconds)
                    snapshot = tracemalloc.take_snapshot()
                finally:
                    tracemalloc.stop()
            else:
                snapshot = tracemalloc.take_snapshot()
            return await loop.run_in_executor(None, self._fold_snapshot, snapshot,
                                              0.0 if already else seconds)

    @staticmethod
    def _fold_snapshot(snapshot: tracemalloc.Snapshot, seconds: float) -> Profile:
        profile = Profile("heap", "bytes", seconds)
        for stat in snapshot.statistics("traceback"):
            frames = [_where(f.filename, f.lineno) for f in reversed(stat.traceback)]
            profile.folded[";".join(["heap", *frames[-MAX_DEPTH:]])] += stat.size
            profile.samples += stat.count
        return profile

    # ----------------------------------------------------------- await tree
    def await_tree(self) -> str:
        """One block per actor and per asyncio task, Riffle's ``/await-tree`` in text."""
        lines: list[str] = []
        for st in self._actor_statistics() if self._actor_statistics is not None else ():
            lines.append(f"actor={st.name} state={st.state} mailbox={st.depth}/{st.capacity} "
                         f"processed={st.processed} restarts={st.restarts}")
        tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
        for task in tasks:
            lines.append(f"task={task.get_name()}")
            stack = task.get_stack(limit=MAX_DEPTH)
            if not stack:
                lines.append("  (running now)" if task is asyncio.current_task() else "  (not started)")
            for frame in stack:
                code = frame.f_code
                lines.append(f"  {_frame_label(code.co_name, code.co_filename, frame.f_lineno)}")
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- rendering
_WIDTH = 1200
_ROW = 16
_FONT_PX = 12
_CHAR_PX = 7.0  # average width of a 12 px monospace glyph
_MIN_PX = 0.3  # narrower frames are not drawn


class _Node:
    __slots__ = ("children", "weight")

    def __init__(self) -> None:
        self.weight = 0
        self.children: dict[str, _Node] = {}


def _tree(folded: Mapping[str, int]) -> tuple[_Node, int]:
    root = _Node()
    depth = 0
    for stack, weight in folded.items():
        if weight <= 0:
            continue
        node = root
        node.weight += weight
        parts = stack.split(";")
        depth = max(depth, len(parts))
        for part in parts:
            node = node.children.setdefault(part, _Node())
            node.weight += weight
    return root, depth


def _colour(name: str) -> str:
    h = zlib.crc32(name.encode())
    return f"rgb({205 + h % 50},{(h >> 8) % 180 + 40},{(h >> 16) % 55})"


def render_flamegraph(folded: Mapping[str, int], *, title: str, unit: str) -> str:
    """A self-contained SVG flame graph of ``folded`` (root at the bottom, as ``flamegraph.pl``)."""
    root, depth = _tree(folded)
    total = root.weight
    height = (depth + 1) * _ROW + 40
    out = [
        (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
         f'viewBox="0 0 {_WIDTH} {height}" font-family="monospace" font-size="{_FONT_PX}">'),
        '<rect width="100%" height="100%" fill="#f8f8f0"/>',
        f'<text x="{_WIDTH / 2}" y="20" text-anchor="middle" font-size="16">{html.escape(title)}</text>',
    ]
    if total == 0:
        out.append(f'<text x="10" y="40">no {html.escape(unit)} recorded</text></svg>')
        return "\n".join(out)
    scale = (_WIDTH - 20) / total
    # (name, node, x, level); level 0 is the "all" bar at the bottom
    todo: list[tuple[str, _Node, float, int]] = [("all", root, 10.0, 0)]
    while todo:
        name, node, x, level = todo.pop()
        w = node.weight * scale
        if w < _MIN_PX:
            continue
        y = height - (level + 1) * _ROW - 4
        label = html.escape(name)
        share = 100.0 * node.weight / total
        out.append(f'<g><title>{label} ({node.weight:,} {html.escape(unit)}, {share:.2f}%)</title>'
                   f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_ROW - 1}" fill="{_colour(name)}" rx="2"/>')
        fits = int((w - 6) / _CHAR_PX)
        if fits >= 3:
            text = name if len(name) <= fits else name[: fits - 2] + ".."
            out.append(f'<text x="{x + 3:.1f}" y="{y + _ROW - 4}">{html.escape(text)}</text>')
        out.append("</g>")
        cx = x
        for child_name, child in sorted(node.children.items(), key=lambda kv: -kv[1].weight):
            todo.append((child_name, child, cx, level + 1))
            cx += child.weight * scale
    out.append("</svg>")
    return "\n".join(out)
