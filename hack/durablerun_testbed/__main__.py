"""python -m durablerun_testbed {node,sandbox,llm-server,forward,reap} ..."""

from __future__ import annotations

import sys


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("node", "sandbox", "llm-server", "forward", "reap"):
        print("usage: python -m durablerun_testbed {node|sandbox|llm-server|forward|reap} ...", file=sys.stderr)
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "reap":
        from durablerun_testbed import reaper

        return reaper.main()
    if command == "llm-server":
        from durablerun_testbed import llmserver

        return llmserver.main(rest)
    if command == "forward":
        from durablerun_testbed import forward

        return forward.main(rest)
    if command == "node":
        from durablerun_testbed import processnode

        return processnode.main(rest)
    from durablerun_testbed import sandbox

    return sandbox.main(rest)


if __name__ == "__main__":
    sys.exit(main())
