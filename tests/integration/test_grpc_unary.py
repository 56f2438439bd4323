"""The heartbeat's HTTP/2 gRPC client (``transport.grpc_unary``) against real grpc.aio servers.

A generic grpc.aio server with raw-bytes handlers (port 0, loopback) answers each case: a message,
a status, a long answer over several flow-control windows, a request larger than the first window,
an answer over the client's bound, no answer before the deadline, an unknown method, a server that
goes away and comes back. A real heartbeat to a real coordinator over this client, field by field,
is ``tests/integration/test_coordinator.py``'s (``GrpcCoordinatorLink``).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from riffle_actors.transport.grpc_unary import UnaryCallError, UnaryChannel

SERVICE = "test.Echo"


class Handlers:
    def __init__(self) -> None:
        self.never = asyncio.Event()
        self.calls = 0

    async def echo(self, request: bytes, context) -> bytes:
        self.calls += 1
        return request

    async def big(self, request: bytes, context) -> bytes:
        return b"x" * int(request.decode())

    async def refuse(self, request: bytes, context) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no heartbeats from you: é%")
        return b""

    async def hang(self, request: bytes, context) -> bytes:
        await self.never.wait()
        return b""


async def start_server(handlers: Handlers, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024),
                                      ("grpc.max_send_message_length", 64 * 1024 * 1024)])
    methods = {name: grpc.unary_unary_rpc_method_handler(getattr(handlers, name))
               for name in ("echo", "big", "refuse", "hang")}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


@pytest.fixture
async def served():
    handlers = Handlers()
    server, port = await start_server(handlers)
    channel = UnaryChannel(f"127.0.0.1:{port}", max_response_bytes=1024 * 1024)
    try:
        yield handlers, channel, port
    finally:
        handlers.never.set()
        await channel.close()
        await server.stop(None)


async def test_a_message_comes_back_and_one_connection_serves_many_calls(served):
    handlers, channel, _ = served
    for i in range(20):
        assert await channel.call(f"/{SERVICE}/echo", f"hello {i}".encode(), 5) == f"hello {i}".encode()
    assert await channel.call(f"/{SERVICE}/echo", b"", 5) == b""  # an empty message is a message
    assert handlers.calls == 21 and channel.connects == 1


async def test_requests_and_answers_larger_than_a_flow_control_window(served):
    _, channel, _ = served
    request = bytes(range(256)) * 2048  # 512 KiB: eight times HTTP/2's first window
    assert await channel.call(f"/{SERVICE}/echo", request, 10) == request
    assert await channel.call(f"/{SERVICE}/big", b"900000", 10) == b"x" * 900_000


async def test_an_answer_over_the_bound_is_refused_and_the_channel_goes_on(served):
    _, channel, _ = served
    with pytest.raises(UnaryCallError) as err:
        await channel.call(f"/{SERVICE}/big", str(2 * 1024 * 1024).encode(), 10)
    assert err.value.code == "RESOURCE_EXHAUSTED"
    assert await channel.call(f"/{SERVICE}/echo", b"still here", 5) == b"still here"


async def test_the_server_status_and_message_reach_the_caller(served):
    _, channel, _ = served
    with pytest.raises(UnaryCallError) as err:
        await channel.call(f"/{SERVICE}/refuse", b"", 5)
    assert (err.value.code, err.value.details) == ("PERMISSION_DENIED", "no heartbeats from you: é%")
    with pytest.raises(UnaryCallError) as err:
        await channel.call(f"/{SERVICE}/nosuch", b"", 5)
    assert err.value.code == "UNIMPLEMENTED"


async def test_no_answer_before_the_deadline_is_deadline_exceeded_and_the_next_call_works(served):
    _, channel, _ = served
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(UnaryCallError) as err:
        await channel.call(f"/{SERVICE}/hang", b"", 0.3)
    assert err.value.code == "DEADLINE_EXCEEDED" and loop.time() - started < 5
    assert await channel.call(f"/{SERVICE}/echo", b"after", 5) == b"after"
    assert channel.connects == 1


async def test_a_server_that_goes_away_is_unavailable_and_a_new_one_is_reconnected_to():
    handlers = Handlers()
    server, port = await start_server(handlers)
    channel = UnaryChannel(f"127.0.0.1:{port}")
    try:
        assert await channel.call(f"/{SERVICE}/echo", b"one", 5) == b"one"
        await server.stop(None)
        with pytest.raises(UnaryCallError) as err:
            await channel.call(f"/{SERVICE}/echo", b"two", 5)
        assert err.value.code == "UNAVAILABLE"
        server, again = await start_server(handlers, port)
        assert again == port
        assert await channel.call(f"/{SERVICE}/echo", b"three", 5) == b"three"
        assert channel.connects == 2
    finally:
        handlers.never.set()
        await channel.close()
        await server.stop(None)


async def test_nobody_listening_is_unavailable_with_the_address():
    handlers = Handlers()
    server, port = await start_server(handlers)
    await server.stop(None)
    channel = UnaryChannel(f"127.0.0.1:{port}")
    with pytest.raises(UnaryCallError) as err:
        await channel.call(f"/{SERVICE}/echo", b"", 2)
    assert err.value.code == "UNAVAILABLE" and f"127.0.0.1:{port}" in err.value.details
    await channel.close()


@pytest.mark.parametrize("target", ["nocolon", "host:", ":80"])
def test_a_target_must_be_host_and_port(target):
    with pytest.raises(ValueError, match="host:port"):
        UnaryChannel(target)


def test_calls_work_on_the_servers_own_event_loop_uvloop():
    """The server runs on uvloop, whose transports are not ``asyncio.Transport`` subclasses."""
    import uvloop

    async def main() -> bytes:
        handlers = Handlers()
        server, port = await start_server(handlers)
        channel = UnaryChannel(f"127.0.0.1:{port}")
        try:
            return await channel.call(f"/{SERVICE}/echo", b"on uvloop", 5)
        finally:
            await channel.close()
            await server.stop(None)

    assert uvloop.run(main()) == b"on uvloop"
