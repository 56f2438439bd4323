"""``python -m riffle_actors.coordinator`` = ``riffle-coordinator``."""

import sys

from riffle_actors.coordinator.main import main

sys.exit(main())
