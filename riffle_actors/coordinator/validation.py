"""What a shuffle-server heartbeat must look like before the coordinator believes it (pure).

The Uniffle protocol has no server authentication: anyone who reaches the coordinator's gRPC
port can send ``heartbeat``. This module owns the checks that keep malformed or absurd
heartbeats out of the registry, so that nothing a server claims ends up as a broken address in
an assignment, a control character in a log line, or an unbounded amount of memory:

- ``heartbeat_problems(req)``: every problem of a ``ShuffleServerHeartBeatRequest``, each naming
  its field (``serverId.port: 70000 is not a port (1-65535)``); empty = acceptable. The rules:
  ``serverId.ip`` is an IP address clients can connect to (not ``0.0.0.0``/``::``/multicast);
  ``serverId.port`` is 1-65535; ``netty_port`` / ``jetty_port`` are 1-65535, or 0 / -1 for
  "none" (a Riffle server sends 0, a Java server without Netty sends -1); memory figures, event
  count, start time and each disk's capacity/used bytes are non-negative (a huge value is not
  refused: only its sign); ``serverId.id`` is empty (then ``"<ip>-<port>"`` is used) or at
  most 256 characters of ``[A-Za-z0-9._:%@+\\[\\]-]``, and when it has the conventional form
  ``"<ip>-<grpcPort>[-<nettyPort>]"`` its IP and gRPC port (and a netty port > 0) are the
  advertised ones (a server cannot take the id of another address); at most 64 tags of 1-256 printable characters; at
  most 256 ``storageInfo`` entries with printable keys and mount points of at most 4096
  characters; at most 10000 ``applicationInfo`` entries, each ``appId`` valid for
  ``protocol.ids.check_app_id``; ``version`` and ``gitCommitId`` at most 256 printable characters.
- ``app_request_problem(...)``: why a driver's ``registerApplicationInfo`` / ``appHeartbeat`` is
  unacceptable (``check_app_id``; user, version and git commit at most 256 printable characters).
- ``assignment_problem(...)``: why a ``getShuffleAssignments`` is unacceptable: the app id (when
  given), ``shuffleId`` a Java int >= 0, ``partitionNum`` in ``0..max_partitions_per_assignment``,
  ``partitionNumPerRange`` in ``1..max_partitions_per_assignment``, ``dataReplica`` in
  ``1..max_data_replica``, at most 64 ``requireTags`` and 10000 ``faultyServerIds`` (each at most
  256 characters); the message names the config key that bounds the field.
- ``AppFilter.parse(body)``: the body of ``POST /api/server/applications`` (Uniffle's
  ``ApplicationRequest``) as a bounded filter: at most ``MAX_FILTER_APPS`` listed ids (each
  checked), ``pageSize`` 1..``MAX_PAGE_SIZE``, and ``appIdRegex`` at most
  ``MAX_APP_ID_REGEX_CHARS`` characters compiled by RE2 (``google-re2``: linear time in the id,
  no backtracking, so ``(a+)+`` cannot stall; back references and look-arounds are refused)
  within ``REGEX_MAX_MEM`` bytes. ``InvalidFilter`` says what is wrong.
- ``reject_message(problems)``: one bounded line for the reply and the log; values sent by the
  peer are quoted with ``repr`` and cut, so a hostile string cannot forge log lines.
- ``peer_host(context.peer())``: the IP of the TCP peer (``ipv4:10.0.0.5:41234`` -> ``10.0.0.5``;
  an IPv4-mapped IPv6 peer is shown as IPv4).
- ``source_problem(peer, ip, networks)``: why a heartbeat is outside ``[server] allowed_networks``.
- ``RepeatFilter``: decides which repeats of the same refusal are worth a log line.

It does not cover: decoding into ``ServerHeartbeat`` (``transport.coordinator_grpc.decode_heartbeat``) or the
registry's own admission rules: the size caps and id conflicts (``cluster.ClusterRegistry``).
"""

from __future__ import annotations

import ipaddress
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import re2  # google-re2: linear-time matching of client regexes

from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.ids import check_app_id, check_shuffle_id
from riffle_actors.protocol.proto import uniffle_pb2 as pb

MAX_ID_CHARS = 256
MAX_TAGS = 64
MAX_TAG_CHARS = 256
MAX_DISKS = 256
MAX_PATH_CHARS = 4096
MAX_APPS = 10_000  # applicationInfo entries of one heartbeat: each id is checked, ~0.6 us apiece
MAX_TEXT_CHARS = 256
MAX_FAULTY_IDS = 10_000  # faultyServerIds of one getShuffleAssignments (at most [server] max_servers can exist)
#: Port values that mean "no such listener" for netty_port / jetty_port (Riffle sends 0, Java -1).
NO_PORT = (0, -1)

_ID_RE = re.compile(r"^[A-Za-z0-9._:%@+\[\]-]+$")
_SHOWN_CHARS = 48
_SHOWN_PROBLEMS = 5


class InvalidHeartbeat(ValueError):
    """A heartbeat that breaks the rules above; ``problems`` lists each one."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(reject_message(self.problems))


@dataclass(frozen=True, slots=True)
class MalformedHeartbeat:
    """What an adapter hands the coordinator service for a heartbeat that breaks the rules above
    (instead of a ``ServerHeartbeat``): the id it claimed and every problem."""

    server_id: str
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return reject_message(self.problems)


def show(value: object) -> str:
    """A peer-supplied value, quoted and cut to a few dozen characters (safe for one log line)."""
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return repr(value[:_SHOWN_CHARS]) + f"... ({len(value)} chars)"
    return repr(value)


def reject_message(problems: Sequence[str]) -> str:
    """``problems`` joined into one bounded line."""
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    if len(problems) > _SHOWN_PROBLEMS:
        shown += f"; and {len(problems) - _SHOWN_PROBLEMS} more"
    return f"invalid heartbeat: {shown}"


def parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``value`` as an IP address, or None (IPv6 may carry a ``%scope``; brackets are not allowed)."""
    if not value or len(value) > 64:
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _ip_problem(value: str) -> str | None:
    if not value:
        return "serverId.ip: missing"
    addr = parse_ip(value)
    if addr is None:
        return f"serverId.ip: {show(value)} is not an IP address"
    if addr.is_unspecified or addr.is_multicast:
        return f"serverId.ip: {value} is not an address clients can connect to"
    return None


def _port_problem(name: str, value: int, *, optional: bool) -> str | None:
    if 1 <= value <= 65535 or (optional and value in NO_PORT):
        return None
    allowed = "1-65535, or 0 / -1 for none" if optional else "1-65535"
    return f"serverId.{name}: {value} is not a port ({allowed})"


def _text_problem(name: str, value: str, limit: int, *, empty_ok: bool = True) -> str | None:
    if not value:
        return None if empty_ok else f"{name}: empty"
    if len(value) > limit:
        return f"{name}: {len(value)} characters, more than {limit}"
    if not value.isprintable():
        return f"{name}: {show(value)} has non-printable characters"
    return None


def id_problem(server_id: str, ip: str, port: int, netty_port: int | None = None) -> str | None:
    """Why ``serverId.id`` is unacceptable for a server advertising ``ip:port`` (and ``netty_port``, when
    given and > 0, which an id of the form ``<ip>-<port>-<nettyPort>`` must name); None if it is fine."""
    if not server_id:
        return None
    if len(server_id) > MAX_ID_CHARS:
        return f"serverId.id: {len(server_id)} characters, more than {MAX_ID_CHARS}"
    if not _ID_RE.match(server_id):
        return f"serverId.id: {show(server_id)} has characters outside [A-Za-z0-9._:%@+[]-]"
    parts = server_id.split("-")
    named = parse_ip(parts[0]) if len(parts) in (2, 3) and all(p.isdigit() for p in parts[1:]) else None
    if named is None:
        return None  # not the "<ip>-<port>" convention: an opaque id
    if named != parse_ip(ip) or int(parts[1]) != port:
        return f"serverId.id: {show(server_id)} names another address than the advertised {ip}:{port}"
    if len(parts) == 3 and netty_port is not None and netty_port > 0 and int(parts[2]) != netty_port:
        return f"serverId.id: {show(server_id)} names another netty port than the advertised {netty_port}"
    return None


def heartbeat_problems(req: pb.ShuffleServerHeartBeatRequest) -> list[str]:
    """Every rule ``req`` breaks (see the module docstring); an empty list means acceptable."""
    out: list[str | None] = []
    sid = req.serverId
    out.append(_ip_problem(sid.ip))
    out.append(_port_problem("port", sid.port, optional=False))
    out.append(_port_problem("netty_port", sid.netty_port, optional=True))
    out.append(_port_problem("jetty_port", sid.jetty_port, optional=True))
    if out[0] is None and out[1] is None:
        out.append(id_problem(sid.id, sid.ip, sid.port, sid.netty_port))
    elif len(sid.id) > MAX_ID_CHARS:
        out.append(f"serverId.id: {len(sid.id)} characters, more than {MAX_ID_CHARS}")
    for name in ("usedMemory", "preAllocatedMemory", "availableMemory", "eventNumInFlush", "startTimeMs"):
        value = getattr(req, name)
        if value < 0:
            out.append(f"{name}: {value} is negative")
    if len(req.tags) > MAX_TAGS:
        out.append(f"tags: {len(req.tags)} tags, more than {MAX_TAGS}")
    else:
        for i, tag in enumerate(req.tags):
            out.append(_text_problem(f"tags[{i}]", tag, MAX_TAG_CHARS, empty_ok=False))
    if len(req.storageInfo) > MAX_DISKS:
        out.append(f"storageInfo: {len(req.storageInfo)} entries, more than {MAX_DISKS}")
    else:
        for key, info in req.storageInfo.items():
            out.append(_text_problem("storageInfo key", key, MAX_PATH_CHARS, empty_ok=False))
            out.append(_text_problem(f"storageInfo[{show(key)}].mountPoint", info.mountPoint, MAX_PATH_CHARS))
            for name in ("capacity", "usedBytes"):
                value = getattr(info, name)
                if value < 0:
                    out.append(f"storageInfo[{show(key)}].{name}: {value} is negative")
    if len(req.applicationInfo) > MAX_APPS:
        out.append(f"applicationInfo: {len(req.applicationInfo)} entries, more than {MAX_APPS}")
    else:
        out.append(_first_bad_app_id(a.appId for a in req.applicationInfo))
    out.append(_text_problem("version", req.version, MAX_TEXT_CHARS))
    out.append(_text_problem("gitCommitId", req.gitCommitId, MAX_TEXT_CHARS))
    return [p for p in out if p is not None]


def _first_bad_app_id(app_ids: Iterable[str]) -> str | None:
    for i, app_id in enumerate(app_ids):
        try:
            check_app_id(app_id, f"applicationInfo[{i}].appId")
        except ProtocolError as e:
            return str(e)
    return None


def check_heartbeat(req: pb.ShuffleServerHeartBeatRequest) -> None:
    """Raise ``InvalidHeartbeat`` when ``heartbeat_problems(req)`` finds anything."""
    problems = heartbeat_problems(req)
    if problems:
        raise InvalidHeartbeat(problems)


# ----------------------------------------------------------------------------- driver requests


def app_request_problem(app_id: str, *, user: str = "", version: str = "", git_commit_id: str = "") -> str | None:
    """Why a ``registerApplicationInfo`` / ``appHeartbeat`` is unacceptable; None if it is fine."""
    try:
        check_app_id(app_id)
    except ProtocolError as e:
        return str(e)
    for name, value in (("user", user), ("version", version), ("gitCommitId", git_commit_id)):
        problem = _text_problem(name, value, MAX_TEXT_CHARS)
        if problem is not None:
            return problem
    return None


def assignment_problem(
    app_id: str, shuffle_id: int, *, partition_num: int, per_range: int, replica: int,
    require_tags: Sequence[str] = (), faulty_ids: Sequence[str] = (),
    max_partitions: int, max_replica: int,
) -> str | None:
    """Why a ``getShuffleAssignments`` is unacceptable (see the module docstring); None if it is fine.

    ``per_range`` and ``replica`` are as the adapter decoded them (proto 0 = not set = 1)."""
    if app_id:
        try:
            check_app_id(app_id, "applicationId")
        except ProtocolError as e:
            return str(e)
    try:
        check_shuffle_id(shuffle_id)
    except ProtocolError as e:
        return str(e)
    if not 0 <= partition_num <= max_partitions:
        return (f"partitionNum: {partition_num} is outside 0..{max_partitions} "
                f"(the coordinator's max_partitions_per_assignment)")
    if not 1 <= per_range <= max_partitions:
        return (f"partitionNumPerRange: {per_range} is outside 1..{max_partitions} "
                f"(the coordinator's max_partitions_per_assignment)")
    if not 1 <= replica <= max_replica:
        return f"dataReplica: {replica} is outside 1..{max_replica} (the coordinator's max_data_replica)"
    if len(require_tags) > MAX_TAGS:
        return f"requireTags: {len(require_tags)} tags, more than {MAX_TAGS}"
    for i, tag in enumerate(require_tags):
        problem = _text_problem(f"requireTags[{i}]", tag, MAX_TAG_CHARS, empty_ok=False)
        if problem is not None:
            return problem
    if len(faulty_ids) > MAX_FAULTY_IDS:
        return f"faultyServerIds: {len(faulty_ids)} ids, more than {MAX_FAULTY_IDS}"
    for i, sid in enumerate(faulty_ids):
        if len(sid) > MAX_ID_CHARS:
            return f"faultyServerIds[{i}]: {len(sid)} characters, more than {MAX_ID_CHARS}"
    return None


# ----------------------------------------------------------------------------- the applications filter

MAX_FILTER_APPS = 10_000
MAX_PAGE_SIZE = 1000
MAX_APP_ID_REGEX_CHARS = 1024
REGEX_MAX_MEM = 1 << 20  # bytes RE2 may use for one compiled appIdRegex
_NO_END = 1 << 62


class InvalidFilter(ValueError):
    """An ``ApplicationRequest`` the applications filter refuses; the message says why."""


def _regex_options() -> re2.Options:
    options = re2.Options()
    options.max_mem = REGEX_MAX_MEM
    options.log_errors = False  # a refusal is answered, not printed on the daemon's stderr
    return options


def _epoch_ms(body: dict[str, object], key: str, default: int) -> int:
    value = body.get(key)
    if value is None or value == "" or value == 0:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidFilter(f"{key}: expected epoch milliseconds, got {type(value).__name__}")
    if isinstance(value, str) and not (value.isascii() and value.lstrip("-").isdigit() and len(value) <= 20):
        raise InvalidFilter(f"{key}: {show(value)} is not epoch milliseconds")
    return int(value)


def _small_int(body: dict[str, object], key: str, default: int, high: int) -> int:
    value = body.get(key, default)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        shown = show(value) if isinstance(value, (str, int)) else type(value).__name__
        raise InvalidFilter(f"{key}: {shown} is not an integer in 1..{high}")
    return value


@dataclass(frozen=True, slots=True)
class AppFilter:
    """What ``POST /api/server/applications`` asks for; ``matches(app_id, last_heartbeat_ms)`` is cheap."""

    app_ids: frozenset[str]
    regex: re2._Regexp | None
    start_ms: int
    end_ms: int
    page_size: int
    page: int

    @classmethod
    def parse(cls, body: object) -> AppFilter:
        """Upstream's ``ApplicationRequest`` JSON object; raises ``InvalidFilter``."""
        if not isinstance(body, dict):
            raise InvalidFilter("ApplicationRequest Is not null")  # upstream's words for a missing body
        wanted = body.get("applications") or ()
        if not isinstance(wanted, (list, tuple)):
            raise InvalidFilter("applications: expected a list of application ids")
        if len(wanted) > MAX_FILTER_APPS:
            raise InvalidFilter(f"applications: {len(wanted)} ids, more than {MAX_FILTER_APPS}")
        try:
            app_ids = frozenset(check_app_id(a, "applications[]") for a in wanted)
        except ProtocolError as e:
            raise InvalidFilter(str(e)) from None
        pattern = body.get("appIdRegex") or None
        regex = None
        if pattern is not None:
            if not isinstance(pattern, str):
                raise InvalidFilter(f"appIdRegex: expected a string, got {type(pattern).__name__}")
            if len(pattern) > MAX_APP_ID_REGEX_CHARS:
                raise InvalidFilter(f"appIdRegex: {len(pattern)} characters, more than {MAX_APP_ID_REGEX_CHARS}")
            try:
                regex = re2.compile(pattern, _regex_options())
            except re2.error as e:
                detail = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
                raise InvalidFilter(f"appIdRegex: {show(pattern)} is not a regular expression RE2 accepts "
                                    f"(no back references or look-arounds; at most {REGEX_MAX_MEM} bytes "
                                    f"compiled): {detail[:200]}") from None
        start = _epoch_ms(body, "heartBeatStartTime", 0)
        end = _epoch_ms(body, "heartBeatEndTime", _NO_END)
        page_size = _small_int(body, "pageSize", 10, MAX_PAGE_SIZE)
        page = _small_int(body, "currentPage", 1, 1 << 31)
        return cls(app_ids=app_ids, regex=regex, start_ms=start, end_ms=end, page_size=page_size, page=page)

    def matches(self, app_id: str, last_heartbeat_ms: int) -> bool:
        if self.app_ids and app_id not in self.app_ids:
            return False
        if not self.start_ms <= last_heartbeat_ms <= self.end_ms:
            return False
        return self.regex is None or self.regex.fullmatch(app_id) is not None


# ----------------------------------------------------------------------------- where it comes from


def peer_host(peer: str | None) -> str | None:
    """The IP in a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``); None for others (``unix:``)."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        host = rest.rpartition(":")[0]
    elif kind == "ipv6":
        host = rest.rpartition(":")[0].strip("[]")
    else:
        return None
    addr = parse_ip(host)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # an IPv4 client of a dual-stack listener
    return str(addr) if addr is not None else None


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def _inside(addr: str, networks: Sequence[Network]) -> bool:
    ip = parse_ip(addr)
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == n.version and ip in n for n in networks)


def source_problem(peer: str | None, advertised_ip: str, networks: Sequence[Network]) -> str | None:
    """Why a heartbeat from ``peer`` advertising ``advertised_ip`` is outside ``networks`` (empty = any)."""
    if not networks:
        return None
    if peer is None or not _inside(peer, networks):
        return f"source {peer or 'unknown'} is not in [server] allowed_networks"
    if not _inside(advertised_ip, networks):
        return f"advertised address {advertised_ip} is not in [server] allowed_networks"
    return None


# ----------------------------------------------------------------------------- log volume


class RepeatFilter:
    """Says which occurrences of a repeated event deserve a log line: the 1st, 10th, 100th, ...

    Remembers at most ``size`` distinct keys (the oldest is forgotten first), so a flood of
    distinct bad heartbeats costs bounded memory.
    """

    def __init__(self, size: int = 1024):
        self.size = size
        self._seen: OrderedDict[object, int] = OrderedDict()

    def hit(self, key: object) -> int | None:
        """Count ``key``; returns the count when it should be logged, else None."""
        n = self._seen.pop(key, 0) + 1
        self._seen[key] = n
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return n if _is_power_of_ten(n) else None


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1
