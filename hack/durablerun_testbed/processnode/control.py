"""The process node's command line and its loopback control API (the faults tests inject)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client, config

from durablerun_testbed import procs
from durablerun_testbed.processnode.node import ProcessNode

log = logging.getLogger("processnode")


def _control_server(node: ProcessNode, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.startswith("/processes"):
                self._reply(200, node.processes())
            elif self.path.startswith("/healthz"):
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": "unknown path"})

        def do_POST(self) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                result = node.act(url.path.strip("/"), query["namespace"], query["pod"], query.get("container"))
            except (LookupError, ValueError) as error:
                self._reply(404, {"error": str(error)})
                return
            self._reply(200, result)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="durablerun_testbed node", description="a stand-in for the kubelet on a bare API server")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", default="process-node")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--workdir", type=Path, default=Path.cwd(),
                        help="working directory of containers that set no workingDir")
    parser.add_argument("--image-path", action="append", type=Path, default=[],
                        help="a host path that stands in for the image: kept visible in every container")
    parser.add_argument("--base-env", default="{}",
                        help="JSON object: the environment every container starts from (stands in for the image)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.geteuid() != 0:
        parser.error("the process node needs root: it mounts volumes in per-container mount namespaces")
    base_env = json.loads(args.base_env)
    if procs.MARKER_ENV in os.environ:  # so a leak check finds pods' processes too
        base_env[procs.MARKER_ENV] = os.environ[procs.MARKER_ENV]
    config.load_kube_config(config_file=args.kubeconfig)
    configuration = client.Configuration.get_default_copy()
    url = urlparse(configuration.host)
    if not configuration.ssl_ca_cert:
        parser.error("the kubeconfig must name the API server's CA")
    ca_file = Path(configuration.ssl_ca_cert)
    node = ProcessNode(
        node_name=args.name, state_dir=args.state_dir, base_env=base_env,
        api_host=url.hostname or "127.0.0.1", api_port=url.port or 443, ca_file=ca_file,
        default_workdir=args.workdir, image_paths=args.image_path,
    )
    server = _control_server(node, args.control_port)

    def stop(signum: int, frame: Any) -> None:
        node.shutdown()
        server.shutdown()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    node.run_forever()
    return 0
