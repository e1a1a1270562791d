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
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from calculet.adapters.calrt import (
    CALRT_VERSION,
    NO_SEQUENCE,
    BatchProfile,
    BufferHandle,
    BufferKind,
    Calbin,
    DecodeJob,
    DeviceCapabilities,
    GoldenVector,
    JobBuffers,
    JobId,
    JobKind,
    JobResult,
    JobSpec,
    JobTicket,
    KvManager,
    KvManagerMode,
    LaneResult,
    MaskContract,
    MemInfo,
    MemoryFootprint,
    PrefillJob,
    ReturnCode,
    StatusCounters,
    TensorRole,
    VendorError,
    vendor_boundary,
)
from calculet.machines.job import JobEngine
from calculet.packages.manifest import MANIFEST_FILE, CalbinManifest
from calculet.adapters.sim.cost import CostModel
from calculet.adapters.sim.faults import FaultDecision, FaultInjector, InjectedFault, FaultRule, FaultStatistics
from calculet.adapters.sim.kv import SimKvManager
from calculet.adapters.sim.memory import BoardPreset, MemoryLedger, MemoryStatistics
from calculet.adapters.sim.model import TinyConfig, TinyTransformer, pseudo_next_token, unpack_weights
from calculet.errors import DefinitionError
from calculet.clock import Clock, FakeClock, MonotonicClock


class TimeMode(str, enum.Enum):
    VIRTUAL = "virtual"
    """Completion instants on an injected FakeClock; nothing waits in real time."""
    REAL = "real"
    """A device worker thread completes jobs at their instants on the monotonic clock."""


@dataclass(frozen=True)
class SimConfig:
    """How a :class:`SimCalRT` builds its device.

    ``numerics=False`` keeps the cost model, KV lengths, faults and tags but computes no model:
    results carry deterministic pseudo-tokens (:func:`pseudo_next_token`) and no logits, for fast
    load simulation.
    """

    time_mode: TimeMode = TimeMode.VIRTUAL
    clock: Clock | None = None
    numerics: bool = True
    cost: CostModel = field(default_factory=CostModel.tiny)
    board: BoardPreset = field(default_factory=BoardPreset.tiny)
    fault_rules: tuple[FaultRule, ...] = ()
    fault_seed: int | None = None
    fault_rates: Mapping[InjectedFault, float] = field(default_factory=dict)
    fault_requires_reset: bool = True
    """After CCU_FAULT / DMA_UNKNOWN, new submits fail INVALID_STATE until reset (§12)."""
    wait_advances_clock: bool = True
    """Virtual time: ``wait``/``wait_any`` advance the FakeClock (waiting consumes virtual time)."""

    def resolved_clock(self) -> Clock:
        if self.time_mode is TimeMode.REAL:
            if self.clock is None:
                return MonotonicClock()
            if isinstance(self.clock, FakeClock):
                raise DefinitionError("TimeMode.REAL needs a real monotonic clock, not a FakeClock")
            return self.clock
        return self.clock if self.clock is not None else FakeClock()


# ---------------------------------------------------------------------------------------------
# Statistics records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeStatistics:
    version: str
    devices_created: int
    devices_refused: int
    live_devices: int


@dataclass(frozen=True)
class DeviceStatistics:
    physical_index: int
    time_mode: TimeMode
    numerics: bool
    closed: bool
    config_epoch: int
    calbins: int
    configured_calbins: int
    kv_managers: int
    buffers: int
    buffers_bound: int
    inflight: int
    inflight_never_completing: int
    submitted: int
    submit_refused: Mapping[ReturnCode, int]
    completed: Mapping[ReturnCode, int]
    completed_per_engine: Mapping[JobEngine, int]
    results_uncollected: int
    discarded_by_reset: int
    resets: int
    wait_timeouts: int
    poisoned: ReturnCode | None
    memory: MemoryStatistics
    faults: FaultStatistics


@dataclass(frozen=True)
class CalbinStatistics:
    calbin_id: int
    name: str
    configured_profiles: tuple[int, ...]
    prefill_calls: int
    prefill_tokens: int
    decode_calls: int
    decode_lanes: int


# ---------------------------------------------------------------------------------------------
# Calbin
# ---------------------------------------------------------------------------------------------


class SimCalbin:
    """A created calbin: manifest contract + (numerics on) the model ready to compute."""

    def __init__(self, calbin_id: int, package_dir: Path, manifest: CalbinManifest, manifest_bytes: bytes,
                 model: TinyTransformer | None) -> None:
        self._calbin_id = calbin_id
        self.package_dir = package_dir
        self.manifest = manifest
        self._sha = hashlib.sha256(manifest_bytes).hexdigest()
        self._profiles = manifest.batch_profiles()
        self._caps = manifest.device_capabilities()
        self._golden = manifest.golden_vectors()
        self._memory = manifest.memory_footprint()
        self.model = model
        self.configured_profiles: tuple[int, ...] = ()

    @property
    def calbin_id(self) -> int:
        return self._calbin_id

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def exact_submodel(self) -> str:
        return self.manifest.exact_submodel

    @property
    def package_sha256(self) -> str:
        """sha256 of manifest.json, which lists every file's sha256: the package's identity."""
        return self._sha

    @property
    def profiles(self) -> tuple[BatchProfile, ...]:
        return self._profiles

    @property
    def capabilities(self) -> DeviceCapabilities:
        return self._caps

    @property
    def golden(self) -> tuple[GoldenVector, ...]:
        return self._golden

    @property
    def memory(self) -> MemoryFootprint:
        return self._memory

    @property
    def vocab_size(self) -> int:
        return self.manifest.architecture.vocab_size

    @property
    def eos_token(self) -> int:
        return self.manifest.architecture.special_tokens.eos

    @property
    def bos_token(self) -> int:
        return self.manifest.architecture.special_tokens.bos

    @property
    def max_sequences(self) -> int:
        return self.manifest.memory.max_sequences

    @vendor_boundary("Calbin.profile")
    def profile(self, compiled_batch: int) -> BatchProfile:
        for p in self._profiles:
            if p.compiled_batch == compiled_batch:
                return p
        raise VendorError(ReturnCode.NOT_FOUND, f"calbin {self.name!r} has no B{compiled_batch} profile; "
                                                f"it has {[p.compiled_batch for p in self._profiles]}")

    def statistics(self) -> CalbinStatistics:
        m = self.model.statistics() if self.model is not None else None
        return CalbinStatistics(
            calbin_id=self._calbin_id, name=self.name, configured_profiles=self.configured_profiles,
            prefill_calls=m.prefill_calls if m else 0, prefill_tokens=m.prefill_tokens if m else 0,
            decode_calls=m.decode_calls if m else 0, decode_lanes=m.decode_lanes if m else 0)


# ---------------------------------------------------------------------------------------------
# Internal records
# ---------------------------------------------------------------------------------------------


@dataclass
class _Buffer:
    handle: BufferHandle
    calbin_id: int
    epoch: int
    data: np.ndarray
    bound_job: int | None = None


@dataclass
class _Job:
    ticket: JobTicket
    spec: JobSpec
    calbin: SimCalbin
    kv: SimKvManager
    fault: FaultDecision | None
    finish: float | None
    epoch: int
    seqs: tuple[int, ...]
    executing: bool = False


@dataclass
class _Computed:
    """Numerics of a job, computed outside the lock and committed under it."""

    k_rows: list[np.ndarray | None]
    v_rows: list[np.ndarray | None]
    logits: list[np.ndarray | None]
    tokens: list[int | None]


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
        self._buffers: dict[int, _Buffer] = {}
        self._pending: dict[int, _Job] = {}
        self._done: dict[int, JobResult] = {}
        self._discarded: set[int] = set()
        self._engine_job: dict[JobEngine, int | None] = {JobEngine.PING: None, JobEngine.PONG: None}
        self._engine_seq: dict[JobEngine, int] = {JobEngine.PING: 0, JobEngine.PONG: 0}
        self._poisoned: ReturnCode | None = None
        self._submitted = 0
        self._refused: Counter[ReturnCode] = Counter()
        self._completed: Counter[ReturnCode] = Counter()
        self._per_engine: Counter[JobEngine] = Counter()
        self._discarded_count = 0
        self._resets = 0
        self._wait_timeouts = 0
        self._worker: threading.Thread | None = None
        if config.time_mode is TimeMode.REAL:
            self._worker = threading.Thread(target=self._work, name=f"calrt-sim-dev{physical_index}", daemon=True)
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
        """Load a calbin package (already verified by packages.py) and reserve its memory.

        Memory is checked first, so a second large model fails OUT_OF_MEMORY with the figures
        (§13.1); then co-residency, which 0.7.6 does not offer (§13.2: NOT_SUPPORTED).
        """
        path = Path(package_dir)
        manifest_bytes = (path / MANIFEST_FILE).read_bytes() if (path / MANIFEST_FILE).is_file() else b""
        manifest = CalbinManifest.from_path(path)
        model = self._load_model(path, manifest) if self.config.numerics else None
        with self._lock:
            self._check_open()
            calbin_id = next(self._ids)
            calbin = SimCalbin(calbin_id, path, manifest, manifest_bytes, model)
            for p in calbin.profiles:
                pol = p.inactive_policy
                if pol.inactive_writes_kv or pol.kv_manager_mode is not KvManagerMode.PER_SEQUENCE:
                    raise VendorError(ReturnCode.NOT_SUPPORTED,
                                      f"profile B{p.compiled_batch}: the simulated NPU implements only "
                                      "per-sequence KV with inactive lanes that write no KV")
            owner = f"calbin:{calbin_id}"
            self.memory.reserve_calbin(owner, f"calbin {manifest.name!r}", calbin.memory)
            others = list(self._calbins.values())
            if others and not (calbin.capabilities.model_coresidency.value
                               and all(o.capabilities.model_coresidency.value for o in others)):
                self.memory.release(owner)
                names = ", ".join(repr(o.name) for o in others)
                raise VendorError(ReturnCode.NOT_SUPPORTED,
                                  f"calbin {manifest.name!r} cannot be co-resident with {names}: multi-model "
                                  "residency is not a CalRT 0.7.6 capability (§13.2, C3); drain and destroy the "
                                  "resident calbin first (time-switching, §13.1)")
            self._calbins[calbin_id] = calbin
            return calbin

    def _load_model(self, path: Path, manifest: CalbinManifest) -> TinyTransformer:
        arch = manifest.architecture
        weights_path = path / arch.weights_file
        try:
            blob = weights_path.read_bytes()
        except OSError as exc:
            raise VendorError(ReturnCode.NOT_FOUND, f"cannot read weights {weights_path}: {exc}") from exc
        expected = manifest.files[arch.weights_file].size
        if len(blob) != expected:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"weights file is {len(blob)} bytes, manifest says {expected}")
        cfg = TinyConfig(vocab_size=arch.vocab_size, d_model=arch.d_model, n_layers=arch.n_layers,
                         n_heads=arch.n_heads, d_ff=arch.d_ff, max_seq=arch.max_seq, norm_eps=arch.norm_eps,
                         seed=arch.seed, bos=arch.special_tokens.bos, eos=arch.special_tokens.eos,
                         pad=arch.special_tokens.pad, unk=arch.special_tokens.unk)
        index = tuple((t.name, tuple(t.shape), t.offset) for t in arch.tensors)
        if tuple((n, s) for n, s, _ in index) != cfg.tensor_shapes():
            raise VendorError(ReturnCode.INVALID_ARGUMENT, "weight tensor index does not match the architecture")
        try:
            return TinyTransformer(cfg, unpack_weights(blob, index))
        except DefinitionError as exc:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, str(exc)) from exc

    @vendor_boundary("VirtualDevice.DestroyCalbin")
    def destroy_calbin(self, calbin: Calbin) -> None:
        """Refused while the calbin has jobs, buffers or a KvManager (§12 order: buffers, KvManager,
        Calbin; a forced delete is not a cancellation)."""
        with self._lock:
            self._check_open()
            cb = self._calbin(calbin)
            jobs = [j for j in self._pending.values() if j.calbin is cb]
            if jobs:
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"calbin {cb.name!r} has {len(jobs)} job(s) in flight; they must complete or the "
                                  "device be reset first (§12)")
            bufs = sum(1 for b in self._buffers.values() if b.calbin_id == cb.calbin_id)
            kvs = sum(1 for k in self._kvs.values() if k.calbin_id == cb.calbin_id)
            if bufs or kvs:
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"calbin {cb.name!r} still has {bufs} buffer(s) and {kvs} KvManager(s); destroy "
                                  "them first (§12)")
            cb.configured_profiles = ()
            self.memory.release(f"calbin:{cb.calbin_id}")
            del self._calbins[cb.calbin_id]

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
            available = [p.compiled_batch for p in cb.profiles]
            chosen = tuple(sorted(set(available if profiles is None else profiles)))
            missing = [b for b in chosen if b not in available]
            if missing or not chosen:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"calbin {cb.name!r} has profiles {available}; cannot configure {list(chosen)}")
            if len(chosen) > 1 and not cb.capabilities.multi_profile_residency.value:
                raise VendorError(ReturnCode.NOT_SUPPORTED,
                                  f"configuring profiles {list(chosen)} together needs multi-profile residency, "
                                  "which this calbin does not offer (§8: one fixed profile per instance)")
            for other in self._calbins.values():
                if other is not cb and other.configured_profiles:
                    global_cfg = cb.capabilities.configure_device_global.value or \
                        other.capabilities.configure_device_global.value
                    if global_cfg or not cb.capabilities.model_coresidency.value:
                        raise VendorError(ReturnCode.INVALID_STATE,
                                          f"calbin {other.name!r} is configured and configure is device-global on "
                                          "CalRT 0.7.6; drain it and reset the configuration or destroy it first "
                                          "(§11, §13.1)")
            if any(j.calbin is cb for j in self._pending.values()):
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"calbin {cb.name!r} has jobs in flight; cannot reconfigure")
            cb.configured_profiles = chosen

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

    def _drop_configuration(self) -> None:
        for job_id in list(self._pending):
            self._discarded.add(job_id)
            self._discarded_count += 1
        self._pending.clear()
        for buf_id in list(self._buffers):
            self.memory.release(f"buffer:{buf_id}")
        self._buffers.clear()
        for kv in self._kvs.values():
            kv.invalidate()
        self._kvs.clear()
        self._engine_job = {JobEngine.PING: None, JobEngine.PONG: None}
        self._poisoned = None
        self._epoch += 1

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

    # --- buffers ---------------------------------------------------------------------------

    @vendor_boundary("VirtualDevice.AllocateBuffers")
    def allocate_job_buffers(self, calbin: Calbin, kind: JobKind, compiled_batch: int = 1) -> JobBuffers:
        """An InputBuf/OutputBuf pair sized from the profile's exact tensors (§14: one pair per job)."""
        with self._lock:
            self._check_open()
            cb = self._calbin(calbin)
            if compiled_batch not in cb.configured_profiles:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"profile B{compiled_batch} is not configured (configured: "
                                  f"{list(cb.configured_profiles)})")
            if kind is JobKind.PREFILL and compiled_batch != 1:
                raise VendorError(ReturnCode.INVALID_ARGUMENT, "prefill runs one sequence: use compiled_batch=1")
            profile = cb.profile(compiled_batch)
            vocab = cb.vocab_size
            if kind is JobKind.DECODE:
                in_bytes = sum(t.nbytes for t in profile.tensors
                               if t.role is TensorRole.INPUT and not t.name.startswith("prefill_"))
                out_rows = compiled_batch
            else:
                in_bytes = profile.tensor("prefill_tokens").nbytes
                out_rows = 1
            out_bytes = out_rows * vocab * profile.logit_dtype.itemsize
            handles: list[BufferHandle] = []
            try:
                for bkind, nbytes in ((BufferKind.INPUT, in_bytes), (BufferKind.OUTPUT, out_bytes)):
                    buf_id = next(self._ids)
                    self.memory.reserve_bytes(f"buffer:{buf_id}", f"{bkind.value} buffer {buf_id}", nbytes)
                    handle = BufferHandle(buf_id, bkind, kind, compiled_batch, nbytes)
                    data = (np.zeros(nbytes, dtype=np.uint8) if bkind is BufferKind.INPUT
                            else np.zeros((out_rows, vocab), dtype=np.float64))
                    self._buffers[buf_id] = _Buffer(handle, cb.calbin_id, self._epoch, data)
                    handles.append(handle)
            except VendorError:
                for h in handles:
                    self.memory.release(f"buffer:{h.buffer_id}")
                    del self._buffers[h.buffer_id]
                raise
            return JobBuffers(input=handles[0], output=handles[1])

    @vendor_boundary("VirtualDevice.FreeBuffers")
    def free_job_buffers(self, buffers: JobBuffers) -> None:
        """Refused (nothing freed) while either buffer is bound to an uncompleted job (§12)."""
        with self._lock:
            self._check_open()
            bufs = [self._buffer(h) for h in (buffers.input, buffers.output)]
            for b in bufs:
                if b.bound_job is not None:
                    raise VendorError(ReturnCode.BUFFER_IN_USE,
                                      f"buffer {b.handle.buffer_id} is bound to job {b.bound_job}, which has not "
                                      "completed; it is released only by completion or reset (§12)")
            for b in bufs:
                self.memory.release(f"buffer:{b.handle.buffer_id}")
                del self._buffers[b.handle.buffer_id]

    @vendor_boundary("VirtualDevice.ReadBuffer")
    def read_buffer(self, handle: BufferHandle) -> np.ndarray:
        """A copy of a buffer's current contents (output: logits rows; input: the DMA'd bytes)."""
        with self._lock:
            return self._buffer(handle).data.copy()

    # --- jobs ------------------------------------------------------------------------------

    @vendor_boundary("VirtualDevice.Submit")
    def submit(self, job: JobSpec) -> JobTicket:
        """Validate, price and enqueue a job on its engine; raises on refusal (rc on the error)."""
        with self._cond:
            try:
                return self._submit_locked(job)
            except VendorError as exc:
                self._refused[exc.rc] += 1
                raise

    def _submit_locked(self, job: JobSpec) -> JobTicket:
        self._check_open()
        self._advance_virtual()
        cb = self._calbin_by_id(job.calbin_id)
        if not cb.configured_profiles:
            raise VendorError(ReturnCode.INVALID_STATE, f"calbin {cb.name!r} is not configured")
        if self._poisoned is not None:
            raise VendorError(ReturnCode.INVALID_STATE,
                              f"device faulted ({self._poisoned.name}); it accepts no job until reset (§12)")
        caps = cb.capabilities
        if job.engine is JobEngine.PONG and not caps.ping_pong.value:
            raise VendorError(ReturnCode.NOT_SUPPORTED,
                              "engine PONG needs the ping/pong capability (§14, C1/C2), which this calbin does not offer")
        kv = self._kv_for(cb)
        if isinstance(job, DecodeJob):
            seqs, valid_lanes, duration = self._validate_decode(job, cb, kv)
        else:
            seqs, valid_lanes, duration = self._validate_prefill(job, cb, kv)
        in_buf, out_buf = self._validate_buffers(job, cb)
        if self._engine_job[job.engine] is not None:
            raise VendorError(ReturnCode.DEVICE_BUSY,
                              f"engine {job.engine.name} is running job {self._engine_job[job.engine]}")
        if len(self._pending) >= caps.max_inflight_jobs.value:
            raise VendorError(ReturnCode.DEVICE_BUSY,
                              f"{len(self._pending)} job(s) in flight; the contract allows "
                              f"{caps.max_inflight_jobs.value}")
        fault = self.faults.decide(job.kind, job.engine, valid_lanes)
        if fault is not None and fault.kind is InjectedFault.DEVICE_BUSY:
            raise VendorError(ReturnCode.DEVICE_BUSY, f"injected DeviceBusy ({fault.origin})")
        now = self.clock.now()
        other = JobEngine.PONG if job.engine is JobEngine.PING else JobEngine.PING
        other_job = self._pending.get(self._engine_job[other] or -1)
        finish: float | None = self.cost.finish_time(now, duration, other_job.finish if other_job else None)
        if fault is not None and fault.kind is InjectedFault.TIMEOUT:
            finish = None
        job_id = JobId(next(self._ids))
        ticket = JobTicket(job_id=job_id, generation=job.generation, kind=job.kind, engine=job.engine,
                           calbin_id=cb.calbin_id, submitted_at=now)
        in_buf.data[:] = 0
        payload = self._payload(job)
        in_buf.data[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)[: len(in_buf.data)]
        in_buf.bound_job = out_buf.bound_job = job_id
        for s in seqs:
            kv.lookup(s).inflight_job = job_id
        self._pending[job_id] = _Job(ticket, job, cb, kv, fault, finish, self._epoch, seqs)
        self._engine_job[job.engine] = job_id
        self._submitted += 1
        self._cond.notify_all()
        return ticket

    @staticmethod
    def _payload(job: JobSpec) -> bytes:
        if isinstance(job, DecodeJob):
            return (np.asarray(job.token_ids, dtype="<i4").tobytes() + np.asarray(job.positions, dtype="<i4").tobytes()
                    + np.asarray(job.lane_valid, dtype=np.uint8).tobytes()
                    + np.asarray(job.seq_ids, dtype="<i4").tobytes())
        return np.asarray(job.tokens, dtype="<i4").tobytes()

    def _validate_decode(self, job: DecodeJob, cb: SimCalbin, kv: SimKvManager
                         ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        b = job.compiled_batch
        if b not in cb.configured_profiles:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"profile B{b} is not configured (configured: {list(cb.configured_profiles)})")
        profile = cb.profile(b)
        policy = profile.inactive_policy
        valid = np.asarray(job.lane_valid)
        if not np.all((valid == 0) | (valid == 1)):
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"lane_valid must be 0/1, got {valid.tolist()}")
        lanes = tuple(int(i) for i in np.flatnonzero(valid))
        if not lanes:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, "decode job with no valid lane")
        inactive = [i for i in range(b) if not valid[i]]
        if inactive and policy.mask is MaskContract.NONE:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"profile B{b} has no mask contract; lanes {inactive} cannot be inactive (§7.3)")
        for i in inactive:
            if int(job.token_ids[i]) != policy.fill_token:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"inactive lane {i} carries token {int(job.token_ids[i])}; profile B{b} fills "
                                  f"inactive lanes with {policy.fill_token} (§7.3: never pad with token 0)")
            sid = int(job.seq_ids[i])
            if sid != NO_SEQUENCE and not kv.exists(sid):
                raise VendorError(ReturnCode.NOT_FOUND, f"inactive lane {i} names unknown seq {sid}")
        seen: set[int] = set()
        for i in lanes:
            sid = int(job.seq_ids[i])
            if sid == NO_SEQUENCE:
                raise VendorError(ReturnCode.INVALID_ARGUMENT, f"valid lane {i} has no sequence")
            if sid in seen:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"seq {sid} appears in two valid lanes (§9.2: one seq, one lane)")
            seen.add(sid)
            seq = kv.lookup(sid)
            tok, pos = int(job.token_ids[i]), int(job.positions[i])
            if not 0 <= tok < cb.vocab_size:
                raise VendorError(ReturnCode.INVALID_ARGUMENT, f"lane {i} token {tok} outside vocab {cb.vocab_size}")
            if pos != seq.committed_len:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"lane {i} position {pos} != committed length {seq.committed_len} of seq {sid} "
                                  "(§9.2: position equals committed_len)")
            if pos + 1 > profile.max_seq:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"lane {i} position {pos} reaches max_seq {profile.max_seq} of profile B{b}")
            if seq.inflight_job is not None:
                raise VendorError(ReturnCode.INVALID_STATE, f"seq {sid} is being written by job {seq.inflight_job}")
        seqs = tuple(int(job.seq_ids[i]) for i in lanes)
        return seqs, lanes, self.cost.decode_s(b)

    def _validate_prefill(self, job: PrefillJob, cb: SimCalbin, kv: SimKvManager
                          ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        if 1 not in cb.configured_profiles:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, "prefill needs the B1 profile configured")
        profile = cb.profile(1)
        seq = kv.lookup(job.seq_id)
        tokens = np.asarray(job.tokens)
        if tokens.dtype.kind not in "iu" or tokens.min() < 0 or tokens.max() >= cb.vocab_size:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"prefill tokens must be integers in [0, {cb.vocab_size})")
        if job.start_position != seq.committed_len:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"prefill start {job.start_position} != committed length {seq.committed_len} of seq "
                              f"{job.seq_id} (§9.2)")
        if job.start_position > 0 and not cb.capabilities.incremental_prefill.value:
            raise VendorError(ReturnCode.NOT_SUPPORTED,
                              "prefill onto a non-empty sequence is incremental prefill, which this calbin does not "
                              "offer (§6: chunking only with explicit compiler/runtime support)")
        chunk = profile.prefill_chunk_tokens
        if job.start_position > 0 and chunk is not None and job.start_position % chunk:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"prefill chunk starts at {job.start_position}, not a multiple of the B1 profile's "
                              f"prefill_chunk_tokens {chunk} (§6)")
        if job.start_position + len(tokens) > profile.max_seq:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"prefill to {job.start_position + len(tokens)} tokens exceeds max_seq {profile.max_seq}")
        if seq.inflight_job is not None:
            raise VendorError(ReturnCode.INVALID_STATE, f"seq {job.seq_id} is being written by job {seq.inflight_job}")
        return (int(job.seq_id),), (0,), self.cost.prefill_s(len(tokens))

    def _validate_buffers(self, job: JobSpec, cb: SimCalbin) -> tuple[_Buffer, _Buffer]:
        bufs = job.buffers
        if bufs.input.buffer_id == bufs.output.buffer_id:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, "input and output buffer are the same buffer")
        out: list[_Buffer] = []
        for handle, want in ((bufs.input, BufferKind.INPUT), (bufs.output, BufferKind.OUTPUT)):
            b = self._buffer(handle)
            if b.calbin_id != cb.calbin_id or b.handle.kind is not want or b.handle.job_kind is not job.kind \
                    or b.handle.compiled_batch != job.compiled_batch:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"buffer {handle.buffer_id} ({b.handle.kind.value}, {b.handle.job_kind.value} "
                                  f"B{b.handle.compiled_batch}) does not fit a {job.kind.value} B{job.compiled_batch} "
                                  f"job's {want.value}")
            if b.bound_job is not None:
                raise VendorError(ReturnCode.BUFFER_IN_USE,
                                  f"buffer {handle.buffer_id} is bound to job {b.bound_job}, which has not completed "
                                  "(a timed-out job's buffers stay bound until reset, §12)")
            out.append(b)
        return out[0], out[1]

    # --- completion --------------------------------------------------------------------------

    def _compute(self, job: _Job) -> _Computed | None:
        """Numerics of a job, or None when a whole-job fault means nothing will be committed."""
        spec = job.spec
        fault = job.fault.kind if job.fault else None
        isolated = job.calbin.capabilities.lane_failure_isolation.value
        if fault is InjectedFault.DMA_UNKNOWN or (fault is InjectedFault.CCU_FAULT and not isolated):
            return None
        model = job.calbin.model
        kv = job.kv
        if isinstance(spec, DecodeJob):
            b = spec.compiled_batch
            lanes = spec.active_lanes
            k_rows: list[np.ndarray | None] = [None] * b
            v_rows: list[np.ndarray | None] = [None] * b
            logits: list[np.ndarray | None] = [None] * b
            tokens: list[int | None] = [None] * b
            if model is None:
                for i in lanes:
                    tokens[i] = pseudo_next_token(int(spec.token_ids[i]), int(spec.positions[i]))
                return _Computed(k_rows, v_rows, logits, tokens)
            with self._lock:
                pasts = [kv.past(kv.lookup(int(spec.seq_ids[i]))) for i in lanes]
            nk, nv, lg = model.decode(np.asarray(spec.token_ids)[list(lanes)], np.asarray(spec.positions)[list(lanes)],
                                      pasts)
            for j, i in enumerate(lanes):
                k_rows[i], v_rows[i], logits[i] = nk[j][:, None], nv[j][:, None], lg[j]
                tokens[i] = int(np.argmax(lg[j]))
            return _Computed(k_rows, v_rows, logits, tokens)
        assert isinstance(spec, PrefillJob)
        toks = np.asarray(spec.tokens)
        if model is None:
            last = pseudo_next_token(int(toks[-1]), spec.start_position + len(toks) - 1)
            return _Computed([None], [None], [None], [last])
        with self._lock:
            past_k, past_v = kv.past(kv.lookup(spec.seq_id))
        k, v, lg = model.prefill(toks, spec.start_position, past_k, past_v)
        return _Computed([k], [v], [lg], [int(np.argmax(lg))])

    def _finalize(self, job: _Job, computed: _Computed | None, now: float) -> None:
        """Commit or discard a job's effects and publish its result (device lock held)."""
        job_id = job.ticket.job_id
        if job.epoch != self._epoch or job_id not in self._pending:
            return  # discarded by reset while computing: it never completes
        del self._pending[job_id]
        spec = job.spec
        fault = job.fault.kind if job.fault else None
        isolated = job.calbin.capabilities.lane_failure_isolation.value
        profile = job.calbin.profile(spec.compiled_batch)
        policy = profile.inactive_policy
        if isinstance(spec, DecodeJob):
            b = spec.compiled_batch
            valid = [bool(x) for x in spec.lane_valid]
            seq_ids = [int(s) for s in spec.seq_ids]
            positions = [int(p) for p in spec.positions]
            n_tokens = [1] * b
        else:
            b, valid, seq_ids = 1, [True], [int(spec.seq_id)]
            positions = [spec.start_position]
            n_tokens = [len(spec.tokens)]
        job_rc = ReturnCode.OK
        lane_rc = [ReturnCode.OK] * b
        if fault is InjectedFault.CCU_FAULT:
            job_rc = ReturnCode.CCU_FAULT
            hit = set(job.fault.lanes if (isolated and job.fault and job.fault.lanes) else range(b))
            lane_rc = [ReturnCode.CCU_FAULT if (i in hit and valid[i]) else ReturnCode.OK for i in range(b)]
        elif fault is InjectedFault.DMA_UNKNOWN:
            job_rc = ReturnCode.DMA_UNKNOWN
            lane_rc = [ReturnCode.DMA_UNKNOWN if valid[i] else ReturnCode.OK for i in range(b)]
        out_buf = self._buffers.get(spec.buffers.output.buffer_id)
        lanes: list[LaneResult] = []
        kv_written = 0
        for i in range(b):
            sid = seq_ids[i]
            seq = job.kv.lookup(sid) if sid != NO_SEQUENCE and job.kv.exists(sid) else None
            if not valid[i]:
                row = (np.full(job.calbin.vocab_size, np.nan) if policy.inactive_logits_returned
                       and self.config.numerics else None)
                if row is not None and out_buf is not None:
                    out_buf.data[i] = row
                lanes.append(LaneResult(i, sid, False, ReturnCode.OK, positions[i],
                                        seq.committed_len if seq else 0, row, None))
                continue
            assert seq is not None
            ok = lane_rc[i] is ReturnCode.OK and computed is not None
            logits = computed.logits[i] if (ok and computed is not None) else None
            token = computed.tokens[i] if (ok and computed is not None) else None
            if ok and computed is not None:
                job.kv.commit(seq, computed.k_rows[i], computed.v_rows[i], n_tokens[i])
                kv_written += n_tokens[i]
                if logits is not None and out_buf is not None:
                    out_buf.data[i] = logits
            lanes.append(LaneResult(i, sid, True, lane_rc[i], positions[i], seq.committed_len,
                                    None if logits is None else logits.copy(), token))
        for sid in job.seqs:
            if job.kv.exists(sid):
                job.kv.lookup(sid).inflight_job = None
        if fault is InjectedFault.DMA_UNKNOWN and out_buf is not None:
            out_buf.data[:] = np.nan
        engine = spec.engine
        self._engine_seq[engine] += 1
        counters = StatusCounters(engine_sequence=self._engine_seq[engine], lanes_valid=sum(valid),
                                  tokens_processed=sum(n_tokens[i] for i in range(b) if valid[i]),
                                  kv_tokens_written=kv_written)
        if fault is InjectedFault.LANE_CROSSTALK and job.fault is not None:
            a, c = job.fault.lanes
            lanes[a], lanes[c] = lanes[c], lanes[a]
            if out_buf is not None:
                out_buf.data[[a, c]] = out_buf.data[[c, a]]
        if fault is InjectedFault.BAD_COUNTERS:
            counters = StatusCounters(engine_sequence=self._engine_seq[engine] - 1,
                                      lanes_valid=counters.lanes_valid + 1,
                                      tokens_processed=counters.tokens_processed + 1,
                                      kv_tokens_written=counters.kv_tokens_written)
        if job_rc in (ReturnCode.CCU_FAULT, ReturnCode.DMA_UNKNOWN) and self.config.fault_requires_reset:
            self._poisoned = job_rc
        for handle in (spec.buffers.input, spec.buffers.output):
            buf = self._buffers.get(handle.buffer_id)
            if buf is not None and buf.bound_job == job_id:
                buf.bound_job = None
        if self._engine_job[engine] == job_id:
            self._engine_job[engine] = None
        message = f"{job.fault.origin}" if job.fault and job_rc is not ReturnCode.OK else ""
        result = JobResult(job_id=job_id, generation=spec.generation, kind=spec.kind, engine=engine,
                           calbin_id=job.calbin.calbin_id, compiled_batch=spec.compiled_batch, rc=job_rc,
                           lanes=tuple(lanes), counters=counters, submitted_at=job.ticket.submitted_at,
                           completed_at=now, output_buffer=spec.buffers.output, message=message)
        self._completed[job_rc] += 1
        self._per_engine[engine] += 1
        self._done[job_id] = result

    def _due_locked(self, now: float) -> _Job | None:
        due = [j for j in self._pending.values() if not j.executing and j.finish is not None and j.finish <= now]
        return min(due, key=lambda j: (j.finish, j.ticket.job_id)) if due else None

    def _advance_virtual(self) -> None:
        """Virtual time: complete every job whose instant has passed, in instant order."""
        if self.config.time_mode is not TimeMode.VIRTUAL:
            return
        with self._cond:
            now = self.clock.now()
            while (job := self._due_locked(now)) is not None:
                job.executing = True
                assert job.finish is not None
                self._finalize(job, self._compute(job), job.finish)
            self._cond.notify_all()

    def _work(self) -> None:
        """Real time: the device's own worker completes jobs at their instants."""
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    now = self.clock.now()
                    job = self._due_locked(now)
                    if job is not None:
                        job.executing = True
                        break
                    nxt = self._next_locked()
                    self._cond.wait(None if nxt is None else max(0.0, nxt - now))
            try:
                computed = self._compute(job)
            except Exception:  # noqa: BLE001 - a numerics failure is a device fault, not a crash
                computed = None
                job.fault = FaultDecision(InjectedFault.CCU_FAULT, (), "simulator numerics raised")
            with self._cond:
                self._finalize(job, computed, self.clock.now())
                self._cond.notify_all()

    def _next_locked(self) -> float | None:
        times = [j.finish for j in self._pending.values() if j.finish is not None and not j.executing]
        return min(times) if times else None

    @vendor_boundary("VirtualDevice.poll")
    def poll(self) -> list[JobResult]:
        """Every completed, uncollected result (virtual time: those due at ``clock.now()``)."""
        self._advance_virtual()
        with self._lock:
            return self._drain()

    def _drain(self) -> list[JobResult]:
        out = list(self._done.values())
        self._done.clear()
        return out

    def _fake_clock(self) -> FakeClock | None:
        clock = self.clock
        if self.config.time_mode is TimeMode.VIRTUAL and self.config.wait_advances_clock and isinstance(clock, FakeClock):
            return clock
        return None

    @vendor_boundary("VirtualDevice.Wait")
    def wait(self, job_id: JobId, timeout_s: float) -> JobResult:
        """Wait for one job; raises DeviceTimeout (rc TIMEOUT) if it is not done in ``timeout_s``.

        The job stays in flight after a timeout (its buffers stay bound). Virtual time: the
        FakeClock is advanced to the completion instant, or by ``timeout_s`` on a timeout.
        """
        if timeout_s < 0:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"timeout {timeout_s} < 0")
        if self.config.time_mode is TimeMode.VIRTUAL:
            self._advance_virtual()
            with self._cond:
                result = self._take(job_id)
                if result is not None:
                    return result
                job = self._pending[job_id]
                fake = self._fake_clock()
                now = self.clock.now()
                if fake is not None and job.finish is not None and job.finish <= now + timeout_s:
                    fake.set(max(job.finish, now))
                    self._advance_virtual()
                    result = self._take(job_id)
                    assert result is not None
                    return result
                if fake is not None and timeout_s > 0:
                    fake.set(now + timeout_s)
                    self._advance_virtual()
                    result = self._take(job_id)
                    if result is not None:
                        return result
                self._wait_timeouts += 1
                raise VendorError(ReturnCode.TIMEOUT, f"job {job_id} not complete after {timeout_s} s")
        deadline = self.clock.now() + timeout_s
        with self._cond:
            while True:
                result = self._take(job_id)
                if result is not None:
                    return result
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    self._wait_timeouts += 1
                    raise VendorError(ReturnCode.TIMEOUT, f"job {job_id} not complete after {timeout_s} s")
                self._cond.wait(remaining)

    def _take(self, job_id: int) -> JobResult | None:
        """Pop a job's result; raise if the job is unknown or was discarded (lock held)."""
        if job_id in self._done:
            return self._done.pop(job_id)
        if job_id in self._pending:
            return None
        if job_id in self._discarded:
            raise VendorError(ReturnCode.INVALID_STATE,
                              f"job {job_id} was discarded by a reset; it will never complete")
        raise VendorError(ReturnCode.NOT_FOUND, f"job {job_id} is unknown or its result was already collected")

    @vendor_boundary("VirtualDevice.WaitAny")
    def wait_any(self, timeout_s: float) -> list[JobResult]:
        """Every completed result, waiting up to ``timeout_s`` for at least one ([] on timeout)."""
        if timeout_s < 0:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"timeout {timeout_s} < 0")
        if self.config.time_mode is TimeMode.VIRTUAL:
            self._advance_virtual()
            with self._cond:
                if self._done:
                    return self._drain()
                fake = self._fake_clock()
                now = self.clock.now()
                nxt = self._next_locked()
                if fake is not None:
                    fake.set(nxt if nxt is not None and nxt <= now + timeout_s else now + timeout_s)
                    self._advance_virtual()
                return self._drain()
        deadline = self.clock.now() + timeout_s
        with self._cond:
            while not self._done:
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    return []
                self._cond.wait(remaining)
            return self._drain()

    def next_completion_time(self) -> float | None:
        """The earliest completion instant of an in-flight job (None: nothing will complete)."""
        with self._lock:
            return self._next_locked()

    def inflight(self) -> tuple[JobTicket, ...]:
        with self._lock:
            return tuple(j.ticket for j in self._pending.values())

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
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5.0)
        self._runtime._closed(self)

    def __enter__(self) -> SimVirtualDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statistics(self) -> DeviceStatistics:
        with self._lock:
            return DeviceStatistics(
                physical_index=self._physical_index, time_mode=self.config.time_mode, numerics=self.config.numerics,
                closed=self._closed, config_epoch=self._epoch, calbins=len(self._calbins),
                configured_calbins=sum(1 for c in self._calbins.values() if c.configured_profiles),
                kv_managers=len(self._kvs), buffers=len(self._buffers),
                buffers_bound=sum(1 for b in self._buffers.values() if b.bound_job is not None),
                inflight=len(self._pending),
                inflight_never_completing=sum(1 for j in self._pending.values() if j.finish is None),
                submitted=self._submitted, submit_refused=MappingProxyType(dict(self._refused)),
                completed=MappingProxyType(dict(self._completed)),
                completed_per_engine=MappingProxyType(dict(self._per_engine)),
                results_uncollected=len(self._done), discarded_by_reset=self._discarded_count,
                resets=self._resets, wait_timeouts=self._wait_timeouts, poisoned=self._poisoned,
                memory=self.memory.statistics(), faults=self.faults.statistics())

    # --- lookups -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise VendorError(ReturnCode.INVALID_STATE, "the VirtualDevice is closed")

    def _calbin(self, calbin: Calbin) -> SimCalbin:
        cb = self._calbins.get(calbin.calbin_id)
        if cb is not calbin:
            raise VendorError(ReturnCode.NOT_FOUND, f"calbin {calbin.calbin_id} does not exist on this device")
        return cb

    def _calbin_by_id(self, calbin_id: int) -> SimCalbin:
        cb = self._calbins.get(calbin_id)
        if cb is None:
            raise VendorError(ReturnCode.NOT_FOUND, f"calbin {calbin_id} does not exist on this device")
        return cb

    def _kv_for(self, cb: SimCalbin) -> SimKvManager:
        for kv in self._kvs.values():
            if kv.calbin_id == cb.calbin_id:
                return kv
        raise VendorError(ReturnCode.INVALID_STATE, f"calbin {cb.name!r} has no KvManager")

    def _buffer(self, handle: BufferHandle) -> _Buffer:
        b = self._buffers.get(handle.buffer_id)
        if b is None or b.epoch != self._epoch:
            raise VendorError(ReturnCode.NOT_FOUND,
                              f"buffer {handle.buffer_id} does not exist (freed, or lost with a reset)")
        return b
