"""The ranks tab's `f`: names typed into a small input screen go to the highlighted rank's agent as one
SetFunctionTiming request (`-name` stops), and the rank's answer comes back as a notification."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from console.conftest import wait_for_first_snapshot
from tuiprof.client.sources import ReplaySource
from tuiprof.model.events import SnapshotReceived
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.function_switch import FunctionSwitchScreen
from tuiprof.tui.screens.host import HostScreen


class SwitchingAgent(pb_grpc.AgentServicer):
    """An agent that answers SetFunctionTiming (the rank could not find one of the names) and keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[pb.SetFunctionTimingRequest] = []

    async def SetFunctionTiming(self, request: pb.SetFunctionTimingRequest,
                                context: grpc.aio.ServicerContext) -> pb.FunctionTimingOutcome:
        self.requests.append(request)
        return pb.FunctionTimingOutcome(serial=7, acknowledged=True,
                                        problems=["cannot time m:nope: m has no attribute 'nope'"])


@pytest.fixture
async def switching_agent() -> AsyncIterator[tuple[str, SwitchingAgent]]:
    server = grpc.aio.server()
    agent = SwitchingAgent()
    pb_grpc.add_AgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", agent
    await server.stop(None)


async def test_the_f_key_sends_the_names_for_the_highlighted_rank_and_shows_the_answer(switching_agent) -> None:
    address, agent = switching_agent
    snapshot = pb.HostSnapshot(hostname="n1", sequence=1, collectors=[pb.CollectorStatus(name="ranks", available=True)])
    snapshot.ranks.add(pid=100, rank=0, state=pb.RANK_STATE_RUNNING)
    snapshot.ranks.add(pid=101, rank=1, state=pb.RANK_STATE_RUNNING)
    app = TuiprofApp(ReplaySource([SnapshotReceived(address, 1.0, snapshot)], speed=0))
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await wait_for_first_snapshot(app, pilot)
        app.show_host(address, tab="gpus")
        await pilot.pause(0.1)
        screen = app.screen
        assert isinstance(screen, HostScreen)
        await pilot.press("f")  # only on the ranks tab
        assert not isinstance(app.screen, FunctionSwitchScreen)
        await pilot.press("4", "j", "f")
        assert isinstance(app.screen, FunctionSwitchScreen)
        await pilot.press(*"m@work,", "space", *"m@nope -torch@cuda@synchronize", "enter")
        for _ in range(50):
            messages = [n.message for n in app._notifications]
            if messages:
                break
            await pilot.pause(0.1)
        assert [(r.pid, list(r.start), list(r.stop)) for r in agent.requests] == [
            (101, ["m@work", "m@nope"], ["torch@cuda@synchronize"])]
        assert messages == ["start m@work, start m@nope, stop torch@cuda@synchronize: applied, except:\n"
                            "cannot time m:nope: m has no attribute 'nope'"]
        # in the footer and the help screen, which read the bindings
        assert screen.active_bindings["f"].binding.description == "Time functions"
