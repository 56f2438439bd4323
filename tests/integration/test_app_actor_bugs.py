"""A bug in an AppActor is a crash its supervisor handles, never a refusal that hides it.

Only ``RiffleError`` s are the AppActor's expected errors (bad input is refused where the service
layer parses the request); anything else, a ``TypeError`` included, crashes the actor: the asker
gets it (INTERNAL_ERROR on the wire), the AppManager purges the app (memory, tickets and files
released; later calls get NO_REGISTER, so Spark retries the stage), and the server goes on serving
every other app. A real in-process ShuffleServer over real gRPC; the bug is planted with monkeypatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from riffle_actors import service as service_module
from riffle_actors.actors.app import AppActor
from riffle_actors.actors.app_manager import GetHistory
from riffle_actors.errors import InvalidRequestError, StatusCode, to_status
from tests.helpers import app_dirs, poll_until
from tests.helpers.client import UniffleClient, UniffleError, make_blocks

pytestmark = pytest.mark.asyncio

BUGGY, OTHER = "app_buggy", "app_other"


@dataclass(frozen=True, slots=True)
class Forgotten:
    """A message the AppActor's ``receive`` does not know (a sender's bug)."""


async def two_apps(srv, client: UniffleClient) -> int:
    """Both apps registered with 3 blocks in memory each; the bytes one app holds."""
    for app in (BUGGY, OTHER):
        await client.register_shuffle(app, 0, range(4))
        await client.send_blocks(app, 0, make_blocks(1, 7, 3, 1000))
    assert srv.budget.used % 2 == 0 and srv.budget.used > 0
    return srv.budget.used // 2


async def purged(srv, other_bytes: int) -> None:
    """The buggy app is gone (memory, tickets, files), the other app's memory untouched."""
    await poll_until(lambda: BUGGY not in srv.directory and srv.budget.used == other_bytes
                     and srv.budget.allocated == 0 and not app_dirs(srv, BUGGY, with_data=False))


async def the_other_app_still_works(srv, client: UniffleClient) -> None:
    assert srv.escalated is None  # the server's root supervisor never saw it
    apps_supervisor = srv.system.get("apps")
    assert apps_supervisor is not None and apps_supervisor.is_alive  # a temporary child's crash is not a restart
    await client.heartbeat(OTHER)
    await client.send_blocks(OTHER, 0, make_blocks(2, 8, 2, 500))
    got = await client.read_partition(OTHER, 0, 2, None, check_complete=False)
    assert len(got) == 2
    with pytest.raises(UniffleError) as e:
        await client.heartbeat(BUGGY)
    assert e.value.status == StatusCode.NO_REGISTER


async def test_a_message_the_app_actor_does_not_know_crashes_it_and_is_an_internal_error(server, client):
    other_bytes = await two_apps(server, client)
    with pytest.raises(TypeError) as e:  # was turned into InvalidRequestError: the bug was hidden
        await server.directory[BUGGY].ask(Forgotten())
    assert not isinstance(e.value, InvalidRequestError)
    assert to_status(e.value)[0] == StatusCode.INTERNAL_ERROR
    await purged(server, other_bytes)
    history = await server.app_manager.ask(GetHistory())
    assert history[-1]["app_id"] == BUGGY and "app actor crashed: TypeError" in history[-1]["reason"]
    await the_other_app_still_works(server, client)


async def test_a_service_sending_a_message_the_actor_forgot_gets_internal_error_on_the_wire(
        server, client, monkeypatch):
    other_bytes = await two_apps(server, client)
    monkeypatch.setattr(service_module, "Heartbeat", Forgotten)  # the service's bug: a message nobody handles
    with pytest.raises(UniffleError) as e:
        await client.heartbeat(BUGGY)
    assert e.value.status == StatusCode.INTERNAL_ERROR, e.value  # was INVALID_REQUEST
    assert "TypeError" in str(e.value)
    await purged(server, other_bytes)
    monkeypatch.undo()
    await the_other_app_still_works(server, client)


async def test_a_type_error_in_the_app_actors_supervision_crashes_it_instead_of_being_swallowed(
        server, client, monkeypatch):
    other_bytes = await two_apps(server, client)

    async def buggy_child_exited(self, msg):
        raise TypeError("a bug in the handling of a partition actor's exit")

    monkeypatch.setattr(AppActor, "_child_exited", buggy_child_exited)
    # the shuffle's partition actors stop after the purge: their exits reach the bug (on a tell: an
    # InvalidRequestError there was logged at debug level and the app lived on with the bug)
    await client.register_shuffle(BUGGY, 1, range(2))
    await client.send_blocks(BUGGY, 1, make_blocks(0, 9, 1, 100))
    await client.unregister_shuffle(BUGGY, 1)
    await purged(server, other_bytes)
    history = await server.app_manager.ask(GetHistory())
    assert history[-1]["app_id"] == BUGGY and "a bug in the handling" in history[-1]["reason"]
    monkeypatch.undo()
    await the_other_app_still_works(server, client)


async def test_a_send_its_app_actor_crashes_on_gives_the_whole_ticket_back(server, client, monkeypatch):
    """The ticket is taken and the append handed on in one ask (the MemoryManager forwards it to the app's
    actor): when the actor crashes on it, the service gives back all of the reservation no partition used."""
    other_bytes = await two_apps(server, client)

    def buggy_append(self, msg):
        raise TypeError("a bug in the append")

    monkeypatch.setattr(AppActor, "_append", buggy_append)
    blocks = make_blocks(1, 10, 2, 4000)
    ticket = await client.require_buffer(BUGGY, 0, client.send_require_size(BUGGY, 0, blocks), [1])
    assert server.budget.allocated > 0
    resp = await client.stub.sendShuffleData(client.send_request(BUGGY, 0, ticket, blocks))
    assert resp.status == StatusCode.INTERNAL_ERROR and "a bug in the append" in resp.retMsg, resp
    await purged(server, other_bytes)  # allocated back to 0: the taken ticket's bytes went back
    monkeypatch.undo()
    await the_other_app_still_works(server, client)
