"""Opening listeners with errors an operator can act on.

This module owns ``ListenError`` and the ways the daemons open a port: ``bind_grpc`` (a
``grpc.aio`` server's insecure port), ``start_tcp_site`` (an aiohttp site) and
``create_tcp_server`` (a plain asyncio server, the urpc listener). A failure names
the address, the port and the config keys that chose them, e.g.::

    cannot listen on 0.0.0.0:19999 (config keys grpc_port / grpc_bind_address): address already in use

``ListenError`` is an ``OSError``, which the daemon runner logs as one line (no traceback) and
turns into exit code 1. Listeners bind exactly the address given: nothing here widens it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable

import grpc
from aiohttp import web


class ListenError(OSError):
    """A configured port could not be opened; the message names the config keys."""

    def __init__(self, what: str, keys: str, host: str, port: int, reason: str):
        self.keys, self.host, self.port = keys, host, port
        shown = f"[{host}]" if ":" in host else host
        super().__init__(f"cannot listen for {what} on {shown}:{port} (config keys {keys}): {reason}")


def _why(host: str, port: int) -> str:
    """Why binding ``host:port`` fails, found by trying it with a plain socket (gRPC does not say)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return _reason(e)
    return "refused by gRPC"


def _reason(e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return "address already in use (another process holds the port; stop it or choose another port)"
    if e.errno == errno.EADDRNOTAVAIL:
        return "no interface of this host has that address"
    if e.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return e.strerror or os.strerror(e.errno or 0) or repr(e)


def bind_grpc(server: grpc.aio.Server, *, what: str, keys: str, host: str, port: int) -> int:
    """``server.add_insecure_port`` on exactly ``host:port``; returns the bound port (``port`` 0 = any)."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ListenError(what, keys, host, port, _why(host, port))
    return bound


async def start_tcp_site(runner: web.AppRunner, *, what: str, keys: str, host: str, port: int) -> int:
    """Start an aiohttp site on exactly ``host:port``; returns the bound port."""
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        raise ListenError(what, keys, host, port, _reason(e)) from None
    server = site._server  # aiohttp keeps the asyncio server here; the bound port is only known from it
    return server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def create_tcp_server(factory: Callable[[], asyncio.BaseProtocol], *, what: str, keys: str, host: str,
                            port: int, backlog: int = 1024) -> tuple[asyncio.AbstractServer, int]:
    """``loop.create_server`` on exactly ``host:port`` (no ``SO_REUSEPORT``); returns it and the bound port."""
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(factory, host, port, reuse_address=True, backlog=backlog)
    except OSError as e:
        raise ListenError(what, keys, host, port, _reason(e)) from None
    return server, server.sockets[0].getsockname()[1]
