"""What a rollout did, step by step: the JSON record (§10–§12 across boards).

Why a record of its own: an operator (or a test, or ``bench/fleet.py``) must be able to tell after
the fact which boards changed, which were rolled back, what each board served before and after,
and which step failed with what answer — without reading terminal output. Plain dataclasses; the
JSON shape is ``calculet-fleet-rollout/v1``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calculet.fleet.board_admin import Served

RECORD_KIND = "calculet-fleet-rollout/v1"
OUTCOMES = ("completed", "stopped_rolled_back", "stopped", "rollback_failed")
"""completed: every board serves the new package; stopped_rolled_back: a step failed and every
changed board serves the old package again; stopped: a step failed and nothing had changed (or
--no-rollback); rollback_failed: a board could not be put back — the record says which."""


@dataclass
class StepRecord:
    board: str
    action: str
    """drain, wait_idle, load, rollback, ready, wait_up, restore_check."""
    ok: bool
    started_s: float
    duration_s: float
    detail: str = ""


@dataclass
class BoardRecord:
    name: str
    before: Served | None = None
    after: Served | None = None
    changed: bool = False
    rolled_back: bool = False


@dataclass
class RolloutRecord:
    backend: str
    alias: str
    package: str
    started_at: str
    boards: list[BoardRecord]
    steps: list[StepRecord] = field(default_factory=list)
    outcome: str = "completed"
    failed_board: str | None = None
    error: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == "completed"

    def board(self, name: str) -> BoardRecord:
        return next(b for b in self.boards if b.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": RECORD_KIND, **asdict(self)}

    def write(self, path: str | Path) -> Path:
        out = Path(path)
        out.write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")
        return out


__all__ = ["BoardRecord", "OUTCOMES", "RECORD_KIND", "RolloutRecord", "StepRecord"]
