"""``python -m durablerun`` is the ``durablerun`` command."""

import sys

from durablerun.cli import main

sys.exit(main())
