"""Settings that stay: theme, sort, filter, interval, hidden columns and the plots' window saved
under $XDG_CONFIG_HOME/tuiprof and loaded at start."""

from __future__ import annotations

import pathlib

import pytest

from console.recordings import GPU_FIXTURE
from tuiprof.cli import build_parser
from tuiprof.client.settings import SettingsFile
from tuiprof.client.sources import ReplaySource
from tuiprof.errors import BadInputError
from tuiprof.model import record
from tuiprof.model.settings import Settings
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.cluster import ClusterScreen


@pytest.fixture
def config_home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


def _app() -> TuiprofApp:
    return TuiprofApp(ReplaySource(list(record.read(GPU_FIXTURE)), speed=0), settings_file=SettingsFile())


def _warnings(app: TuiprofApp) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "warning"]


async def test_sort_theme_and_filter_come_back_in_the_next_console(config_home: pathlib.Path) -> None:
    first = _app()
    async with first.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.1)
        assert first.theme == "textual-dark"
        await pilot.press("full_stop", "I", "slash", *"util<10", "enter", "T")
        await pilot.pause(0.1)
        await pilot.press("q")
    saved = config_home / "tuiprof" / "settings.toml"
    assert saved.is_file()
    assert [p.name for p in saved.parent.iterdir()] == ["settings.toml"]  # the temporary file was renamed

    second = _app()
    async with second.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.1)
        screen = second.screen
        assert isinstance(screen, ClusterScreen)
        assert (screen.sort_column, screen.reverse, screen.host_filter.text) == (1, True, "util<10")
        assert second.theme == "textual-light"
        assert _warnings(second) == []


async def test_hidden_columns_and_the_plot_window_come_back_in_the_next_console(config_home: pathlib.Path) -> None:
    from textual.widgets import SelectionList

    from tuiprof.tui.host_grid import HostGrid
    from tuiprof.tui.tables import FittedTable

    first = _app()
    async with first.run_test(size=(200, 50)) as pilot:
        await pilot.pause(0.1)
        await pilot.press("C")
        first.screen.query_one(SelectionList).deselect("Power")
        await pilot.press("escape", "enter", "C")
        first.screen.query_one(SelectionList).deselect("Name")
        await pilot.press("escape", "z")
        await pilot.pause(0.1)
    assert 'hidden_columns = ["cluster.Power", "gpus.Name"]' in (config_home / "tuiprof" / "settings.toml").read_text()

    second = _app()
    async with second.run_test(size=(200, 50)) as pilot:
        await pilot.pause(0.1)
        assert "power" not in [c.key for c in second.screen.query_one("#hosts", HostGrid).shown_columns]
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert "Name" not in second.screen.query_one("#gpus-table", FittedTable).shown_labels
        assert second.settings.history_window == "15 min" and _warnings(second) == []


@pytest.mark.parametrize("text, why", [
    ("theme = [", "Invalid value"),
    ("reverse = 'yes'", "'reverse' = 'yes': expected a bool"),
    ("colour = 'red'", "unknown key 'colour'"),
    ("hidden_columns = 'cluster.CPU'", "'hidden_columns' = 'cluster.CPU': expected a list"),
    ("hidden_columns = [1]", "'hidden_columns' = [1]: expected a list of strings"),
])
async def test_a_bad_settings_file_gives_one_warning_and_the_defaults(
        config_home: pathlib.Path, text: str, why: str) -> None:
    path = config_home / "tuiprof" / "settings.toml"
    path.parent.mkdir()
    path.write_text(text + "\n")
    app = _app()
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.1)
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        assert (screen.sort_column, screen.reverse, screen.host_filter.text) == (0, False, "")
        [warning] = _warnings(app)
        assert warning.startswith(f"settings file {path} not used (") and why in warning


async def test_a_saved_filter_the_console_cannot_parse_is_named_and_dropped(config_home: pathlib.Path) -> None:
    SettingsFile().save(Settings(filter="util<<", sort="nosuch"))
    app = _app()
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.1)
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        assert (screen.sort_column, screen.host_filter.text) == (0, "")
        [warning] = _warnings(app)
        assert "saved sort column 'nosuch' not known" in warning and "saved filter not used" in warning


def test_every_setting_round_trips_and_a_missing_file_is_the_defaults(config_home: pathlib.Path) -> None:
    store = SettingsFile()
    assert store.path == config_home / "tuiprof" / "settings.toml"
    assert store.load() == (Settings(), None)
    changed = Settings(theme="nord", sort="util", reverse=True, filter='host "a\\b"', interval_seconds=2.5,
                       hidden_columns=("cluster.Trend", 'gpus.Mem "clk"'), history_window="all")
    assert all(getattr(changed, f) != getattr(Settings(), f) for f in Settings.__dataclass_fields__)
    assert store.save(changed) is None
    assert store.load() == (changed, None)


async def test_an_unknown_plot_window_is_one_warning_and_the_default(config_home: pathlib.Path) -> None:
    SettingsFile().save(Settings(history_window="2 days"))
    app = _app()
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.1)
        assert app.settings.history_window == "5 min"
        assert _warnings(app) == ["unknown history window '2 days' in the settings; using 5 min"]


def test_an_unwritable_config_dir_is_one_line_not_a_traceback(config_home: pathlib.Path) -> None:
    (config_home / "tuiprof").write_text("a file where the directory should be")
    failed = SettingsFile().save(Settings())
    assert failed is not None and failed.startswith("cannot save the settings to ")


def test_the_console_takes_the_saved_interval_unless_given_one(config_home: pathlib.Path) -> None:
    """Up to the terminal check (pytest's stdout is none): the interval the live source would ask for."""
    SettingsFile().save(Settings(interval_seconds=2.5))
    for argv, expected in ((["connect", "127.0.0.1"], 2.5), (["connect", "127.0.0.1", "--interval", "0.5"], 0.5)):
        args = build_parser().parse_args(argv)
        with pytest.raises(BadInputError, match="not a terminal"):
            args.func(args)
        assert args.interval == expected


def test_replay_neither_loads_nor_saves_the_users_settings(config_home: pathlib.Path, monkeypatch) -> None:
    """A recording looks the same to whoever replays it, and replaying one leaves the live console's settings."""
    import asyncio
    import sys

    saved = Settings(theme="textual-light", hidden_columns=("cluster.CPU",), history_window="all")
    SettingsFile().save(saved)
    path = config_home / "tuiprof" / "settings.toml"
    before = path.read_text()
    seen: dict[str, object] = {}

    def run_headless(app: TuiprofApp) -> None:  # `tuiprof replay`'s app, driven as a user would
        async def drive() -> None:
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.pause(0.1)
                seen.update(theme=app.theme, settings=app.settings)
                await pilot.press("T", "enter", "z")
                await pilot.pause(0.1)
        asyncio.run(drive())

    monkeypatch.setattr(TuiprofApp, "run", run_headless)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    args = build_parser().parse_args(["replay", str(GPU_FIXTURE), "--speed", "0"])
    assert args.func(args) == 0
    assert seen == {"theme": "textual-dark", "settings": Settings()}
    assert path.read_text() == before and [p.name for p in path.parent.iterdir()] == ["settings.toml"]


async def test_the_lower_tables_columns_are_chosen_with_c_and_come_back_in_the_next_console(
        config_home: pathlib.Path) -> None:
    """The GPU's processes (GPUs tab) and the rank's ops (Ranks tab) have their own columns; `c` chooses them."""
    from textual.widgets import SelectionList

    from tuiprof.tui.columns import ColumnsScreen
    from tuiprof.tui.screens.host import HostScreen
    from tuiprof.tui.tables import FittedTable

    first = _app()
    async with first.run_test(size=(200, 50)) as pilot:
        await pilot.pause(0.1)
        await pilot.press("enter", "c")
        assert isinstance(first.screen, ColumnsScreen) and first.screen.title_text == "the GPU's processes"
        choices = first.screen.query_one(SelectionList)
        assert set(choices.selected) == {
            "User", "Process", "GPU memory", "Share", "SM", "CPU", "Host mem", "Time", "Rank", "Job", "Where", "Command"}
        choices.deselect("User")
        choices.deselect("Command")
        await pilot.press("escape")
        host = first.screen
        assert isinstance(host, HostScreen)
        assert host.query_one("#gpu-procs-table", FittedTable).shown_labels == [
            "PID", "Process", "GPU memory", "Share", "SM", "CPU", "Host mem", "Time", "Rank", "Job", "Where"]
        assert host.query_one("#gpus-table", FittedTable).shown_labels[:2] == ["GPU", "Name"]  # its own are kept
        await pilot.press("4", "c")
        assert isinstance(first.screen, ColumnsScreen) and first.screen.title_text == "the rank's ops"
        first.screen.query_one(SelectionList).deselect("Detail")
        await pilot.press("escape")
        assert "Detail" not in host.query_one("#rank-ops-table", FittedTable).shown_labels
        await pilot.press("5", "c")  # the PMU tab has one table: `c` does nothing there
        assert first.screen is host
        assert "c" not in host.active_bindings
        await pilot.press("q")
    saved = (config_home / "tuiprof" / "settings.toml").read_text()
    assert 'hidden_columns = ["gpu-procs.Command", "gpu-procs.User", "rank-ops.Detail"]' in saved

    second = _app()
    async with second.run_test(size=(200, 50)) as pilot:
        await pilot.pause(0.1)
        await pilot.press("enter")
        await pilot.pause(0.1)
        host = second.screen
        assert isinstance(host, HostScreen)
        processes = host.query_one("#gpu-procs-table", FittedTable)
        assert processes.row_count and "User" not in processes.shown_labels and "Command" not in processes.shown_labels
        await pilot.press("4")
        await pilot.pause(0.1)
        ops = host.query_one("#rank-ops-table", FittedTable)
        assert ops.row_count and ops.shown_labels == ["Kind", "Op", "Calls/s", "p50", "p99", "Max", "Throughput"]
        await pilot.press("c")  # the chooser starts from the saved choice
        assert isinstance(second.screen, ColumnsScreen)
        assert "Detail" not in second.screen.query_one(SelectionList).selected
