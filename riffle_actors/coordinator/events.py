"""RegistryEvent: what the coordinator's pure registries tell an operator, returned instead of logged.

``cluster.ClusterRegistry`` and ``apps.AppRegistry`` are pure (no IO, no logging): each decision an
operator should read about (a server registered, moved, lost or refused; an app registered or
expired; an operator's override) is appended to the registry's ``events`` as a ``RegistryEvent``,
and the actor that owns the registry (``actors.py``) takes them after each message and logs them
(``log_events``). So a unit test reads what happened from ``take_events()`` without a log sink.

``kind`` is a short fixed word (``registered``, ``moved``, ``status``, ``id_conflict``,
``registry_full``, ``host_limit``, ``lost``, ``excluded``, ``operator_status``, ``operator_tags``,
``app_registered``, ``app_expired``); ``level`` is loguru's level name; ``message`` the log line.

It does not cover: the rules that make the events (``cluster.py``, ``apps.py``) or the sink
(``riffle_actors.log``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RegistryEvent:
    """One thing a registry decided, for the log (see the module docstring)."""

    kind: str
    level: str  # "INFO" or "WARNING"
    message: str


class EventOutbox:
    """Events appended by a pure registry, taken (and logged) by its actor."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[RegistryEvent] = []

    def info(self, kind: str, message: str) -> None:
        self.events.append(RegistryEvent(kind, "INFO", message))

    def warning(self, kind: str, message: str) -> None:
        self.events.append(RegistryEvent(kind, "WARNING", message))

    def take_events(self) -> list[RegistryEvent]:
        """The events since the last call, oldest first (the outbox is emptied)."""
        events, self.events = self.events, []
        return events
