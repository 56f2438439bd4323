"""Network namespaces as hosts: a bridge namespace and one namespace per host, each with its own IP.

``NetLab(tag, workdir, hosts)`` builds (``build()``) one namespace ``<tag>-br`` holding a bridge
``br0`` with ``<subnet>.1/24`` and, for each ``name -> ip`` of ``hosts``, a namespace ``<tag>-<name>``
whose ``eth0`` (a veth pair into the bridge) has that IP and a default route via the bridge.
``popen(host, args)`` starts ``python args...`` inside a host namespace (``ip netns exec`` execs in
place, so ``Popen.pid`` is the program's own pid) in a session of its own and remembers it;
``teardown()`` kills the process group of every process it started (a Spark driver's JVM too) and
removes every namespace it created, and fails if one is left behind.

The addresses exist only inside those namespaces: the test's own namespace is never touched,
and fixed ports are safe (every namespace has its own port space).

``netns_problem()`` says why namespaces cannot be used here (not root, no ``ip``, no pyroute2,
creation refused), or None.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any


def netns_problem() -> str | None:
    """Why this test cannot build network namespaces here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    try:
        from pyroute2 import netns
    except ImportError:
        return "pyroute2 is not installed"
    probe = f"rflprobe-{uuid.uuid4().hex[:6]}"
    try:
        netns.create(probe)
    except Exception as e:  # noqa: BLE001 - any failure means: no namespaces here
        return f"cannot create a network namespace here: {e!r}"
    netns.remove(probe)
    return None


class NetLab:
    """Host namespaces joined by a bridge in one more; owns every process started inside."""

    def __init__(self, tag: str, workdir: Path, hosts: dict[str, str], *, bridge_ip: str, env: dict[str, str]):
        self.tag = tag
        self.workdir = workdir
        self.hosts = dict(hosts)
        self.bridge_ip = bridge_ip
        self.env = env
        self.bridge_ns = f"{tag}-br"
        self.ns = {name: f"{tag}-{name}" for name in hosts}
        self.procs: list[subprocess.Popen[Any]] = []
        self.created: list[str] = []

    def build(self) -> None:
        from pyroute2 import IPRoute, netns

        for name in [self.bridge_ns, *self.ns.values()]:
            netns.create(name)
            self.created.append(name)
        with IPRoute(netns=self.bridge_ns) as br:
            br.link("set", index=br.link_lookup(ifname="lo")[0], state="up")
            br.link("add", ifname="br0", kind="bridge")
            bridge = br.link_lookup(ifname="br0")[0]
            br.addr("add", index=bridge, address=self.bridge_ip, prefixlen=24)
            br.link("set", index=bridge, state="up")
            for i, (name, ns) in enumerate(self.ns.items()):
                # Both veth ends are born in the bridge namespace; one end moves to the host namespace.
                br.link("add", ifname=f"v{i}", kind="veth", peer=f"p{i}")
                br.link("set", index=br.link_lookup(ifname=f"p{i}")[0], net_ns_fd=ns)
                br.link("set", index=br.link_lookup(ifname=f"v{i}")[0], master=bridge, state="up")
                with IPRoute(netns=ns) as host:
                    host.link("set", index=host.link_lookup(ifname="lo")[0], state="up")
                    eth = host.link_lookup(ifname=f"p{i}")[0]
                    host.link("set", index=eth, ifname="eth0")
                    host.addr("add", index=eth, address=self.hosts[name], prefixlen=24)
                    host.link("set", index=eth, state="up")
                    host.route("add", dst="0.0.0.0/0", gateway=self.bridge_ip)

    def popen(self, host: str, args: list[str], *, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[Any]:
        """``python args...`` inside ``host``'s namespace (stdout/stderr to /dev/null unless given)."""
        cmd = ["ip", "netns", "exec", self.ns[host], sys.executable, *args]
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        kw.setdefault("text", True)
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(cmd, env=env or self.env, cwd=self.workdir, **kw)
        self.procs.append(p)
        return p

    def teardown(self) -> None:
        from pyroute2 import netns

        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group: children such as a JVM go too
            except ProcessLookupError:
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        problems = []
        for name in reversed(self.created):
            try:
                netns.remove(name)
            except Exception as e:  # noqa: BLE001 - keep removing the others
                problems.append(f"{name}: {e!r}")
        left = [n for n in self.created if n in netns.listnetns()]
        assert not left and not problems, f"namespaces left behind: {left} {problems}"
