"""``python -m calculet.conformance --device NAME [--package DIR] [--out DIR]``: run the kit, write
``conformance-NAME.md`` and ``conformance-NAME.json`` (the evidence ``device.evidence`` names).

Exit status: 0 when every check passed or could not run, 1 on any finding, 2 when the device or
package cannot be opened. ``--device`` also accepts the five broken devices of
:mod:`calculet.conformance.faulty` (``--list`` shows every name). Without ``--package`` a simulated device is tested on the simulator's
``future`` package (B1/B4/B8/B16, ping/pong); a real device needs the package it will serve.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from calculet.adapters.devices import DEFAULT_DEVICE, DeviceRegistry
from calculet.conformance import run_default
from calculet.conformance.faulty import FAULTY_DEVICES
from calculet.conformance.report import markdown
from calculet.errors import CalculetError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m calculet.conformance",
                                     description="Run the conformance kit against a device plug-in (§1, §18, §20).")
    parser.add_argument("--device", default=DEFAULT_DEVICE, help="device plug-in name (entry-point group "
                                                                 "calculet.devices; default: sim)")
    parser.add_argument("--package", type=Path, default=None, help="calbin package directory to test with")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the Markdown and JSON report")
    parser.add_argument("--timeout", type=float, default=30.0, help="longest wait for one job (s)")
    parser.add_argument("--list", action="store_true", help="list the installed device plug-ins and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    registry = DeviceRegistry()
    if args.list:
        for name in registry.names():
            plugin = registry.load(name)
            print(f"{name}\t{'simulated' if plugin.simulated else 'device'}\t{plugin.description}")
        for name, faulty in FAULTY_DEVICES.items():
            print(f"{name}\tfaulty (conformance only)\t{faulty.description}")
        return 0
    try:
        plugin = FAULTY_DEVICES.get(args.device) or registry.load(args.device)
        evidence = run_default(plugin, args.package, timeout_s=args.timeout)
    except CalculetError as exc:
        print(f"calculet.conformance: cannot run against {args.device!r}: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / f"conformance-{plugin.name}.md"
    js = args.out / f"conformance-{plugin.name}.json"
    md.write_text(markdown(evidence), encoding="utf-8")
    js.write_text(evidence.to_json(), encoding="utf-8")
    print(f"{'PASS' if evidence.passed else 'FAIL'}: {plugin.name} with {evidence.package_name} — {md}, {js}")
    for finding in evidence.findings:
        print(f"  {finding.code} ({finding.check}): {finding.detail}")
    return 0 if evidence.passed else 1


if __name__ == "__main__":
    sys.exit(main())
