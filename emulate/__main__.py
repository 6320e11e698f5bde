"""``python -m emulate``: the command line (see :mod:`emulate.cli`)."""

import sys

from emulate.cli import main

sys.exit(main())
