"""``kubectl durablerun``: the kubectl plugin (implementation: ``durablerun._private.tools.kubectl``).

Installed as the ``kubectl-durablerun`` and ``kubectl_complete-durablerun`` console scripts;
docs/operator.md describes its commands.
"""

from __future__ import annotations

import sys

from durablerun._private.tools.kubectl import complete_main, main

__all__ = ["complete_main", "main"]

if __name__ == "__main__":
    sys.exit(main())
