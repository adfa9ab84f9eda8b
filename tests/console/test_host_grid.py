"""The cluster view's grid with more hosts than fit: paging, edges, sideways scroll, cursor kept."""

from __future__ import annotations

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.client.sources import ReplaySource
from tuiprof.model.events import SnapshotReceived
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.host_grid import HostGrid

HOSTS = 60


def many_hosts_app() -> TuiprofApp:
    events = []
    for index in range(HOSTS):
        message = pb.HostSnapshot(hostname=f"node-{index:03d}", sequence=1)
        message.collectors.add(name="host", available=True)
        message.cpu.idle_percent = float(index)
        events.append(SnapshotReceived(f"node-{index:03d}", 1.0, message))
    return TuiprofApp(ReplaySource(events, speed=0))


async def settled_grid(pilot) -> HostGrid:
    for _ in range(100):
        await pilot.pause(0.02)
        grid = pilot.app.screen.query_one("#hosts", HostGrid)
        if len(grid.keys) == HOSTS:
            return grid
    raise AssertionError("hosts not shown")


def visible_text(grid: HostGrid, line: int) -> str:
    return grid.render_line(line).text


async def test_paging_and_edges_keep_the_cursor_on_screen() -> None:
    app = many_hosts_app()
    async with app.run_test(size=(80, 24)) as pilot:
        grid = await settled_grid(pilot)
        grid.focus()
        await pilot.press("pagedown")
        assert grid.cursor > 10 and grid.scroll_offset.y == 0
        await pilot.press("pagedown", "pagedown")
        assert grid.scroll_offset.y > 0
        top = int(grid.scroll_offset.y)
        assert top <= grid.cursor < top + grid.size.height - 1
        await pilot.press("end")
        assert grid.cursor_key == "node-059"
        assert visible_text(grid, grid.size.height - 1).lstrip().startswith("node-059")
        await pilot.press("pageup")
        assert grid.cursor < HOSTS - 1
        await pilot.press("home")
        assert grid.cursor_key == "node-000" and grid.scroll_offset.y == 0
        assert visible_text(grid, 0).lstrip().startswith("Host")  # the header stays on top
        await pilot.press("down", "down", "up")
        assert grid.cursor_key == "node-001"
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.address == "node-001"


async def test_columns_collapse_by_priority_to_the_width() -> None:
    """80 columns: the lowest-priority columns go (trend first), the row fits without scrolling."""
    app = many_hosts_app()
    async with app.run_test(size=(80, 24)) as pilot:
        grid = await settled_grid(pilot)
        shown = [c.key for c in grid.shown_columns]
        assert shown[:2] == ["host", "state"] and "util" in shown and "step" in shown
        assert "trend" not in shown and "gpus" not in shown
        dropped = [c for c in grid.columns if c.key not in shown]
        assert max(c.priority for c in dropped) < min(c.priority for c in grid.shown_columns)
        assert grid.virtual_size.width <= grid.size.width
        await pilot.resize_terminal(200, 24)
        await pilot.pause()
        assert [c.key for c in grid.shown_columns] == [c.key for c in grid.columns]
        assert "Trend" in visible_text(grid, 0)


async def test_sideways_scroll_keeps_the_host_column_when_even_two_columns_do_not_fit() -> None:
    app = many_hosts_app()
    async with app.run_test(size=(24, 24)) as pilot:
        grid = await settled_grid(pilot)
        grid.focus()
        assert [c.key for c in grid.shown_columns] == ["host", "state"]
        before = visible_text(grid, 1)
        await pilot.press(*["right"] * 30)
        assert grid.scroll_offset.x > 0
        after = visible_text(grid, 1)
        assert after.lstrip().startswith("node-000") and after != before
        assert len(after) == grid.size.width


async def test_cursor_follows_its_host_when_the_order_changes() -> None:
    app = many_hosts_app()
    async with app.run_test(size=(80, 24)) as pilot:
        grid = await settled_grid(pilot)
        grid.focus()
        await pilot.press("down", "down")
        assert grid.cursor_key == "node-002"
        await pilot.press("full_stop", "full_stop")  # sort by CPU busy %, least busy first
        assert grid.keys[0] == "node-059" and grid.cursor_key == "node-002"
        await pilot.press("I")  # busiest first: node-000 has 0% idle
        assert grid.keys[0] == "node-000" and grid.cursor_key == "node-002"


async def test_new_data_repaints_only_the_changed_rows_on_screen() -> None:
    """A fleet updating every second must not cost a screenful of repaint per frame."""
    app = many_hosts_app()
    async with app.run_test(size=(80, 24)) as pilot:
        grid = await settled_grid(pilot)
        grid.scroll_to(y=10, animate=False)
        await pilot.pause()
        assert grid.shows("node-012") and not grid.shows("node-050")
        assert "88%" in visible_text(grid, 3)  # node-012: 12% idle
        repainted: list[int] = []
        refresh_line = grid.refresh_line
        grid.refresh_line = lambda y: (repainted.append(y), refresh_line(y))  # type: ignore[method-assign]
        for host in ("node-012", "node-050"):
            message = pb.HostSnapshot(hostname=host, sequence=2)
            message.collectors.add(name="host", available=True)
            message.cpu.idle_percent = 99.0
            app._receive(SnapshotReceived(host, 2.0, message))
        for _ in range(100):
            await pilot.pause(0.02)
            if app._rendered_version == app.cluster.version and not app._inbox:
                break
        assert repainted == [13]  # node-012's line below the header; node-050 is off screen
        assert "1%" in visible_text(grid, 3) and "88%" not in visible_text(grid, 3)
