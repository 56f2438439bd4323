"""The IP address a shuffle server advertises to the coordinator and clients.

``advertised_ip()`` returns, in order:

1. the ``WORKER_IP`` environment variable when set (Riffle's override; containers and
   multi-homed hosts set it);
2. the gRPC bind address when it is one address (``grpc_bind_address = "127.0.0.1"``: the
   server is reachable there and nowhere else);
3. the primary IPv4 address of the interface that holds the default route (read with
   pyroute2's netlink ``IPRoute``; works inside a network namespace);
4. ``127.0.0.1``.

It does not cover: choosing the bind address (``grpc_bind_address``) or IPv6 default routes.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import os

from loguru import logger


def advertised_ip(bind_address: str | None = None) -> str:
    """See the module docstring."""
    env = os.environ.get("WORKER_IP", "").strip()
    if env:
        return env
    if bind_address and not ipaddress.ip_address(bind_address).is_unspecified:
        return bind_address  # a listener on one address is reachable there only
    try:
        ip = default_route_ip()
    except Exception as e:  # noqa: BLE001 - netlink unavailable (sandbox, non-Linux): fall back
        logger.debug("cannot read the default route: {}", e)
        ip = None
    return ip or "127.0.0.1"


def default_route_ip() -> str | None:
    """IPv4 address of the interface holding the default route, or None when there is none.

    pyroute2 0.9 drives netlink with an asyncio loop of its own, which cannot run inside an
    already running loop (a daemon calls this from ``serve``), so the query runs in a
    short-lived thread; it takes about a millisecond.
    """
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="netaddr") as pool:
        return pool.submit(_query_default_route_ip).result(timeout=10)


def _query_default_route_ip() -> str | None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        routes = [r for r in ipr.get_routes(family=2) if r.get("dst_len") == 0 and r.get_attr("RTA_OIF")]
        if not routes:
            return None
        # The lowest metric is the route the kernel uses.
        route = min(routes, key=lambda r: r.get_attr("RTA_PRIORITY") or 0)
        prefsrc = route.get_attr("RTA_PREFSRC")
        if prefsrc:
            return str(prefsrc)
        oif = route.get_attr("RTA_OIF")
        addrs = ipr.get_addr(family=2, index=oif)
        for addr in addrs:
            ip = addr.get_attr("IFA_ADDRESS")
            if ip:
                return str(ip)
    return None
