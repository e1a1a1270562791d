"""The vendor conformance kit: the checks that earn each capability tier on a device (§1, §9, §18, §20).

Why: the spec rates B>1 profiles, ping/pong, lane isolation and a verified reset C3 "until these
are delivered" (§20) and names the runner that would show them (§1 "gradual rollout after the
runner"). This is that runner. ``python -m calculet.conformance --device NAME [--package DIR]``
(the ``calculet conformance`` subcommand maps to it) opens the device plug-in named ``NAME``
(entry-point group ``calculet.devices``), loads the package and runs every check through the
CalRT protocol alone:

* vendor contract — CalRT version, one physical device per process, each profile's inactive-lane
  contract (:mod:`.checks_matrix`);
* the §18 matrix — one sequence against the package's golden vectors, two alternating, lanes
  1..B of mixed lengths against each sequence run alone on B1 (golden equivalence between
  profiles, per-lane identity and crosstalk), inactive lanes that must stay silent, status counters;
* the §9 transaction rules, faults and recovery (:mod:`.checks_faults`) — a failed job commits
  nothing and names its lanes (quarantine), release only when the device confirms it, a timed-out
  job keeps its buffers until reset, reset leaves no stale KV, restart, a short load/unload soak
  against ReadMem, ping/pong, incremental
  prefill, the §9.3 context operations, ReadMem.

It writes a report (:mod:`.report`: Markdown, and the JSON the service reads as
``device.evidence``) stating per capability the tier established and the evidence. The rule for
tiers is :mod:`.capabilities`. Five deliberately broken devices in :mod:`.faulty` show each
check can fail. The simulator's own report is committed as ``specs/conformance-sim.md``/``.json``
(written and checked by ``python -m calculet.specgen``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from calculet.adapters.calrt import CALRT_VERSION
from calculet.adapters.calrt.evidence import CheckOutcome, DeviceEvidence
from calculet.adapters.devices import DevicePlugin, DeviceRequest
from calculet.clock import FakeClock
from calculet.conformance import checks_faults as faults
from calculet.conformance import checks_matrix as matrix
from calculet.conformance.capabilities import capability_evidence
from calculet.conformance.harness import Bench, NotRun, Probe
from calculet.errors import CalculetError, ConfigError

Check = tuple[str, str, str, Callable[[Bench, Probe], None]]

CHECKS: tuple[Check, ...] = (
    ("vendor.runtime", "CalRT version; one physical VirtualDevice per process", "§3, §20", matrix.check_runtime),
    ("vendor.profiles", "every B>1 profile states its inactive-lane contract", "§7.3, §20", matrix.check_profiles),
    ("matrix.single_sequence", "single-sequence prefill + decode against the golden vectors", "§18, §11 step 9",
     matrix.check_single_sequence),
    ("matrix.two_sequences", "two sequences alternating equal each run alone", "§18", matrix.check_two_sequences),
    ("lanes.fill_and_identity", "lanes 1..B of mixed lengths: tags, outputs and commits per lane", "§18, §7.4",
     matrix.check_fill_lanes),
    ("kv.inactive_lanes_silent", "an inactive lane writes no KV", "§7.3, §18", matrix.check_inactive_lanes),
    ("status.counters", "status counters match every job", "§14", matrix.check_counters),
    ("kv.commit_atomic", "a failed job commits nothing and names its lanes (quarantine)", "§9.2",
     faults.check_commit_atomic),
    ("kv.release_confirmed", "release only when the device confirms it; ids never reused", "§9.2, §12",
     faults.check_release),
    ("kv.reset_clean", "ResetConfiguration leaves no stale KV", "§12", faults.check_reset_clean),
    ("fault.timeout_reset", "a timed-out job keeps its buffers until reset; reset recovers", "§12, §18",
     faults.check_timeout_reset),
    ("fault.restart", "close and create the device again", "§12", faults.check_restart),
    ("lifecycle.load_unload", "load/unload cycles leave device memory at its baseline", "§18, §12",
     faults.check_load_unload),
    ("pingpong.two_jobs", "PING and PONG jobs with their own buffers and KV", "§14, §18", faults.check_ping_pong),
    ("prefill.incremental", "a prompt in two prefill chunks equals one prefill", "§6",
     faults.check_incremental_prefill),
    ("ctx.operations", "§9.3 context operations: empty ones refuse, RemoveTokensAtEnd boundaries", "§9.3",
     faults.check_context_ops),
    ("memory.read_mem", "ReadMem per chiplet is consistent", "§13.1", faults.check_memory),
)


def _run_check(bench: Bench, check: Check) -> CheckOutcome:
    check_id, title, ref, fn = check
    probe = Probe(check_id, title, ref)
    try:
        fn(bench, probe)
    except NotRun as exc:
        probe.skipped = str(exc)
    except CalculetError as exc:
        probe.fail("device_error", f"{type(exc).__name__}: {exc}")
    return probe.outcome()


def run_conformance(plugin: DevicePlugin, package: str | Path, *, timeout_s: float = 30.0,
                    only: Sequence[str] | None = None) -> DeviceEvidence:
    """Run the kit (every check, or those named in ``only``) against ``plugin`` serving ``package``."""
    clock = FakeClock()
    runtime = plugin.open_runtime(DeviceRequest(real_time=False, clock=clock))
    bench = Bench(plugin, runtime, Path(package), clock=clock, timeout_s=timeout_s)
    with bench.session() as s:
        name, sha = s.calbin.name, s.calbin.package_sha256
        batches = tuple(p.compiled_batch for p in s.calbin.profiles)
        contract = s.calbin.capabilities
        bench.read_package(s.calbin)
    outcomes = tuple(_run_check(bench, c) for c in CHECKS if only is None or c[0] in only)
    return DeviceEvidence(device=plugin.name, simulated=plugin.simulated, package_name=name, package_sha256=sha,
                          calrt_version=getattr(runtime, "version", CALRT_VERSION), profiles=batches,
                          checks=outcomes, capabilities=capability_evidence(batches, contract, outcomes,
                                                                             plugin.simulated))


def simulator_package(outdir: Path) -> Path:
    """The simulated NPU's richest package (``future``: B1/B4/B8/B16, ping/pong), built reproducibly."""
    from calculet.adapters.sim.build import build_package

    path = outdir / "tiny-sim-future"
    build_package(path, variant="future")
    return path


def run_default(plugin: DevicePlugin, package: str | Path | None, **kwargs: object) -> DeviceEvidence:
    """:func:`run_conformance`, building the simulator's package when none is given for a simulated device."""
    if package is not None:
        return run_conformance(plugin, package, **kwargs)  # type: ignore[arg-type]
    if not plugin.simulated:
        raise ConfigError(f"device {plugin.name!r} is not simulated: name the package to test with --package",
                          errors=[("package", "required for a real device")])
    workdir = Path(tempfile.mkdtemp(prefix="calculet-conformance-"))
    try:
        return run_conformance(plugin, simulator_package(workdir), **kwargs)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["CHECKS", "run_conformance", "run_default", "simulator_package"]
