"""The simulator's conformance report as generated documents (``specs/conformance-sim.md``/``.json``).

Why in ``specs/``: the report is derived from the code (the simulator, its ``future`` package built
reproducibly, the kit in virtual time), so, like the state tables, it is written by
``python -m calculet.specgen`` and ``--check`` fails when it is not current. One run of the kit
serves both documents.
"""

from __future__ import annotations

import functools

from calculet.adapters.calrt.evidence import DeviceEvidence
from calculet.adapters.sim.plugin import PLUGIN
from calculet.conformance import run_default
from calculet.conformance.report import markdown

MARKDOWN_DOCUMENT = "conformance-sim.md"
JSON_DOCUMENT = "conformance-sim.json"


@functools.lru_cache(maxsize=1)
def simulator_evidence() -> DeviceEvidence:
    """The kit's report on the simulated NPU with its ``future`` package (B1/B4/B8/B16, ping/pong)."""
    return run_default(PLUGIN, None)


def simulator_report_markdown() -> str:
    return markdown(simulator_evidence())


def simulator_report_json() -> str:
    return simulator_evidence().to_json()
