"""§11 steps 1–4 of a load, on the *calling* thread: resolve, verify, validate, plan capacity.

They are pure reads and computation — reading and hashing the package, parsing the manifest, the
capacity plan — so a slow hash or plan never holds the lifecycle lock (§11 step 4, R11.4). Two
short actor messages frame them: one opens the generation (Validating) and reads the board, the
other records a refusal (the generation returns to Unloaded; nothing was created). Step 3 also
loads the package's tokenizer and chat template and checks them against its manifest
(:func:`~calculet.runtime.streams.package_tokenizer.load_tokenizer`: vocabulary vs logits width,
special tokens, a template that renders), so a mismatched tokenizer is refused before anything is
created. A restore and a
rollback verify and validate again through the same :meth:`Preparer.verify` and
:meth:`Preparer.validate` (step 11 keeps the artifact by reference only).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from calculet.adapters.calrt import read_board_memory
from calculet.config import SchedulerConfig
from calculet.errors import BadRequest, CapacityExhausted, NotFound, NotSupported, PackageError
from calculet.packages.manifest import MANIFEST_FILE, CalbinManifest
from calculet.packages.verify import PackageCheck, VerifiedPackage, verify_package
from calculet.runtime.execution.model_facts import ModelFacts
from calculet.runtime.execution.session_plan import SessionPlan, plan_session
from calculet.runtime.models.capacity import CapacityPlan, CapacityPlanner, ChipMemory, ResidentModel, coreside
from calculet.runtime.models.generations import Generation, Generations, Prepared, Snapshot
from calculet.runtime.models.operations import ActorPort, Steps
from calculet.runtime.models.port import EnginePort
from calculet.runtime.models.reports import LifecycleTally, LoadFailed, LoadReport, LoadStep, StepTiming
from calculet.runtime.streams.package_tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("calculet.runtime.models.prepare")

__all__ = ["ACTOR_CALL_TIMEOUT_S", "Preparer"]

ACTOR_CALL_TIMEOUT_S = 60.0
"""Bound on the short actor messages a public method posts (opening a generation, queueing an
operation): an engine stopping meanwhile must not leave a caller blocked for ever."""

_PATH_CHECKS = frozenset({PackageCheck.UNTRUSTED_PATH, PackageCheck.NOT_FOUND, PackageCheck.NOT_A_PACKAGE,
                          PackageCheck.SYMLINK, PackageCheck.SPECIAL_FILE, PackageCheck.UNSAFE_PATH,
                          PackageCheck.UNSAFE_ARCHIVE})


class Preparer:
    """Steps 1–4 for a load, a rollback or the engine's first generation."""

    def __init__(self, engine: EnginePort, generations: Generations, tally: LifecycleTally, steps: Steps,
                 planner: CapacityPlanner) -> None:
        self._engine = engine
        self.config: SchedulerConfig = engine.config
        self._gens = generations
        self._tally = tally
        self._steps = steps
        self.planner = planner
        self._tokenizer_identity: str | None = None

    @property
    def alias(self) -> str:
        return self.config.model_alias

    def package_for(self, alias: str, package: str | Path | None) -> Path:
        if package is not None:
            return Path(package)
        for entry in self.config.models:
            if entry.alias == alias:
                return entry.package
        raise NotFound(f"no package given and no models[] entry for alias {alias!r}", field="package")

    def prepare(self, port: ActorPort, alias: str, package: Path, *, trusted: bool, kind: str) -> Prepared:
        """Steps 1–4 on the calling thread (pure reads and computation, no lock held)."""
        gen, snapshot = port.call(lambda: self._open_generation(alias, package), ACTOR_CALL_TIMEOUT_S)
        timings: list[StepTiming] = []
        step = LoadStep.RESOLVE
        try:
            if trusted:
                step = LoadStep.RESOLVE
                t0 = self._steps.start(step, gen.id)
                self._resolve(package)
                self._steps.timed(timings, step, t0)
                step = LoadStep.VERIFY
                t0 = self._steps.start(step, gen.id)
                try:
                    verified = self.verify(package)
                except PackageError as exc:
                    if exc.context.get("reason") in _PATH_CHECKS:
                        step = LoadStep.RESOLVE
                    raise
                self._steps.timed(timings, step, t0)
                manifest_bytes = verified.manifest_bytes
                sha = verified.manifest_sha256
                path, signed_by = verified.path, f"{verified.key_name} ({verified.key_id})"
            else:
                verified = None
                try:
                    manifest_bytes = (package / MANIFEST_FILE).read_bytes()
                except OSError as exc:
                    raise PackageError(f"package {package}: cannot read {MANIFEST_FILE}: {exc.strerror or exc}",
                                       reason=PackageCheck.NOT_FOUND.value) from exc
                sha = hashlib.sha256(manifest_bytes).hexdigest()
                path, signed_by = package, "caller-provided (unverified: §11 steps 1-2 skipped)"
            step = LoadStep.VALIDATE
            t0 = self._steps.start(step, gen.id)
            plan = self.validate(alias, manifest_bytes, sha)
            self._keep_tokenizer(load_tokenizer(path, manifest_bytes, sha))  # its tokenizer and chat template (#18)
            self._steps.timed(timings, step, t0)
            step = LoadStep.PLAN
            t0 = self._steps.start(step, gen.id)
            capacity = self._capacity(plan, snapshot)
            self._steps.timed(timings, step, t0)
        except Exception as exc:
            report = LoadReport(kind=kind, alias=alias, generation=gen.id, calbin_sha256="", ok=False,
                                state="unloaded", failed_step=step.name.lower(), error=str(exc),
                                steps=tuple(timings))
            failed_step, error = step, exc
            port.call(lambda: self._abort_validation(gen, failed_step, error), ACTOR_CALL_TIMEOUT_S)
            raise LoadFailed(step, exc, report) from exc
        return Prepared(gen, kind, plan, capacity, timings, verified, path, signed_by, trusted)

    def _keep_tokenizer(self, tokenizer: Tokenizer) -> None:
        """The engine serves every generation with the first one's tokenizer and chat template, so a
        replacement must carry the same files (#18; the rest of the contract is :meth:`validate`'s)."""
        if self._gens.contract is None or self._tokenizer_identity is None:
            self._tokenizer_identity = tokenizer.identity
        elif tokenizer.identity != self._tokenizer_identity:
            raise BadRequest("the package's tokenizer or chat template differs from the running engine's; a different "
                             "tokenizer needs a new engine", field="package")

    def _open_generation(self, alias: str, package: Path) -> tuple[Generation, Snapshot]:
        """(actor) A new generation enters Validating; the board and residents are read for step 4."""
        gen = self._gens.new(alias, package, self._engine.clock.now())
        chips = tuple(ChipMemory(chip, info.total_bytes, info.used_bytes)
                      for chip, info in enumerate(read_board_memory(self._engine.device)))
        return gen, Snapshot(gen.id, chips, self._gens.resident())

    def _abort_validation(self, gen: Generation, step: LoadStep, exc: BaseException) -> None:
        """(actor) Steps 1–4 failed: nothing was created; the generation is Unloaded."""
        gen.error = f"step {int(step)} ({step.title}): {exc}"
        if gen.machine.at("validating"):
            gen.machine.fire("load_failed")
        self._tally.load_failures[step.name.lower()] += 1
        self._gens.ended(gen)
        log.warning("load refused", extra={"generation": gen.id, "step": int(step), "detail": str(exc)})

    def verify(self, package: Path) -> VerifiedPackage:
        """Step 2 (R11.2) under the configured trust: for a load, and again for a restore."""
        trust = self.config.trust
        return verify_package(package, trust.trusted_roots, trust.trusted_keys_dir, max_file_bytes=trust.max_file_bytes)

    def _resolve(self, package: Path) -> None:
        """Step 1 (R11.1): the path, after following every symlink, lies under a trusted root."""
        roots = [Path(r).resolve() for r in self.config.trust.trusted_roots]
        if not roots:
            raise PackageError(f"package {package}: no trust.trusted_roots configured (§11 step 1)",
                               reason=PackageCheck.UNTRUSTED_PATH.value, package=str(package))
        try:
            resolved = package.resolve()
        except (OSError, RuntimeError) as exc:
            raise PackageError(f"package {package}: cannot resolve the path: {exc}",
                               reason=PackageCheck.NOT_FOUND.value, package=str(package)) from exc
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            via = f" (it resolves to {resolved})" if resolved != package.absolute() else ""
            raise PackageError(f"package {package}: path is outside the trusted roots "
                               f"[{', '.join(map(str, roots))}]{via} (§11 step 1)",
                               reason=PackageCheck.UNTRUSTED_PATH.value, package=str(package))

    def validate(self, alias: str, manifest_bytes: bytes, sha: str) -> SessionPlan:
        """Step 3: manifest schema, config vs manifest and contract (R15.19), alias, engine contract."""
        if alias != self.alias:
            raise NotSupported(
                f"this engine serves alias {self.alias!r}; serving {alias!r} beside it needs a multi-model runtime "
                "contract (model handle, quotas, reset domain: §13.2), which CalRT 0.7.6 does not offer — run one "
                "process per model (§13.1)", field="alias")
        manifest = CalbinManifest.parse(manifest_bytes)
        facts = ModelFacts.from_manifest(manifest, sha)
        plan = plan_session(facts, self.config)
        contract = self._gens.contract
        if contract is not None:
            problems = contract.differences(plan.contract())
            if problems:
                raise BadRequest(f"package {facts.name!r} does not keep the running engine's contract (tokenizer, "
                                 f"context, KV geometry, scheduling capabilities): {'; '.join(problems)}; a "
                                 "different contract needs a new engine", field="package")
        return plan

    def _capacity(self, plan: SessionPlan, snap: Snapshot) -> CapacityPlan:
        """Step 4 (outside the lifecycle lock): the capacity plan against the board (§13.1)."""
        caps = plan.facts.capabilities
        resident = []
        for gen_id, footprint, other_caps in snap.resident:
            stays = coreside(other_caps, caps)
            resident.append(ResidentModel(gen_id, footprint, stays))
        result = self.planner.plan(plan.facts.memory, plan.pool_bytes(), snap.chips, resident)
        if not result.feasible:
            raise CapacityExhausted(f"capacity plan for {plan.facts.name!r}: {result.detail}")
        return result
