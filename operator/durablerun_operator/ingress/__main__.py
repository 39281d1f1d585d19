"""python -m durablerun_operator.ingress: serve webhooks for the runs of the namespaces given."""

from __future__ import annotations

import argparse
import logging
import ssl
from pathlib import Path

from aiohttp import web
from prometheus_client import start_http_server

from durablerun_operator import kube
from durablerun_operator.ingress import certs, limits
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
    parser.add_argument("--tls-reload-seconds", type=float, default=30.0,
                        help="how often the certificate's files are read again (a renewed one is then served)")
    parser.add_argument("--max-body-bytes", type=int, default=Settings.max_body)
    parser.add_argument("--rate", type=float, default=Settings.rate,
                        help="authenticated requests per second per run and source")
    parser.add_argument("--burst", type=int, default=Settings.burst,
                        help="authenticated requests at once per run and source")
    parser.add_argument("--failure-rate", type=float, default=Settings.failure_rate,
                        help="failed authentications per second per client address")
    parser.add_argument("--failure-burst", type=int, default=Settings.failure_burst,
                        help="failed authentications at once per client address")
    parser.add_argument("--trusted-proxy", action="append", default=[],
                        help="an address or network (CIDR) of a proxy whose X-Forwarded-For names the client "
                             "(repeat for several)")
    parser.add_argument("--stream-max-per-run", type=int, default=Settings.stream_max_per_run,
                        help="Server-Sent Events connections at once to one run's streams (more: 429)")
    parser.add_argument("--stream-max-total", type=int, default=Settings.stream_max_total,
                        help="Server-Sent Events connections at once in all (more: 503)")
    parser.add_argument("--stream-write-timeout", type=float, default=Settings.stream_write_timeout,
                        help="seconds a stream's client may take no data before it is dropped")
    args = parser.parse_args(argv)
    for flag, value in (("--stream-max-per-run", args.stream_max_per_run),
                        ("--stream-max-total", args.stream_max_total),
                        ("--stream-write-timeout", args.stream_write_timeout)):
        if value <= 0:
            parser.error(f"{flag} must be positive, got {value}")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_reload_seconds <= 0:
        parser.error(f"--tls-reload-seconds must be positive, got {args.tls_reload_seconds}")
    try:
        proxies = limits.parse_networks(args.trusted_proxy)
        limits.RateLimits(args.rate, args.burst)
        limits.RateLimits(args.failure_rate, args.failure_burst)
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kube.load_config()
    tls = None
    if args.tls_cert:
        try:
            tls = certs.ReloadingCertificate(Path(args.tls_cert), Path(args.tls_key))
        except (OSError, ssl.SSLError) as error:
            parser.error(f"--tls-cert {args.tls_cert} and --tls-key {args.tls_key} do not load: {error}")
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.address)
    settings = Settings(namespaces=frozenset(args.namespace), max_body=args.max_body_bytes, rate=args.rate,
                        burst=args.burst, failure_rate=args.failure_rate, failure_burst=args.failure_burst,
                        trusted_proxies=proxies, stream_max_per_run=args.stream_max_per_run,
                        stream_max_total=args.stream_max_total, stream_write_timeout=args.stream_write_timeout)
    app = Ingress(kube.Kube(), settings).app()
    if tls:
        app.cleanup_ctx.append(tls.watching(args.tls_reload_seconds))
    web.run_app(app, host=args.address, port=args.port, ssl_context=tls.context if tls else None,
                print=None, access_log=None)


if __name__ == "__main__":
    main()
