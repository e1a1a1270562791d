"""Bring-up of the served model on the simulated NPU (§11 steps 1–9), for ``python -m calculet.run``.

Two cases:

* **configured** (``models`` lists the alias ``model_alias``): the package is verified with the
  configuration's trust settings only — trusted roots, trusted keys, file size limit (§11 steps
  1–2) — and loaded;
* **embedded default** (no ``models``): the bundled tiny model package (the simulated NPU's
  ``current`` variant: B1 only, the capability contract as the spec states it for CalRT 0.7.6)
  is built into a private temporary directory, signed with this machine's development key
  (:func:`~calculet.adapters.packages.ensure_dev_keypair`), verified against exactly that key
  and that directory, and loaded. The development key is never trusted for anything else.

Either way the engine's bring-up then runs §11 steps 3 and 7–9 (manifest checks, configuration
cross-validation — a B8 requested of a B1 package fails here, R15.19 — CreateCalbin → configure
→ KvManager → pools, golden).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from calculet.adapters.packages import VerifiedPackage, ensure_dev_keypair, sign_package, verify_package
from calculet.adapters.sim import SimCalRT, SimConfig, TimeMode
from calculet.adapters.sim.build import build_package as build_sim_package
from calculet.config import SchedulerConfig
from calculet.errors import ConfigError
from calculet.runtime.engine import Engine, EngineOptions

log = logging.getLogger("calculet.server.bringup")

BUNDLED_PACKAGE = "tiny-sim-current"


@dataclass
class BroughtUp:
    """The engine over a verified package, and what to clean up at exit."""

    engine: Engine
    package: str
    """The verified package's source (directory or archive)."""
    load_duration_s: float
    """Verification + bring-up (CreateCalbin, configure, KvManager, pools, golden)."""
    bundled: bool
    workdir: Path | None = field(default=None, repr=False)
    verified: VerifiedPackage | None = field(default=None, repr=False)

    def close(self) -> None:
        """Remove temporary directories (bundled package, extracted archive); the engine must be stopped."""
        if self.verified is not None:
            self.verified.cleanup()
            self.verified = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def bring_up(config: SchedulerConfig, *, sim: SimConfig | None = None, key_dir: str | Path | None = None,
             options: EngineOptions = EngineOptions()) -> BroughtUp:
    """Verify and load the served package on a simulated NPU in real time (default cost model: tiny)."""
    started = time.perf_counter()
    runtime = SimCalRT(sim if sim is not None else SimConfig(time_mode=TimeMode.REAL))
    workdir: Path | None = None
    try:
        entry = next((m for m in config.models if m.alias == config.model_alias), None)
        if entry is not None:
            trust = config.trust
            verified = verify_package(entry.package, trust.trusted_roots, trust.trusted_keys_dir, trust.max_file_bytes)
            bundled = False
        elif config.models:
            raise ConfigError(f"model_alias: {config.model_alias!r} is not among models[].alias",
                              errors=[("model_alias", "not among models[].alias")])
        else:
            workdir = Path(tempfile.mkdtemp(prefix="calculet-bundled-"))
            root = workdir / "packages"
            package_dir = root / BUNDLED_PACKAGE
            build_sim_package(package_dir, variant="current")
            pair = ensure_dev_keypair(key_dir)
            sign_package(package_dir, pair.private_key_path)
            verified = verify_package(package_dir, [root], pair.public_key_path.parent)
            bundled = True
            log.warning("serving the bundled tiny model, signed with this machine's development key "
                        "(never trust that key in production)",
                        extra={"key_id": pair.key_id, "package": str(package_dir)})
        try:
            engine = Engine(config, runtime, verified.path, options=options)
        except BaseException:
            verified.cleanup()
            raise
    except BaseException:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    took = time.perf_counter() - started
    info = engine.model_info()
    log.info("model loaded", extra={"alias": config.model_alias, "generation": info.generation,
                                    "calbin": info.calbin, "package_sha256": info.package_sha256,
                                    "profiles": list(info.profiles), "load_s": round(took, 4)})
    return BroughtUp(engine, str(verified.source), took, bundled, workdir, verified)
