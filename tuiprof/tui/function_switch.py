"""The ranks tab's `f`: which functions to start or stop timing in the highlighted rank."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class FunctionSwitchScreen(ModalScreen[str]):
    """Names to start timing, ``-name`` to stop; Enter sends them, Esc closes with nothing."""

    BINDINGS = [Binding("escape", "dismiss('')", "Cancel")]
    DEFAULT_CSS = """
    FunctionSwitchScreen { align: center middle; }
    FunctionSwitchScreen > Vertical {
        width: 80; height: auto; border: round $primary; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, rank: str) -> None:
        super().__init__()
        self.rank = rank

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Time functions in {self.rank}: module@function or module:Class.function, "
                        "-name stops one; Enter sends, Esc cancels", markup=False)
            yield Input(placeholder="__main__@train_step, -torch@cuda@synchronize", id="function-names")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())
