"""The ``durablerun`` command (implementation: ``durablerun._private.tools.cli``).

::

    durablerun run MODULE:FUNC --run-id ID [--store URI] [--input JSON|@file] [--max-cost USD] ...
    durablerun resume [MODULE:FUNC] --run-id ID [--store URI] [--max-cost USD] ...
    durablerun send-event --run-id ID [--store URI] NAME [JSON|@file]
    durablerun inspect (--run-id ID | --kubernetes NAMESPACE/NAME) [--store URI] [--json] [--all] [--result]
    durablerun list [--store URI] [--json]
    durablerun delete --run-id ID [--store URI]
    durablerun pod [...]          # the in-pod entrypoint (durablerun.pod)

Exit codes follow docs/design.md: 0 Completed, 1 Failed, 2 usage error, 3 Aborted,
4 Waiting or Suspended, 5 Fenced; 75 when the store could not be reached.
"""

from durablerun._private.tools.cli import main

__all__ = ["main"]
