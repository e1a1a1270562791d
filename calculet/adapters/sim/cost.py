"""Latency cost model of the simulated NPU.

The scheduler's decisions (profile selection §8, ping/pong §14, WRR §6) depend on how long jobs
take, so the simulator charges each job a modelled device time instead of its numpy time:

* prefill: a fixed launch cost plus a cost per prompt token;
* decode: a fixed step cost plus a cost per *compiled* lane — a compiled B16 graph computes all
  16 lanes whether they are valid or not, so an under-filled batch wastes device time (§16 "lane
  waste");
* null (``CostModel.null()``, ``--sim-cost null``): no device time *and* no numerics — the
  device answers every lane with :func:`~calculet.adapters.sim.model.pseudo_next_token`, so a
  benchmark measures the host alone (issue #20: host cost apart from simulated device cost);
* ping/pong: while the other engine is busy, a job progresses at rate ``pingpong_overlap``
  (1.0: perfect overlap; 0.0: the engines serialise). §14 warns that two in-flight jobs do not
  automatically mean 2B lanes computing at once; the overlap factor is how the simulator states
  that assumption explicitly instead of hiding it.

The figures are model assumptions, not measurements (the spec has none); benchmarks print them.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.errors import DefinitionError


@dataclass(frozen=True)
class CostModel:
    """Modelled device time in seconds."""

    prefill_fixed_s: float
    prefill_per_token_s: float
    decode_fixed_s: float
    decode_per_lane_s: float
    pingpong_overlap: float
    numerics: bool = True
    """False: the device computes no model (the null device); :class:`SimConfig` follows it."""

    def __post_init__(self) -> None:
        for name in ("prefill_fixed_s", "prefill_per_token_s", "decode_fixed_s", "decode_per_lane_s"):
            if getattr(self, name) < 0:
                raise DefinitionError(f"CostModel.{name} must be >= 0")
        if not 0.0 <= self.pingpong_overlap <= 1.0:
            raise DefinitionError(f"CostModel.pingpong_overlap {self.pingpong_overlap} not in [0, 1]")

    # --- presets ---------------------------------------------------------------------------

    @classmethod
    def reference(cls) -> CostModel:
        """An assumed shape for the reference dual-chiplet model (§13.1): memory-bound decode.

        A B1 step of 40 ms (≈25 tokens/s) is what streaming ~17 GiB of parameters at ~450 GB/s
        gives; each extra compiled lane adds 2.5 ms; prefill costs 0.6 ms per token.
        """
        return cls(prefill_fixed_s=5e-3, prefill_per_token_s=0.6e-3, decode_fixed_s=40e-3,
                   decode_per_lane_s=2.5e-3, pingpong_overlap=0.5)

    @classmethod
    def tiny(cls) -> CostModel:
        """Millisecond-scale costs for the tiny model: real-time tests stay fast."""
        return cls(prefill_fixed_s=0.2e-3, prefill_per_token_s=0.02e-3, decode_fixed_s=1e-3,
                   decode_per_lane_s=0.05e-3, pingpong_overlap=0.5)

    @classmethod
    def instant(cls) -> CostModel:
        """Zero device time: every job completes at its submit instant."""
        return cls(0.0, 0.0, 0.0, 0.0, 1.0)

    @classmethod
    def null(cls) -> CostModel:
        """The null device: zero device time and numerics off (pseudo-tokens, no logits), so what
        a benchmark measures is the host's own work per token."""
        return cls(0.0, 0.0, 0.0, 0.0, 1.0, numerics=False)

    # --- costs -----------------------------------------------------------------------------

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_fixed_s + self.prefill_per_token_s * tokens

    def decode_s(self, compiled_batch: int) -> float:
        """One decode step of a compiled-B graph (independent of how many lanes are valid)."""
        return self.decode_fixed_s + self.decode_per_lane_s * compiled_batch

    def device_bound_tokens_per_s(self, compiled_batch: int, active_lanes: int | None = None) -> float:
        """Decode throughput of one engine running back-to-back steps (no host overhead)."""
        lanes = compiled_batch if active_lanes is None else active_lanes
        step = self.decode_s(compiled_batch)
        return float("inf") if step == 0 else lanes / step

    def finish_time(self, start: float, duration: float, other_busy_until: float | None) -> float:
        """When a job of ``duration`` started at ``start`` ends, given the other engine's state.

        While the other engine is busy (until ``other_busy_until``) the job progresses at rate
        ``pingpong_overlap``; afterwards at full rate. Overlap 0 reproduces strict serialisation.
        """
        if other_busy_until is None or other_busy_until <= start or duration == 0:
            return start + duration
        rate = self.pingpong_overlap
        window = other_busy_until - start
        if rate > 0 and rate * window >= duration:
            return start + duration / rate
        return other_busy_until + (duration - rate * window)

    def statistics(self) -> CostModelStatistics:
        """The parameters and the derived device-bound throughput per common profile."""
        return CostModelStatistics(
            prefill_fixed_s=self.prefill_fixed_s, prefill_per_token_s=self.prefill_per_token_s,
            decode_fixed_s=self.decode_fixed_s, decode_per_lane_s=self.decode_per_lane_s,
            pingpong_overlap=self.pingpong_overlap,
            device_bound_tokens_per_s=tuple((b, self.device_bound_tokens_per_s(b)) for b in (1, 4, 8, 16)),
        )


@dataclass(frozen=True)
class CostModelStatistics:
    prefill_fixed_s: float
    prefill_per_token_s: float
    decode_fixed_s: float
    decode_per_lane_s: float
    pingpong_overlap: float
    device_bound_tokens_per_s: tuple[tuple[int, float], ...]
