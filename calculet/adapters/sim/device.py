"""The simulated NPU: a CalRT 0.7.6 VirtualDevice that computes for real.

:class:`SimCalRT` stands for the CalRT library loaded in one process: it creates at most one live
physical :class:`SimVirtualDevice` (§3, R3.4). The device loads calbin packages built by
:mod:`calculet.adapters.sim.build`, configures them (device-global, as 0.7.6 is assumed to be,
§11), hands out a :class:`~calculet.adapters.sim.kv.SimKvManager` and job buffers, and runs
prefill and decode jobs on two engines, PING and PONG (§14), through the tiny numpy transformer.

Behaviour the runtime can rely on (and test against):

* **Transactions** (§9.2): a job's KV writes become visible only when it completes OK; a failed,
  timed-out or discarded job leaves every sequence byte-identical.
* **Positions** (§9.2, R9.2.4): a valid lane's position must equal its sequence's committed
  length, or submit fails INVALID_ARGUMENT. An inactive lane must carry the profile's fill token
  and writes no KV (§7.3).
* **Buffers** (§12, §14): a buffer is bound to its job from submit until the job completes; until
  then it can be neither reused nor freed (BUFFER_IN_USE). A timed-out job never completes, so
  its buffers stay bound until ResetConfiguration or close — it can never complete late into a
  buffer the runtime has reused.
* **Time** (DESIGN principle 3): in ``TimeMode.VIRTUAL`` submit records the completion instant
  from the cost model, ``poll()`` returns what is due at ``clock.now()``, and
  ``next_completion_time()`` tells a simulator how far to advance a :class:`FakeClock`; ``wait``
  consumes virtual time by advancing the FakeClock. In ``TimeMode.REAL`` a worker thread owned
  by the device computes and completes jobs at their instants; callers never wait except in
  ``wait``/``wait_any``.
* **Results** carry (generation id, job id), per-lane (seq id, lane) tags and status counters
  (§4, §7.4, §14), checked by :func:`calculet.adapters.calrt.verify_result`.
* **Faults** (:mod:`calculet.adapters.sim.faults`) are injected by rule or at random with a
  seed; after a CCU fault or unknown DMA the device refuses new jobs until it is reset.

This module is the façade: lifecycle calls, submit and the bookkeeping of a job's completion.
The parts live beside it — :mod:`.calbin` (CreateCalbin, configure rules), :mod:`.buffers` (job
buffers and their binding), :mod:`.submit_checks` (what submit refuses), :mod:`.job_record` (the
submit DMA and the job's completion record), :mod:`.execution` (numerics and the §9.2 commit),
:mod:`.fault_effects` (what an injected fault does to a result), :mod:`.timeline` (completion
instants, virtual time, the real-time worker, Wait) and :mod:`.null_plan` (the null device's decode step, its
configuration's constant verdicts decided once).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import Counter
from functools import partial
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np

from calculet.adapters.calrt import (
    CALRT_VERSION,
    BufferHandle,
    Calbin,
    DecodeJob,
    JobBuffers,
    JobId,
    JobKind,
    JobResult,
    JobSpec,
    JobTicket,
    KvManager,
    MemInfo,
    ReturnCode,
    VendorError,
    translated,
    vendor_boundary,
)
from calculet.adapters.sim import fault_effects
from calculet.adapters.sim.buffers import BufferTable
from calculet.adapters.sim.calbin import SimCalbin, check_coresident, check_simulable, load_model, profiles_to_configure
from calculet.adapters.sim.config import SimConfig, TimeMode
from calculet.adapters.sim.device_statistics import DeviceStatistics, RuntimeStatistics
from calculet.adapters.sim.execution import Computed, SimJob, compute
from calculet.adapters.sim.faults import FaultInjector, InjectedFault
from calculet.adapters.sim.job_record import completion_record, settle
from calculet.adapters.sim.kv import SimKvManager
from calculet.adapters.sim.memory import MemoryLedger
from calculet.adapters.sim.null_plan import NullDecodePlan
from calculet.adapters.sim.submit_checks import SubmitGate, decode_step
from calculet.adapters.sim.timeline import CompletionTimeline
from calculet.clock import Clock
from calculet.machines.job import JobEngine
from calculet.packages.manifest import MANIFEST_FILE, CalbinManifest


# ---------------------------------------------------------------------------------------------
# Runtime (one per process)
# ---------------------------------------------------------------------------------------------


class SimCalRT:
    """The CalRT library as loaded in one process: at most one live physical device (§3)."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self._lock = threading.Lock()
        self._live: SimVirtualDevice | None = None
        self._created = 0
        self._refused = 0

    @property
    def version(self) -> str:
        return CALRT_VERSION

    @vendor_boundary("CalRT.CreateVirtualDevice")
    def create_virtual_device(self, physical_index: int = 0) -> SimVirtualDevice:
        """Create the process's physical VirtualDevice; a second live one is refused (R3.4)."""
        with self._lock:
            if physical_index != 0:
                self._refused += 1
                raise VendorError(ReturnCode.NOT_SUPPORTED,
                                  f"physical device {physical_index}: CalRT 0.7.6 drives one physical device per "
                                  "process; more boards need more processes (§1 C4, §3)")
            if self._live is not None and not self._live.closed:
                self._refused += 1
                raise VendorError(ReturnCode.ALREADY_EXISTS,
                                  "a physical VirtualDevice already exists in this process; CalRT 0.7.6 allows "
                                  "one (§3)")
            self._created += 1
            self._live = SimVirtualDevice(self, physical_index, self.config)
            return self._live

    def _closed(self, device: SimVirtualDevice) -> None:
        with self._lock:
            if self._live is device:
                self._live = None

    def statistics(self) -> RuntimeStatistics:
        with self._lock:
            live = 1 if self._live is not None and not self._live.closed else 0
            return RuntimeStatistics(CALRT_VERSION, self._created, self._refused, live)


# ---------------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------------


class SimVirtualDevice:
    """A simulated CalRT VirtualDevice; see the module docstring for its contract."""

    def __init__(self, runtime: SimCalRT, physical_index: int, config: SimConfig) -> None:
        self._runtime = runtime
        self._physical_index = physical_index
        self.config = config
        self.clock: Clock = config.resolved_clock()
        self.cost = config.cost
        self.faults = FaultInjector(config.fault_rules, config.fault_seed, config.fault_rates or None)
        self.memory = MemoryLedger(config.board)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._epoch = 1
        self._closed = False
        self._calbins: dict[int, SimCalbin] = {}
        self._kvs: dict[int, SimKvManager] = {}
        self._buffers = BufferTable(self.memory, self._ids)
        self._gate = SubmitGate(self._calbins, self._kvs, self._buffers, self.cost)
        """Submit's checks; it forgets its decode routes whenever a calbin, profile, KvManager or buffer changes."""
        self._worker_cond = threading.Condition(self._lock)
        self._virtual = config.time_mode is TimeMode.VIRTUAL
        self.timeline = CompletionTimeline(self.clock, self._cond, self, virtual=config.time_mode is TimeMode.VIRTUAL,
                                           wait_advances_clock=config.wait_advances_clock,
                                           worker_cond=self._worker_cond)
        self._engine_job: dict[JobEngine, int | None] = {JobEngine.PING: None, JobEngine.PONG: None}
        self._engine_seq: dict[JobEngine, int] = {JobEngine.PING: 0, JobEngine.PONG: 0}
        self._poisoned: ReturnCode | None = None
        self._submitted = 0
        self._refused: Counter[ReturnCode] = Counter()
        self._completed: Counter[ReturnCode] = Counter()
        self._resets = 0
        self.completes_at_submit = config.completes_inline  # the null device: see SimConfig
        self._null = NullDecodePlan(self.timeline, self.clock, self._ids, self._engine_seq, self._completed,
                                    self.faults, self._cond) if self.completes_at_submit else None
        if self._null is not None:  # its Submit: a routed decode step in one frame, the rest the full path (#20)
            self._null.bind(self._lock, self._gate.routes, self._submit_locked, partial(submit_refusal, self._refused))
            self.submit = self._null.submit  # type: ignore[method-assign]
        self._worker: threading.Thread | None = None
        if config.time_mode is TimeMode.REAL:
            self._worker = threading.Thread(target=self.timeline.work, args=(lambda: self._closed,),
                                            name=f"calrt-sim-dev{physical_index}", daemon=True)
            self._worker.start()

    # --- identity --------------------------------------------------------------------------

    @property
    def physical_index(self) -> int:
        return self._physical_index

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def config_epoch(self) -> int:
        return self._epoch

    # --- calbins and configuration ---------------------------------------------------------

    @vendor_boundary("VirtualDevice.CreateCalbin")
    def create_calbin(self, package_dir: str | os.PathLike[str]) -> SimCalbin:
        """Load a calbin package (already verified by calculet.packages) and reserve its memory.

        Memory is checked first, so a second large model fails OUT_OF_MEMORY with the figures
        (§13.1); then co-residency, which 0.7.6 does not offer (§13.2: NOT_SUPPORTED).
        """
        path = Path(package_dir)
        manifest_bytes = (path / MANIFEST_FILE).read_bytes() if (path / MANIFEST_FILE).is_file() else b""
        manifest = CalbinManifest.from_path(path)
        model = load_model(path, manifest) if self.config.numerics else None
        with self._lock:
            self._check_open()
            calbin_id = next(self._ids)
            calbin = SimCalbin(calbin_id, path, manifest, manifest_bytes, model)
            check_simulable(calbin)
            owner = f"calbin:{calbin_id}"
            self.memory.reserve_calbin(owner, f"calbin {manifest.name!r}", calbin.memory)
            try:
                check_coresident(calbin, list(self._calbins.values()))
            except VendorError:
                self.memory.release(owner)
                raise
            self._calbins[calbin_id] = calbin
            self._gate.forget()
            return calbin

    @vendor_boundary("VirtualDevice.DestroyCalbin")
    def destroy_calbin(self, calbin: Calbin) -> None:
        """Refused while the calbin has jobs, buffers or a KvManager (§12 order: buffers, KvManager,
        Calbin; a forced delete is not a cancellation)."""
        with self._lock:
            self._check_open()
            cb = self._calbin(calbin)
            jobs = [j for j in self.timeline.pending.values() if j.calbin is cb]
            if jobs:
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"calbin {cb.name!r} has {len(jobs)} job(s) in flight; they must complete or the "
                                  "device be reset first (§12)")
            bufs = self._buffers.of_calbin(cb.calbin_id)
            kvs = sum(1 for k in self._kvs.values() if k.calbin_id == cb.calbin_id)
            if bufs or kvs:
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"calbin {cb.name!r} still has {bufs} buffer(s) and {kvs} KvManager(s); destroy "
                                  "them first (§12)")
            cb.configured_profiles = ()
            self.memory.release(f"calbin:{cb.calbin_id}")
            del self._calbins[cb.calbin_id]
            self._gate.forget()

    @vendor_boundary("VirtualDevice.configure")
    def configure(self, calbin: Calbin, profiles: Sequence[int] | None = None) -> None:
        """Configure the device for ``calbin`` with the given compiled profiles (default: all).

        Configure is device-global on 0.7.6 (§11, R11.14): another configured calbin must be
        destroyed or the configuration reset first. Several profiles at once need the
        multi-profile residency capability (§8, R8.4).
        """
        with self._lock:
            self._check_open()
            cb = self._calbin(calbin)
            chosen = profiles_to_configure(cb, profiles, list(self._calbins.values()))
            if any(j.calbin is cb for j in self.timeline.pending.values()):
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"calbin {cb.name!r} has jobs in flight; cannot reconfigure")
            cb.configured_profiles = chosen
            self._gate.forget()

    @vendor_boundary("VirtualDevice.ResetConfiguration")
    def reset_configuration(self) -> None:
        """Reset the whole device configuration (reset domain: device).

        Every in-flight job is discarded and will never complete; buffers and KvManagers die with
        the configuration (their handles fail NOT_FOUND / INVALID_STATE afterwards); calbins stay
        created but unconfigured; a CCU/DMA poison is cleared. Whether the runtime may rely on this
        is the ``reset_configuration_verified`` capability (§12, R12.7).
        """
        with self._cond:
            self._check_open()
            self._drop_configuration()
            for cb in self._calbins.values():
                cb.configured_profiles = ()
            self._resets += 1
            self._cond.notify_all()
            self._worker_cond.notify_all()

    def _drop_configuration(self) -> None:
        self.timeline.discard_all()
        self._buffers.clear()
        for kv in self._kvs.values():
            kv.invalidate()
        self._kvs.clear()
        self._engine_job = {JobEngine.PING: None, JobEngine.PONG: None}
        self._poisoned = None
        self._epoch += 1
        self._gate.forget()

    # --- KV managers -----------------------------------------------------------------------

    @vendor_boundary("VirtualDevice.CreateKvManager")
    def create_kv_manager(self, calbin: Calbin) -> SimKvManager:
        """The KvManager of a configured calbin (§11 step 7: after configure). One per calbin."""
        with self._lock:
            self._check_open()
            cb = self._calbin(calbin)
            if not cb.configured_profiles:
                raise VendorError(ReturnCode.INVALID_STATE, f"calbin {cb.name!r} is not configured")
            if any(k.calbin_id == cb.calbin_id for k in self._kvs.values()):
                raise VendorError(ReturnCode.ALREADY_EXISTS, f"calbin {cb.name!r} already has a KvManager")
            arch = cb.manifest.architecture
            shape = (arch.n_layers, arch.n_heads, arch.head_dim) if self.config.numerics else None
            epoch = self._epoch
            kv = SimKvManager(kv_manager_id=next(self._ids), calbin_id=cb.calbin_id, lock=self._lock,
                              max_sequences=cb.max_sequences, max_seq=arch.max_seq, shape=shape,
                              on_invalid=lambda: f"destroyed or reset after configuration epoch {epoch}")
            self._kvs[kv.kv_manager_id] = kv
            self._gate.forget()
            return kv

    @vendor_boundary("VirtualDevice.DestroyKvManager")
    def destroy_kv_manager(self, kv: KvManager) -> None:
        """Refused while sequences are live: free them first (§12 "free sequences/KV")."""
        with self._lock:
            self._check_open()
            if not isinstance(kv, SimKvManager) or self._kvs.get(kv.kv_manager_id) is not kv:
                raise VendorError(ReturnCode.NOT_FOUND, "the KvManager does not exist on this device")
            if kv.live_sequences():
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"KvManager {kv.kv_manager_id} still has {kv.live_sequences()} sequence(s); "
                                  "free them first (§12)")
            kv.invalidate()
            del self._kvs[kv.kv_manager_id]
            self._gate.forget()

    # --- buffers ---------------------------------------------------------------------------

    @vendor_boundary("VirtualDevice.AllocateBuffers")
    def allocate_job_buffers(self, calbin: Calbin, kind: JobKind, compiled_batch: int = 1) -> JobBuffers:
        """An InputBuf/OutputBuf pair sized from the profile's exact tensors (§14: one pair per job)."""
        with self._lock:
            self._check_open()
            self._gate.forget()
            return self._buffers.allocate(self._calbin(calbin), kind, compiled_batch, self._epoch)

    @vendor_boundary("VirtualDevice.FreeBuffers")
    def free_job_buffers(self, buffers: JobBuffers) -> None:
        """Refused (nothing freed) while either buffer is bound to an uncompleted job (§12)."""
        with self._lock:
            self._check_open()
            self._gate.forget()
            self._buffers.free(buffers, self._epoch)

    @vendor_boundary("VirtualDevice.ReadBuffer")
    def read_buffer(self, handle: BufferHandle) -> np.ndarray:
        """A copy of a buffer's current contents (output: logits rows; input: the DMA'd bytes)."""
        with self._lock:
            return settle(self._buffers.lookup(handle, self._epoch)).data.copy()

    # --- jobs ------------------------------------------------------------------------------

    def submit(self, job: JobSpec) -> JobTicket:
        """Validate, price and enqueue a job; raises on refusal (rc on error). Its try is the vendor boundary (#20).
        The null device's Submit is its plan's instead (:meth:`NullDecodePlan.submit <.null_plan.NullDecodePlan.
        submit>`, set as this instance's ``submit`` at its creation): a decode step of a known route taken there in
        the same frame, every other job this full path (:meth:`_submit_locked`)."""
        with self._lock:  # the lock of ``_cond`` itself, entered without the Condition's Python-level __enter__
            try:
                return self._submit_locked(job)
            except Exception as exc:  # noqa: BLE001 - the boundary must catch everything the vendor raises
                mapped = submit_refusal(self._refused, exc)
                if mapped is exc:
                    raise
                raise mapped from exc

    def _submit_locked(self, job: JobSpec) -> JobTicket:
        if self._closed:
            self._check_open()  # raises
        if self._virtual:
            self.timeline.advance_virtual()
        decode = isinstance(job, DecodeJob)  # asked once: the null device's commit below asks again (issue #20)
        routed = decode and decode_step(job, self._gate.routes)  # type: ignore[arg-type]  # none while poisoned
        cb, kv, admitted, in_buf, out_buf = routed or self._gate.admit(job, decode, self._poisoned, self._epoch)
        if self._engine_job[job.engine] is not None:
            raise VendorError(ReturnCode.DEVICE_BUSY,
                              f"engine {job.engine.name} is running job {self._engine_job[job.engine]}")
        pending = self.timeline.pending
        if len(pending) >= cb.capabilities.max_inflight_jobs.value:
            raise VendorError(ReturnCode.DEVICE_BUSY, f"{len(pending)} job(s) in flight; the contract allows "
                                                      f"{cb.capabilities.max_inflight_jobs.value}")
        fault = self.faults.decide(job.kind, job.engine, admitted.valid_lanes)
        if fault is not None and fault.kind is InjectedFault.DEVICE_BUSY:
            raise VendorError(ReturnCode.DEVICE_BUSY, f"injected DeviceBusy ({fault.origin})")
        now = self.clock.now()
        other = JobEngine.PONG if job.engine is JobEngine.PING else JobEngine.PING
        other_job = pending.get(self._engine_job[other] or -1)
        finish: float | None = (now + admitted.duration_s if other_job is None  # CostModel.finish_time's first case
                                else self.cost.finish_time(now, admitted.duration_s, other_job.finish))
        if fault is not None and fault.kind is InjectedFault.TIMEOUT:
            finish = None
        job_id = JobId(next(self._ids))
        ticket = JobTicket(job_id, job.generation, job.kind, job.engine, cb.calbin_id, now)  # positional: once a job
        in_buf.pending = job  # the DMA: its bytes written when the buffer is read (SimBuffer.pending)
        self._submitted += 1
        if fault is None and finish is not None and finish <= now and self._null is not None and decode:
            return self._null.commit(ticket, job, kv, admitted.held)  # type: ignore[arg-type]  # a step off a route
        in_buf.bound_job = out_buf.bound_job = job_id
        for seq in admitted.held:  # every one as the checks above found it
            seq.inflight_job = job_id
        sim_job = SimJob(ticket, job, cb, kv, fault, finish, self._epoch, admitted.seqs)
        if self.completes_at_submit and finish is not None and finish <= now:
            # completed before submit returns, under the lock: never on the timeline, so nothing can discard it
            sim_job.executing = True
            self._publish(sim_job, compute(sim_job, self._lock), now)
        else:
            self.timeline.add(sim_job)
            self._engine_job[job.engine] = job_id
            self._worker_cond.notify_all()
        if self.timeline.sleepers:  # a Wait/WaitAny caller: the result (or the new job) may be what it waits for
            self._cond.notify_all()
        return ticket

    # --- completion --------------------------------------------------------------------------

    def compute(self, job: SimJob) -> Computed | None:
        """Numerics of a job (the timeline calls this outside the lock in real time)."""
        return compute(job, self._lock)

    def finalize(self, job: SimJob, computed: Computed | None, now: float) -> None:
        """Commit or discard a job's effects and publish its result (device lock held)."""
        if job.epoch != self._epoch or not self.timeline.remove(job.ticket.job_id):
            return  # discarded by reset while computing: it never completes
        self._publish(job, computed, now)

    def _publish(self, job: SimJob, computed: Computed | None, now: float) -> None:
        """A job's effects committed and its result published (device lock held; the job is off the timeline)."""
        job_id = job.ticket.job_id
        spec = job.spec
        engine = spec.engine
        out_buf = self._buffers.get(spec.buffers.output.buffer_id)
        output = out_buf.data if out_buf is not None else None
        result = completion_record(job, computed, output, self.config.numerics, self._engine_seq, now)
        job_rc = result.rc
        if job.fault is not None and fault_effects.poisons(job_rc) and self.config.fault_requires_reset:
            self._poisoned = job_rc
            self._gate.forget()  # no route while poisoned: every job meets the full checks, which refuse it
        self._buffers.unbind(job_id, spec.buffers)
        if self._engine_job[engine] == job_id:
            self._engine_job[engine] = None
        self._completed[job_rc] += 1  # a completion per engine is its engine_sequence (completion_record)
        self.timeline.done[job_id] = result

    def poll(self) -> list[JobResult]:
        """Every completed, uncollected result (virtual time: those due at ``clock.now()``); with none published, []
        and no lock taken in real time (#20: the actor polls after each submit). Its try is the vendor boundary."""
        timeline = self.timeline
        if not self._virtual and not timeline.done:
            return []
        try:
            if self._virtual:
                timeline.advance_virtual()
            with self._lock:
                return timeline.drain()  # a result published meanwhile is the next poll's
        except Exception as exc:  # noqa: BLE001 - the boundary must catch everything the vendor raises
            mapped = translated(exc, "VirtualDevice.poll")
            if mapped is exc:
                raise
            raise mapped from exc

    @vendor_boundary("VirtualDevice.Wait")
    def wait(self, job_id: JobId, timeout_s: float) -> JobResult:
        """Wait for one job; raises DeviceTimeout (rc TIMEOUT) if it is not done in ``timeout_s``.

        The job stays in flight after a timeout (its buffers stay bound). Virtual time: the
        FakeClock is advanced to the completion instant, or by ``timeout_s`` on a timeout.
        """
        return self.timeline.wait(job_id, timeout_s)

    @vendor_boundary("VirtualDevice.WaitAny")
    def wait_any(self, timeout_s: float) -> list[JobResult]:
        """Every completed result, waiting up to ``timeout_s`` for at least one ([] on timeout)."""
        return self.timeline.wait_any(timeout_s)

    def next_completion_time(self) -> float | None:
        """The earliest completion instant of an in-flight job (None: nothing will complete)."""
        with self._lock:
            return self.timeline.next_instant()

    def inflight(self) -> tuple[JobTicket, ...]:
        with self._lock:
            return tuple(j.ticket for j in self.timeline.pending.values())

    @vendor_boundary("VirtualDevice.ReadMem")
    def read_mem(self, chip: int) -> MemInfo:
        return self.memory.read_mem(chip)

    # --- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Tear the device down (a process restart): jobs are discarded, memory is released.

        Idempotent. After close the runtime may create a new physical device (R3.4 counts live
        devices).
        """
        with self._cond:
            if self._closed:
                return
            self._drop_configuration()
            for cb in list(self._calbins.values()):
                self.memory.release(f"calbin:{cb.calbin_id}")
            self._calbins.clear()
            self._closed = True
            self._cond.notify_all()
            self._worker_cond.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5.0)
        self._runtime._closed(self)

    def __enter__(self) -> SimVirtualDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statistics(self) -> DeviceStatistics:
        return _device_statistics(self)

    # --- lookups -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise VendorError(ReturnCode.INVALID_STATE, "the VirtualDevice is closed")

    def _calbin(self, calbin: Calbin) -> SimCalbin:
        cb = self._calbins.get(calbin.calbin_id)
        if cb is not calbin:
            raise VendorError(ReturnCode.NOT_FOUND, f"calbin {calbin.calbin_id} does not exist on this device")
        return cb



def submit_refusal(refused: Counter[ReturnCode], exc: Exception) -> Exception:
    """What Submit raises for ``exc`` raised inside it (the vendor boundary's translation), a refusal counted in
    ``refused`` by its rc; ``exc`` itself when it is raised as it is. The one rule of both Submits (the device's,
    its null plan's)."""
    if isinstance(exc, VendorError):
        refused[exc.rc] += 1
    return translated(exc, "VirtualDevice.Submit")


def _completed(device: SimVirtualDevice) -> dict[ReturnCode, int]:
    """The device's completions by rc: those its full path published and the null plan's steps (each OK), which
    the plan counts once as ``submitted`` instead of a second count per step (issue #20)."""
    completed = dict(device._completed)
    routed = device._null.submitted if device._null is not None else 0
    if routed:
        completed[ReturnCode.OK] = completed.get(ReturnCode.OK, 0) + routed
    return completed


def _device_statistics(device: SimVirtualDevice) -> DeviceStatistics:
    """A consistent snapshot of the device's counters (under its lock)."""
    with device._lock:
        timeline = device.timeline
        return DeviceStatistics(
            physical_index=device._physical_index, time_mode=device.config.time_mode, numerics=device.config.numerics,
            closed=device._closed, config_epoch=device._epoch, calbins=len(device._calbins),
            configured_calbins=sum(1 for c in device._calbins.values() if c.configured_profiles),
            kv_managers=len(device._kvs), buffers=len(device._buffers), buffers_bound=device._buffers.bound(),
            inflight=len(timeline.pending),
            inflight_never_completing=sum(1 for j in timeline.pending.values() if j.finish is None),
            submitted=device._submitted + (device._null.submitted if device._null is not None else 0),
            submit_refused=MappingProxyType(dict(device._refused)),
            completed=MappingProxyType(_completed(device)),
            completed_per_engine=MappingProxyType({e: n for e, n in device._engine_seq.items() if n}),
            results_uncollected=len(timeline.done), discarded_by_reset=timeline.discarded_count,
            resets=device._resets, wait_timeouts=timeline.wait_timeouts, poisoned=device._poisoned,
            memory=device.memory.statistics(), faults=device.faults.statistics())
