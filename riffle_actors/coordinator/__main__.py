"""``python -m riffle_actors.coordinator`` = ``riffle-coordinator`` (``riffle_actors.coordinator_server.main``)."""

import sys

from riffle_actors.coordinator_server import main

sys.exit(main())
