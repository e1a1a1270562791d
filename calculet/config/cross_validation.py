"""Cross-validation of a config against the verified package and the runtime's capabilities.

Why this exists: what the device can do is never decided by the config file alone (DESIGN
principle 8). At startup, after the package is verified (§11 steps 1–3) and before any device
configuration (R17.1.6), the requested profiles, in-flight depth and device count are checked
against the manifest and the capability contract, and the service fails fast (R15.19). Inputs
are plain values, so the config layer depends neither on the manifest model nor on an adapter.
"""

from __future__ import annotations

from collections.abc import Collection

from calculet.config.error_messages import problem_lines
from calculet.config.scheduler import SchedulerConfig
from calculet.errors import ConfigError

__all__ = ["cross_validate"]

Problem = tuple[str, str]


def cross_validate(
    config: SchedulerConfig,
    *,
    manifest_profiles: Collection[int],
    manifest_label: str = "the calbin manifest",
    max_inflight_supported: int = 1,
    ping_pong: bool = False,
    physical_devices_supported: int = 1,
    multi_profile_residency: bool = False,
    runtime_label: str = "CalRT 0.7.6",
) -> None:
    """Fail fast when the config asks for something the package or the device cannot do.

    Called at startup after the package is verified (§11 steps 1–3) and before any device
    configuration (R17.1.6). Inputs are plain values so this module depends neither on the
    manifest model nor on the adapter: ``manifest_profiles`` is the set of compiled batches
    in the verified manifest; the other flags come from the runtime's capability contract
    (``calculet.adapters.calrt.DeviceCapabilities``): ``max_inflight_supported`` ←
    ``max_inflight_jobs.value``, ``ping_pong`` ← ``ping_pong.value``,
    ``multi_profile_residency`` ← ``multi_profile_residency.value``,
    ``physical_devices_supported`` ← ``physical_devices_per_process.value``.

    * every requested profile must be compiled in the manifest (§2, §15; R2.7, R15.18, R15.19);
    * several profiles need a runtime that keeps several profiles resident (§8, R8.4);
    * ``max_inflight: 2`` needs the ping/pong capability and an in-flight depth of 2 (§14, R1.3);
    * more than one physical device needs a runtime that supports it (§3, R1.8).

    All problems are reported together in one :class:`ConfigError`.
    """
    problems = [
        *_profile_problems(config, manifest_profiles, manifest_label),
        *_residency_problems(config, multi_profile_residency, runtime_label),
        *_inflight_problems(config, max_inflight_supported, ping_pong, manifest_label,
                            runtime_label),
        *_device_problems(config, physical_devices_supported, runtime_label),
    ]
    if problems:
        raise ConfigError(
            f"configuration does not match {manifest_label} / {runtime_label}:\n"
            f"{problem_lines(problems)}",
            errors=problems,
        )


def _profile_problems(
    config: SchedulerConfig, manifest_profiles: Collection[int], manifest_label: str
) -> list[Problem]:
    """§2, §15: every requested profile is compiled in the manifest (R2.7, R15.18, R15.19)."""
    compiled = sorted(set(manifest_profiles))
    if not compiled:
        return [("batch.profiles", f"{manifest_label} declares no compiled batch profile at all")]
    return [
        (
            "batch.profiles",
            f"profile {profile} (B{profile}) is not compiled in {manifest_label} "
            f"(compiled batches: {compiled}); compiled_batch comes only from a "
            "validated calbin and cannot be added by configuration (§2, §15)",
        )
        for profile in config.batch.profiles
        if profile not in compiled
    ]


def _residency_problems(
    config: SchedulerConfig, multi_profile_residency: bool, runtime_label: str
) -> list[Problem]:
    """§8, R8.4: several profiles need a runtime that keeps several resident."""
    if len(config.batch.profiles) <= 1 or multi_profile_residency:
        return []
    return [(
        "batch.profiles",
        f"{list(config.batch.profiles)} needs several profiles resident at once, which "
        f"{runtime_label} does not offer; configure one profile per instance and route "
        "between instance pools (§8)",
    )]


def _inflight_problems(
    config: SchedulerConfig,
    max_inflight_supported: int,
    ping_pong: bool,
    manifest_label: str,
    runtime_label: str,
) -> list[Problem]:
    """§14, R1.3: the in-flight depth is supported, and 2 needs ping/pong."""
    problems: list[Problem] = []
    inflight = config.executor.max_inflight
    if inflight > max_inflight_supported:
        problems.append((
            "executor.max_inflight",
            f"{inflight} jobs in flight requested, but {runtime_label} supports at most "
            f"{max_inflight_supported} (§14)",
        ))
    if inflight == 2 and not ping_pong:
        problems.append((
            "executor.max_inflight",
            f"2 needs the ping/pong capability, which {runtime_label} / {manifest_label} "
            "does not offer; use 1 (§14, R1.3)",
        ))
    return problems


def _device_problems(
    config: SchedulerConfig, physical_devices_supported: int, runtime_label: str
) -> list[Problem]:
    """§3, R1.8: no more physical devices than the runtime drives per process."""
    devices = config.executor.physical_devices
    if devices <= physical_devices_supported:
        return []
    return [(
        "executor.physical_devices",
        f"{devices} physical devices requested, but {runtime_label} drives at most "
        f"{physical_devices_supported} per process; run one process per board behind a "
        "load balancer (§3, R1.8)",
    )]
