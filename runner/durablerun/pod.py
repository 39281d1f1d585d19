"""``durablerun pod``: the runner inside a DurableRun's pod (implementation: ``durablerun._private.pod.attempt``).

The runner image's entrypoint runs ``durablerun pod``; ``python -m durablerun.pod`` does the same.
docs/design.md says what the operator hands the runner and what the runner reports back.
"""

from __future__ import annotations

import sys

from durablerun._private.pod.attempt import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
