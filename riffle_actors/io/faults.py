"""``FaultyLocalIO``: a ``LocalIO`` wrapper that fails or hangs chosen operations (fault tests).

This is the seam fault tests use instead of monkeypatching: a test builds a server with
``ShuffleServer(cfg, local_io_factory=...)`` returning one ``FaultyLocalIO`` per data path, then
arms rules on it while the server runs::

    io = FaultyLocalIO()                                  # wraps the real LOCAL_IO
    io.fail("append_batch", errno.EIO, times=2)           # the next two appends raise EIO
    io.fail("append_batch", errno.ENOSPC, after=True)     # bytes reach the disk, then ENOSPC
    io.fail("append_batch", RuntimeError("boom"))         # not an OSError: the Disk actor crashes
    blocked = io.hang("append_batch")                     # the next append pauses in its thread
    await poll_until(blocked.entered.is_set)              # ... the Disk actor is now mid-spill
    blocked.release.set()                                 # let it go on (or raise ``then``)
    io.heal()                                             # remove every rule, release every hang

Operations are the ``LocalIO`` method names: ``ensure_root``, ``append_batch``, ``read_index``,
``read_data`` (data reads, ``sendfile``'s ``open_data`` included), ``index_entries_in`` (the read CRC
check's index lookup), ``remove_app``, ``usage``. Rules are checked in the order they were armed; the
first one whose op (and optional ``match(*args)`` predicate) fits and that has uses left
applies. ``after=True`` runs the real operation first and fails afterwards (the bytes are on
disk but the caller never hears so). ``Blocked`` uses ``threading.Event`` s because the
operations run on the Disk actor's threads, not on the event loop; a test waits for
``entered`` with ``poll_until(blocked.entered.is_set)``.

Not for production: nothing in the config selects it. A released ``hang`` whose test already
ended would keep a Disk thread blocked, so fault fixtures call ``heal()`` in their finalizers.

See also: ``riffle_actors.io.local`` (the protocol), ``tests/fault/``.
"""

from __future__ import annotations

import errno as errno_mod
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from riffle_actors.io.local import LOCAL_IO, LocalIO
from riffle_actors.records import Block

OPS = ("ensure_root", "append_batch", "read_index", "read_data", "remove_app", "usage", "append_meta",
       "list_partitions", "index_entries_in")


def _exception(err: int | BaseException, op: str) -> BaseException:
    if isinstance(err, BaseException):
        return err
    return OSError(err, f"{os.strerror(err)} (injected on {op})")


@dataclass(eq=False)
class FaultRule:
    """One armed fault; ``times`` uses left (None = forever), ``hits`` how often it fired."""

    op: str
    error: int | BaseException | None
    times: int | None = None
    after: bool = False
    match: Callable[..., bool] | None = None
    hits: int = 0

    def wants(self, op: str, args: tuple[Any, ...]) -> bool:
        if op != self.op or (self.times is not None and self.times <= 0):
            return False
        return self.match is None or bool(self.match(*args))

    def fire(self, op: str) -> None:
        """Called in the IO thread when the rule applies; raises the injected error, if any."""
        if self.error is not None:
            raise _exception(self.error, op)


@dataclass(eq=False)
class Blocked(FaultRule):
    """A rule that pauses the operation: sets ``entered``, waits for ``release``, then raises ``error``
    (or lets the operation go on when ``error`` is None)."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def fire(self, op: str) -> None:
        self.entered.set()
        self.release.wait()
        super().fire(op)


class FaultyLocalIO:
    """``LocalIO`` that delegates to ``inner`` unless an armed rule says otherwise; thread-safe."""

    def __init__(self, inner: LocalIO = LOCAL_IO, *, name: str = ""):
        self.inner = inner
        self.name = name
        self.calls: Counter[str] = Counter()
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------- arming
    def fail(self, op: str, error: int | BaseException = errno_mod.EIO, *, times: int | None = None,
             after: bool = False, match: Callable[..., bool] | None = None) -> FaultRule:
        """Make ``op`` raise ``error`` (an errno or an exception) ``times`` times (None = until healed)."""
        return self._arm(FaultRule(self._check(op), error, times, after, match))

    def hang(self, op: str, *, then: int | BaseException | None = None, times: int | None = 1,
             after: bool = False, match: Callable[..., bool] | None = None) -> Blocked:
        """Pause ``op`` until ``release`` is set, then raise ``then`` (None: carry on normally)."""
        rule = Blocked(self._check(op), then, times, after, match)
        self._arm(rule)
        return rule

    def heal(self, op: str | None = None) -> None:
        """Remove the rules of ``op`` (all when None) and release every paused operation."""
        with self._lock:
            gone = [r for r in self._rules if op is None or r.op == op]
            self._rules = [r for r in self._rules if r not in gone]
        for r in gone:
            if isinstance(r, Blocked):
                r.release.set()

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def _check(self, op: str) -> str:
        if op not in OPS:
            raise ValueError(f"unknown LocalIO operation {op!r}; one of {OPS}")
        return op

    def _arm(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def _take(self, op: str, args: tuple[Any, ...]) -> FaultRule | None:
        with self._lock:
            self.calls[op] += 1
            for rule in self._rules:
                if rule.wants(op, args):
                    if rule.times is not None:
                        rule.times -= 1
                    rule.hits += 1
                    return rule
        return None

    def _run(self, op: str, args: tuple[Any, ...], call: Callable[[], Any]) -> Any:
        rule = self._take(op, args)
        if rule is None:
            return call()
        if rule.after:
            result = call()
            rule.fire(op)
            return result
        rule.fire(op)
        return call()

    # ------------------------------------------------------------- LocalIO
    def ensure_root(self, root: str) -> None:
        self._run("ensure_root", (root,), lambda: self.inner.ensure_root(root))

    def append_batch(self, root: str, app_id: str, shuffle_id: int, partition_id: int,
                     blocks: Sequence[Block]) -> tuple[int, int]:
        args = (root, app_id, shuffle_id, partition_id, blocks)
        return self._run("append_batch", args, lambda: self.inner.append_batch(*args))

    def read_index(self, root: str, app_id: str, shuffle_id: int, partition_id: int, *,
                   consistent: bool = False) -> tuple[bytes, int]:
        args = (root, app_id, shuffle_id, partition_id)
        return self._run("read_index", args, lambda: self.inner.read_index(*args, consistent=consistent))

    def read_data(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                  length: int) -> bytes:
        args = (root, app_id, shuffle_id, partition_id, offset, length)
        return self._run("read_data", args, lambda: self.inner.read_data(*args))

    def open_data(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                  length: int):
        """A read served by ``sendfile``: the ``read_data`` rules apply to it too (the same seam)."""
        args = (root, app_id, shuffle_id, partition_id, offset, length)
        return self._run("read_data", args, lambda: self.inner.open_data(*args))

    def index_entries_in(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                         length: int):
        args = (root, app_id, shuffle_id, partition_id, offset, length)
        return self._run("index_entries_in", args, lambda: self.inner.index_entries_in(*args))

    def advise_willneed(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                        length: int) -> int | None:
        args = (root, app_id, shuffle_id, partition_id, offset, length)
        return self._run("advise_willneed", args, lambda: self.inner.advise_willneed(*args))

    def remove_app(self, root: str, app_id: str, shuffle_id: int | None = None, *, max_ops: int | None = None,
                   progress=None) -> bool:
        args = (root, app_id, shuffle_id)
        return self._run("remove_app", args,
                         lambda: self.inner.remove_app(*args, max_ops=max_ops, progress=progress))

    def append_meta(self, root: str, app_id: str, shuffle_id: int, records: Sequence[tuple[int, bytes]]) -> int:
        args = (root, app_id, shuffle_id, records)
        return self._run("append_meta", args, lambda: self.inner.append_meta(*args))

    def usage(self, root: str) -> tuple[int, int]:
        return self._run("usage", (root,), lambda: self.inner.usage(root))

    def list_partitions(self, root: str) -> list[tuple[str, int, int]]:
        return self._run("list_partitions", (root,), lambda: self.inner.list_partitions(root))
