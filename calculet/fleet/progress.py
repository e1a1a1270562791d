"""A rollout on the terminal: one line per step as it ends, then a table of the boards (``rich``).

Why apart from the rollout: the rollout is driven by tests and the benchmark without a terminal;
an operator running ``calculet fleet rollout`` must see each step as it happens (which board is
draining, how long the load and golden check took, which step failed with what answer) and a
summary of what every board serves at the end. The JSON record says the same for machines.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from calculet.fleet.record import RolloutRecord, StepRecord

_ACTIONS = {"before": "read what it serves", "drain": "drain in HAProxy", "wait_idle": "wait: no connection, no request",
            "load": "load + golden check (§11)", "check": "check: new package Ready", "ready": "ready in HAProxy",
            "wait_up": "wait: UP in HAProxy", "restore_check": "check: old package Ready again",
            "rollback": "roll back (§11 step 11)", "rollback_check": "check: old package Ready again"}


class ConsoleProgress:
    """An observer for :class:`~calculet.fleet.rollout.Rollout` that prints each step."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)

    def __call__(self, step: StepRecord) -> None:
        mark = "[green]✓[/green]" if step.ok else "[red]✗[/red]"
        detail = f" [dim]{step.detail}[/dim]" if step.detail else ""
        self.console.print(f"{mark} {step.started_s:7.2f}s  [bold]{step.board}[/bold]  "
                           f"{_ACTIONS.get(step.action, step.action)} ({step.duration_s:.2f}s){detail}")

    def summary(self, record: RolloutRecord) -> None:
        table = Table(title=f"rollout of {record.package} on backend {record.backend}: {record.outcome}")
        for column in ("board", "before", "after", "changed", "rolled back"):
            table.add_column(column)
        for board in record.boards:
            table.add_row(board.name, _served(board.before), _served(board.after), str(board.changed),
                          str(board.rolled_back))
        self.console.print(table)
        if record.error:
            self.console.print(f"[red]stopped at {record.failed_board}:[/red] {record.error}")


def _served(served: object) -> str:
    if served is None:
        return "-"
    generation = getattr(served, "generation", "?")
    sha = str(getattr(served, "package_sha256", ""))[:12]
    return f"g{generation} {sha}"


__all__ = ["ConsoleProgress"]
