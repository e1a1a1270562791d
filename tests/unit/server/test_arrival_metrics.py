"""The learned law of arrivals on /metrics (issue #13, R16.9-style series): what the B>1 rollout's reported finish
estimates assume about the traffic to come, visible to an operator."""

from __future__ import annotations

from types import SimpleNamespace

from calculet.runtime.scheduling.arrival_law import ArrivalLaw
from calculet.server.metrics_goodput import on_time


def _statistics(arrivals: object) -> SimpleNamespace:
    """An engine's statistics whose ``on_time`` part holds ``arrivals`` (the rest zero)."""
    o = SimpleNamespace(unfit=0, ttft_refused=0, shed_waiting=0, shed_admitted=0, rollouts=0, rollouts_skipped=0,
                        replans=0, at_risk=0, decode_cap=None, estimate=None, arrivals=arrivals)
    return SimpleNamespace(scheduler=SimpleNamespace(on_time=o))


def _samples(statistics: SimpleNamespace) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in on_time(statistics) for s in family.samples}  # type: ignore[arg-type]


def test_a_learned_burst_is_exported_as_its_regime_rates_and_changes() -> None:
    """A law that saw 1/s for 200 s then 10/s: regime high one-hot, each regime's rate, the changes counted.
    Catches: the regime not one-hot (or always ``single``), the high and low rates swapped, the current rate
    exported as the high one's label only, the changes counter left at 0."""
    law = ArrivalLaw(origin=0.0)
    t = 0.0
    for _ in range(200):
        t += 1.0
        law.arrived(t, 100, 50)
    for _ in range(600):
        t += 0.1
        law.arrived(t, 100, 50)
    a = law.statistics()
    got = _samples(_statistics(a))
    assert [got[("calculet_scheduler_arrival_regime", (("state", r),))] for r in ("single", "high", "low")] == \
        [0.0, 1.0, 0.0]
    assert got[("calculet_scheduler_arrival_rate_per_second", (("state", "high"),))] > 5
    assert got[("calculet_scheduler_arrival_rate_per_second", (("state", "low"),))] < 2
    assert got[("calculet_scheduler_arrival_rate_per_second", (("state", "current"),))] == a.rate_per_s
    assert got[("calculet_scheduler_arrival_regime_changes_total", ())] == a.regime_changes >= 1


def test_without_a_law_the_series_are_present_and_zero() -> None:
    """B1 (no law): the same series with bounded labels, regime ``single``, rates 0 — a dashboard never sees a
    series appear or vanish with the profile. Catches: series dropped when there is no law."""
    got = _samples(_statistics(None))
    assert got[("calculet_scheduler_arrival_regime", (("state", "single"),))] == 1.0
    assert {k[1] for k in got if k[0] == "calculet_scheduler_arrival_rate_per_second"} == \
        {(("state", r),) for r in ("current", "high", "low")}
    assert all(v == 0 for k, v in got.items() if k[0] == "calculet_scheduler_arrival_rate_per_second")
    assert got[("calculet_scheduler_arrival_regime_changes_total", ())] == 0
