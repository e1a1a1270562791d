"""bench/host_path.py's profile breakdown (issue #20: where the server's CPU goes, by part of the host path)."""

from __future__ import annotations

import cProfile
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import host_path  # noqa: E402  (bench/ is a directory of scripts, not a package)

from calculet.runtime.streams.writer import StreamWriter  # noqa: E402


def test_the_breakdown_charges_own_time_to_its_part_and_sums_to_one(tmp_path: Path) -> None:
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    stream = StreamWriter()
    for token in range(2000):
        stream.token(1, 65 + token % 26)
    sorted(range(20000), key=lambda x: -x)  # a builtin called from here: charged to this file's part ("other")
    profile.disable()
    out = tmp_path / "p.prof"
    profile.dump_stats(out)
    shares = dict(host_path.profile_breakdown(out))
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert shares["streams + detokeniser (runtime/streams)"] > 0.05
    assert shares.get("other", 0.0) > 0.0
    assert all(share >= 0 for share in shares.values())
