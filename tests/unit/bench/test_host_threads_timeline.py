"""bench/host_threads.py --timeline (issue #20): one stream's completions cut into phases from the launcher's marks.

Mutants caught: a request's arrival taken at its last read (the body) instead of its first (the head is short by
the client's gap between them); the close's start instead of its end as the start of ``to client``; the first and
last completions (a warm-up, and one without a next request) counted; a token's wait measured to the frames before
it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import host_threads  # noqa: E402  (bench/ is a directory of scripts, not a package)

ONE = [("read", 0, 100), ("read", 300, 310), ("post", 500, 520), ("submit", 560, 800), ("turn", 850, 2000),
       ("token", 900, 905), ("token", 1000, 1005), ("frames", 1100, 1130), ("send", 1130, 1150),
       ("close", 1500, 1510), ("frames", 2100, 2120), ("send", 2200, 2300)]
"""One completion's marks (label, start ns, end ns), from its first read; the next one's first read is 10 µs on."""


def test_phases_of_the_completions_between_the_first_and_the_last() -> None:
    events = [(label, t0 + k * 10_000, t1 + k * 10_000) for k in range(4) for label, t0, t1 in ONE]
    rows, waits = host_threads.completion_phases(list(reversed(events)))  # any order: sorted by start
    assert len(rows) == 2  # the first (warm-up) and the last (no next request) left out
    expected = {"head": 0.5, "hand-off": 0.04, "submit": 0.24, "first token": 0.1, "tokens": 0.61,
                "to client": 0.79, "client": 7.7, "total": 10.0, "in turns": 1.15, "wake-ups": 2, "turns": 1}
    for row in rows:
        assert row.keys() == expected.keys()
        for key, value in expected.items():
            assert abs(row[key] - value) < 1e-9, (key, row[key])
    assert [round(w, 3) for w in waits] == [0.195, 0.095] * 2
