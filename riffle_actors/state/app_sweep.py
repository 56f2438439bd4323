"""The AppManager's sweep decisions, as pure state: which apps to purge, which buffers to spill.

This module owns the conclusions the ``AppManagerActor`` draws from its apps' answers, and
none of the asking: the actor fans a question out to every AppActor at once (with a bounded
wait per app), collects what came back, and hands it here.

- **Expiry** (``ExpiryBook``): an app that answers "expired" is purged for its heartbeat
  timeout; one whose actor is gone is purged too. An app that does not answer in time is not
  judged on one silence (a busy app is not an expired one); after ``misses_to_purge``
  unanswered checks in a row it is purged all the same, so a stuck actor cannot hold memory
  and files forever.
- **Spill targets** (``pick_spill``): the largest staging buffers of all apps first, until their
  sizes add up to the target (the MemoryManager's "down to the low watermark").
- **One round at a time** (``RoundGate``): a sweep or spill round requested while one runs is
  not lost and not run twice: requests coalesce into one more round after the current one.

See also: ``riffle_actors.actors.app_manager`` (the actor), ``riffle_actors.actors.memory``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")


class Answer(enum.Enum):
    """What one app said to an expiry check."""

    EXPIRED = "expired"
    ALIVE = "alive"
    GONE = "gone"            # its actor stopped or crashed before answering
    NO_ANSWER = "no answer"  # not answered within the per-app wait


@dataclass(slots=True)
class ExpiryBook:
    """Expiry decisions across sweeps; see the module docstring."""

    misses_to_purge: int = 3
    misses: dict[str, int] = field(default_factory=dict)  # app id -> unanswered checks in a row

    def decide(self, answers: Mapping[str, Answer]) -> list[tuple[str, str]]:
        """(app id, purge reason) for every app to purge after a sweep that got ``answers``.

        Apps absent from ``answers`` (purged or registered meanwhile) lose their miss count.
        """
        purge: list[tuple[str, str]] = []
        for app_id in [a for a in self.misses if a not in answers]:
            del self.misses[app_id]
        for app_id, answer in answers.items():
            if answer is Answer.NO_ANSWER:
                n = self.misses[app_id] = self.misses.get(app_id, 0) + 1
                if n >= self.misses_to_purge:
                    why = f"heartbeat timeout (expiry check not answered {n} times in a row)"
                    purge.append((app_id, why))
                continue
            self.misses.pop(app_id, None)
            if answer is Answer.EXPIRED:
                purge.append((app_id, "heartbeat timeout"))
            elif answer is Answer.GONE:
                purge.append((app_id, "app actor stopped"))
        for app_id, _ in purge:
            self.misses.pop(app_id, None)
        return purge


class SpillCandidate(NamedTuple):
    """One partition buffer with staging bytes, as its app reported it."""

    size_bytes: int
    app_id: str
    shuffle_id: int
    partition_id: int


def pick_spill(candidates: Iterable[SpillCandidate],
               target_bytes: int) -> dict[str, tuple[tuple[int, int], ...]]:
    """app id -> (shuffle id, partition id) of the buffers to spill: the largest first, up to ``target_bytes``.

    The buffer that crosses the target is included (a round spills at least the target); ties
    keep the order of ``candidates``.
    """
    picked: dict[str, list[tuple[int, int]]] = {}
    total = 0
    for c in sorted(candidates, key=lambda c: c.size_bytes, reverse=True):
        if total >= target_bytes:
            break
        picked.setdefault(c.app_id, []).append((c.shuffle_id, c.partition_id))
        total += c.size_bytes
    return {app_id: tuple(keys) for app_id, keys in picked.items()}


class RoundGate(Generic[T]):
    """At most one round at a time; requests made during a round coalesce into one more round.

    ``request(arg)`` returns True when the caller starts a round with ``arg`` now. Otherwise
    ``arg`` replaces any earlier waiting request. ``finished()`` ends the round and returns the
    waiting request's ``arg`` (the caller starts that round at once) or None.
    """

    _NOTHING: object = object()

    def __init__(self) -> None:
        self.running = False
        self._waiting: object = self._NOTHING
        self.rounds = 0
        self.coalesced = 0

    def request(self, arg: T) -> bool:
        if arg is None:
            raise ValueError("a round's arg must not be None")
        if not self.running:
            self.running = True
            self.rounds += 1
            return True
        if self._waiting is not self._NOTHING:
            self.coalesced += 1
        self._waiting = arg
        return False

    def finished(self) -> T | None:
        if self._waiting is self._NOTHING:
            self.running = False
            return None
        arg, self._waiting = self._waiting, self._NOTHING
        self.rounds += 1
        return arg  # type: ignore[return-value]
