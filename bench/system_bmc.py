"""The coupled-system bounded model check alone, for before/after CPU figures (issue: the full
``python -m calculet.verify`` spent 407 of its 443 s of CPU in RequestLaneSystem's BMC).

Prints one JSON line per system: its verdict, detail and CPU seconds (``time.process_time``: the
solver's own work, not the machine's load). Run a base tree beside it with
``PYTHONPATH=<worktree> .venv/bin/python bench/system_bmc.py`` and interleave rounds; only ratios
within one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import time

from calculet.invariants.system_bmc import check_system_bmc
from calculet.verify import SYSTEM_DEPTH, SYSTEMS


def main() -> None:
    names = [x.definition.name for x in SYSTEMS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", action="append", choices=names, default=[],
                        help="only this coupled system (repeatable; default RequestLaneSystem)")
    parser.add_argument("--depth", type=int, default=SYSTEM_DEPTH)
    args = parser.parse_args()
    for system in SYSTEMS:
        sd = system.definition
        if sd.name not in (args.system or ["RequestLaneSystem"]):
            continue
        size = sd.bmc_size or (3, 3)
        depth = min(args.depth, getattr(system, "bmc_depth", args.depth))
        start = time.process_time()
        result = check_system_bmc(sd, *size, depth)
        print(json.dumps({"system": sd.name, "size": size, "depth": depth, "ok": result.ok,
                          "detail": result.detail, "cpu_s": round(time.process_time() - start, 2)}), flush=True)


if __name__ == "__main__":
    main()
