"""``python -m riffle_actors.ctl``: the same as the ``riffle-ctl`` console script."""

import sys

from riffle_actors.ctl.main import main

sys.exit(main())
