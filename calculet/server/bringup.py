"""Bring-up of the served model on the configured device plug-in, for ``python -m calculet.run``.

The device is chosen by name (``--device NAME`` or ``device.name``; default ``sim``, the simulated
NPU) among the ``calculet.devices`` entry points (:mod:`calculet.adapters.devices`); the plug-in
opens the CalRT runtime the engine drives. ``device.evidence`` names a conformance report
(``python -m calculet.conformance``); :meth:`BroughtUp.offered` turns the package's capability
contract into what the service may offer — above C3 only with a passing report for this device
and this package (§1, §20; :mod:`calculet.adapters.calrt.evidence`).

The engine always starts through its :class:`~calculet.runtime.models.manager.ModelManager` from the
configuration's ``models[model_alias]``, so the first generation passes all eleven §11 steps —
trusted root (1), signature and every hash against ``trust.trusted_keys_dir`` (2), manifest and
configuration cross-validation (3: a B8 requested of a B1 package fails here, R15.19), capacity
plan (4), CreateCalbin → configure → KvManager → pools, golden, publish — exactly as a later
``POST /admin/models/{alias}/load`` does. Two cases:

* **configured** (``models`` lists the alias ``model_alias``): the configuration is used as it is;
* **embedded default** (no ``models`` and no ``trust``): the bundled tiny model package
  (:mod:`calculet.adapters.sim.bundled`: random weights, a BPE tokenizer trained at build time and
  a chat template, both inside the signed package; the simulated NPU's ``current`` variant: B1
  only, the capability contract as the spec states it for CalRT 0.7.6) is built into a private
  temporary directory and signed with this machine's development key
  (:func:`~calculet.packages.keys.ensure_dev_keypair`). It is served as ``tiny-random`` when the
  configuration keeps the §15 example alias ``qwen3`` (which names a real model this is not), else
  under the configured alias; the *effective*
  configuration is a copy with ``models = [{alias: <that alias>, package: <that package>}]`` and
  ``trust = {trusted_roots: [<that directory>], trusted_keys_dir: <the dev key directory>}``.
  The development key is trusted for that private directory only, which holds nothing else.

A configuration with ``trust`` but no ``models`` is refused: its trust settings cannot vouch for
the dev-signed bundled package, and widening them to the dev key would trust it for the
configured roots too.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from calculet.adapters.calrt.evidence import DeviceEvidence, OfferedContract, offered_capabilities
from calculet.adapters.devices import DevicePlugin, DeviceRegistry, DeviceRequest, load_device
from calculet.packages import ensure_dev_keypair, sign_package
from calculet.adapters.sim import SimConfig
from calculet.adapters.sim.bundled import BUNDLED_ALIAS, BUNDLED_NAME, build_bundled
from calculet.adapters.calrt import CalRT
from calculet.config import ModelEntry, SchedulerConfig, TrustConfig
from calculet.errors import ConfigError
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions

log = logging.getLogger("calculet.server.bringup")

BUNDLED_PACKAGE = BUNDLED_NAME
SPEC_EXAMPLE_ALIAS = "qwen3"
"""The §15 example's alias (the default configuration's): it names a real model, not the bundled one."""


@dataclass
class BroughtUp:
    """The engine over a verified package, the effective configuration, and what to clean up at exit."""

    engine: ThreadedEngine
    config: SchedulerConfig
    """The effective configuration (for the bundled package: with ``models`` and ``trust`` filled)."""
    bundled: bool
    workdir: Path | None = field(default=None, repr=False)
    device: DevicePlugin | None = None
    """The device plug-in the engine drives."""
    evidence: DeviceEvidence | None = None
    """The conformance report ``device.evidence`` names, if any (checked by :meth:`offered`)."""

    @property
    def device_label(self) -> str:
        """Where the device facts come from, for the capability endpoint."""
        if self.device is None:
            return "unknown device"
        return f"{self.device.name}: {self.device.description}"

    def offered(self) -> OfferedContract:
        """The capability contract the service may offer (above C3 only with passing evidence)."""
        info = self.engine.model_info()
        offered = offered_capabilities(self.engine.capabilities(), self.evidence,
                                       device=self.device.name if self.device else "",
                                       package_sha256=info.package_sha256, batches=info.profiles)
        if self.evidence is not None and offered.evidence_problem is not None:
            log.warning("conformance evidence not used", extra={"reason": offered.evidence_problem})
        for name, why in offered.refused.items():
            log.warning("capability refused above C3", extra={"capability": name, "reason": why})
        if offered.earned:
            log.info("capabilities earned by conformance evidence",
                     extra={"earned": {k: v.value for k, v in offered.earned.items()}})
        return offered

    @property
    def package(self) -> str:
        """The served package's source (directory or archive)."""
        return next(str(m.package) for m in self.config.models if m.alias == self.config.model_alias)

    def close(self) -> None:
        """Remove the bundled package's temporary directory; the engine must be stopped."""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def bundled_config(config: SchedulerConfig, workdir: Path, *, key_dir: str | Path | None = None) -> SchedulerConfig:
    """Build and sign the bundled package under ``workdir/packages`` and return ``config`` with
    ``models`` and ``trust`` naming exactly that package, that root and the dev key directory."""
    if config.trust.trusted_roots or config.trust.trusted_keys_dir is not None:
        raise ConfigError("models: empty while trust is set; name the package to serve in models[] (the bundled "
                          "package is signed with the development key, which this configuration does not trust)",
                          errors=[("models", "empty while trust is set")])
    root = workdir / "packages"
    package_dir = root / BUNDLED_PACKAGE
    build_bundled(package_dir)
    alias = BUNDLED_ALIAS if config.model_alias == SPEC_EXAMPLE_ALIAS else config.model_alias
    pair = ensure_dev_keypair(key_dir)
    sign_package(package_dir, pair.private_key_path)
    log.warning("serving the bundled tiny model (random weights: its output is random tokens), signed with this "
                "machine's development key (trusted for its private directory only; never trust that key in "
                "production)", extra={"key_id": pair.key_id, "package": str(package_dir), "alias": alias})
    trust = TrustConfig(trusted_roots=(root,), trusted_keys_dir=pair.public_key_path.parent,
                        max_file_bytes=config.trust.max_file_bytes)
    return config.model_copy(update={"models": (ModelEntry(alias=alias, package=package_dir),),
                                      "trust": trust, "model_alias": alias})


def open_device(config: SchedulerConfig, *, device: str | None = None, sim: SimConfig | None = None,
                registry: DeviceRegistry | None = None) -> tuple[DevicePlugin, CalRT]:
    """The plug-in named ``device`` (default ``config.device.name``) and the runtime it opens in real
    time; ``sim`` is handed to a simulated plug-in as its whole configuration."""
    plugin = load_device(device or config.device.name, registry)
    options = dict(config.device.options)
    if sim is not None and plugin.simulated:
        options["sim_config"] = sim
    return plugin, plugin.open_runtime(DeviceRequest(real_time=True, options=options))


def bring_up(config: SchedulerConfig, *, sim: SimConfig | None = None, key_dir: str | Path | None = None,
             options: EngineOptions = EngineOptions(), device: str | None = None,
             registry: DeviceRegistry | None = None) -> BroughtUp:
    """Load the served package through the model manager on the named device plug-in in real time."""
    started = time.perf_counter()
    evidence = DeviceEvidence.load(config.device.evidence) if config.device.evidence is not None else None
    plugin, runtime = open_device(config, device=device, sim=sim, registry=registry)
    workdir: Path | None = None
    try:
        if config.models:
            if config.model_alias not in {m.alias for m in config.models}:
                raise ConfigError(f"model_alias: {config.model_alias!r} is not among models[].alias",
                                  errors=[("model_alias", "not among models[].alias")])
            effective, bundled = config, False
        else:
            workdir = Path(tempfile.mkdtemp(prefix="calculet-bundled-"))
            effective, bundled = bundled_config(config, workdir, key_dir=key_dir), True
        engine = ThreadedEngine(effective, runtime, None, options=options)
    except BaseException:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    took = time.perf_counter() - started
    report = engine.models.status().generation(engine.model_info().generation)
    log.info("model loaded", extra={"alias": effective.model_alias, "generation": report.id,
                                    "calbin": report.name, "package_sha256": report.calbin_sha256,
                                    "signed_by": report.signed_by, "profiles": list(report.profiles),
                                    "load_s": round(took, 4), "device": plugin.name})
    return BroughtUp(engine, effective, bundled, workdir, device=plugin, evidence=evidence)
