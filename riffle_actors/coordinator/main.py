"""The ``riffle-coordinator`` console entry point of installs made before the composition root moved.

The coordinator's ``main`` lives in ``riffle_actors.coordinator_server`` (the composition root,
above the transports; ``[project.scripts]`` points there). This module only forwards to it, so a
console script generated from the older ``riffle_actors.coordinator.main:main`` keeps working; it
is one of the two entry modules of the package that may import the root (``pyproject.toml``,
contract ``coordinator-below-transports``).
"""

from __future__ import annotations

from riffle_actors.coordinator_server import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
