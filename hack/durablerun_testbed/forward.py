"""A TCP forwarder: the sandbox's stand-in for a Service's address, which the bed (no kube-proxy) lacks.

  python -m durablerun_testbed forward LISTEN_HOST:PORT [LISTEN_HOST:PORT ...] TARGET_HOST:PORT

Each listener (loopback or the bed's bridge, never a wildcard address) copies bytes both ways between a
client and the target, one connection to the target per client; the target is resolved once, at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import sys


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def serve(listen: list[tuple[str, int]], target: tuple[str, int]) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, target_writer), _pipe(target_reader, client_writer))

    servers = [await asyncio.start_server(handle, host, port) for host, port in listen]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m durablerun_testbed forward LISTEN_HOST:PORT [...] TARGET_HOST:PORT", file=sys.stderr)
        return 2
    listen = [_address(a) for a in argv[:-1]]
    for host, _ in listen:
        if ipaddress.ip_address(host).is_unspecified:
            print(f"forward: listen on loopback or the bed's bridge, not {host}", file=sys.stderr)
            return 2
    asyncio.run(serve(listen, _address(argv[-1])))
    return 0
