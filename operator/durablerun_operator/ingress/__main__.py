"""python -m durablerun_operator.ingress: serve webhooks for the runs of the namespaces given."""

from __future__ import annotations

import argparse
import logging
import ssl

from aiohttp import web
from prometheus_client import start_http_server

from durablerun_operator import kube
from durablerun_operator.ingress.server import Ingress, Settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m durablerun_operator.ingress", description=__doc__)
    parser.add_argument("--namespace", action="append", required=True,
                        help="a namespace whose runs may receive webhooks (repeat for several)")
    parser.add_argument("--address", default="127.0.0.1", help="address to listen on (the pod's IP in a pod)")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics (0: off)")
    parser.add_argument("--tls-cert", help="PEM certificate chain (from a Secret); plain HTTP without it")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--max-body-bytes", type=int, default=Settings.max_body)
    parser.add_argument("--rate", type=float, default=Settings.rate, help="requests per second per source")
    parser.add_argument("--burst", type=int, default=Settings.burst, help="requests at once per source")
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kube.load_config()
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.address)
    settings = Settings(namespaces=frozenset(args.namespace), max_body=args.max_body_bytes, rate=args.rate,
                        burst=args.burst)
    web.run_app(Ingress(kube.Kube(), settings).app(), host=args.address, port=args.port, ssl_context=tls,
                print=None, access_log=None)


if __name__ == "__main__":
    main()
