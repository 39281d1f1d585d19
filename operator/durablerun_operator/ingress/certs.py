"""The ingress's TLS certificate, loaded again when its files change (a cert-manager renewal).

The kubelet updates a mounted Secret by swapping a symlink, so the certificate and its key change together;
the files are read every few seconds and, when they differ from what is served, checked in a context of
their own first. A pair that does not load (half written by another writer, a key that does not match) is
logged and the certificate served until then stays: a renewal never takes the ingress down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("durablerun.ingress")


def _context() -> ssl.SSLContext:
    return ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)


class ReloadingCertificate:
    """An SSL context serving the certificate in ``cert`` (and its key in ``key``), as they are now."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = _context()
        self._served = self._read()
        self._refused: tuple[bytes, bytes] | None = None
        self.context.load_cert_chain(cert, key)  # a bad pair at start is an error: nothing to serve yet

    def _read(self) -> tuple[bytes, bytes]:
        return self.cert.read_bytes(), self.key.read_bytes()

    def reload(self) -> bool:
        """Load the files again if they changed; True if the certificate served changed."""
        try:
            files = self._read()
        except OSError as error:  # mid-swap, or the Secret is gone: keep serving what we have
            log.warning("TLS certificate %s not read, still serving the previous one: %s", self.cert, error)
            return False
        if files in (self._served, self._refused):
            return False
        try:
            _context().load_cert_chain(self.cert, self.key)  # a pair that loads...
            self.context.load_cert_chain(self.cert, self.key)  # ...is served to the next handshakes
        except (ssl.SSLError, OSError) as error:
            self._refused = files
            log.warning("TLS certificate %s and key %s do not load, still serving the previous ones: %s",
                        self.cert, self.key, error)
            return False
        self._served, self._refused = files, None
        log.info("TLS certificate %s reloaded", self.cert)
        return True

    def watching(self, every: float) -> Callable[[Any], AsyncIterator[None]]:
        """An aiohttp cleanup context that reloads the files every ``every`` seconds while the app runs."""

        async def watch() -> None:
            while True:
                await asyncio.sleep(every)
                self.reload()

        async def running(app: Any) -> AsyncIterator[None]:
            task = asyncio.create_task(watch())
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        return running
