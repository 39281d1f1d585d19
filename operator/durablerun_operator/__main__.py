"""python -m durablerun_operator [--namespace NS ...]: run the operator.

Watches every namespace unless --namespace is given. Settings come from the
environment (see ``durablerun_operator.config.Settings``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket

import kopf

from durablerun import api
from durablerun_operator import handlers, tracing  # importing handlers registers the kopf handlers
from durablerun_operator.config import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durablerun_operator", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    parser.add_argument("--all-namespaces", action="store_true", help="watch every namespace (the default)")
    args = parser.parse_args(argv)
    if args.all_namespaces and args.namespace:
        parser.error("--all-namespaces and --namespace exclude each other")
    settings = Settings.from_env(tuple(args.namespace))
    if settings.kueue:
        handlers.watch_workloads()
    if settings.model_quotas:
        handlers.watch_quotas()
    level = os.environ.get(api.OperatorEnv.LOG_LEVEL, "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":
        # kopf logs every handled watch event at INFO ("Handler 'run_changed' succeeded."): with lease
        # renewals that is tens of lines a second saying nothing. Its warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Before kopf starts: a malformed endpoint stops the operator here, naming the setting.
    tracer = tracing.DecisionTracer.from_env(os.environ)
    asyncio.run(kopf.operator(
        standalone=True,  # one replica by design; correctness does not rest on kopf's peering
        # kopf would name itself after the OS user, but the image runs as uid 65532 with no
        # passwd entry (as official python images do), and getpass fails there. (kopf types it as
        # a NewType of str it does not export.)
        identity=f"durablerun-operator@{socket.gethostname()}",  # type: ignore[arg-type]
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        memo=kopf.Memo(settings=settings, tracer=tracer),
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None,
    ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
