"""A deferred admission cache is the cache built at once, whenever it is first read (issue #20, session 26).

Why: the replan builds its cache :meth:`~.on_time_cache._EdfCache.deferred`; admission's decisions read it (placements,
refusals, the HTTP front's snapshot), so the deferral must change nothing — even when the planner's kept list, which
it was given, grows with admissions before the first read.
"""

from __future__ import annotations

import pytest

from hypothesis import given
from hypothesis import strategies as st

from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob
from calculet.runtime.scheduling.on_time_cache import _EdfCache

_models = st.builds(DeviceModel, decode_step_s=st.floats(1e-3, 0.1), compiled_batch=st.sampled_from([1, 4]),
                    engines=st.sampled_from([1, 2]), prefill_fixed_s=st.floats(0.0, 0.01),
                    prefill_per_token_s=st.floats(0.0, 1e-3), token_s=st.sampled_from([0.0, 0.05]),
                    slot_token_s=st.sampled_from([0.0, 0.2]))
_rows = st.lists(st.tuples(st.sampled_from([0, 5, 100]), st.integers(0, 50),
                           st.one_of(st.none(), st.floats(0.0, 30.0))),
                 max_size=20)
_fields = ("free", "min_slack", "latest", "on_lane")


@given(_rows, _rows, st.floats(0.0, 10.0), _models, st.sets(st.integers(0, 25)))
def test_a_deferred_cache_answers_as_the_cache_built_at_once(kept_rows: list[tuple[int, int, float | None]],
                                                             later: list[tuple[int, int, float | None]], now: float,
                                                             model: DeviceModel, spared: set[int]) -> None:
    kept = [PendingJob(i, tokens, steps, deadline) for i, (tokens, steps, deadline) in enumerate(kept_rows)]
    late_ok = frozenset(spared)
    eager = _EdfCache(list(kept), now, model, late_ok)
    deferred = _EdfCache.deferred(kept, now, model, late_ok)
    kept.extend(PendingJob(100 + i, t, s, d) for i, (t, s, d) in enumerate(later))  # admissions before the first read
    with pytest.raises(AttributeError):  # a reader that skips built() fails loudly, never reads a stale schedule
        deferred.free
    assert deferred.built() is deferred and deferred.built() is deferred  # built once, then as it is
    assert [getattr(deferred, f) for f in _fields] == [getattr(eager, f) for f in _fields]
    for tokens, steps, deadline in later:  # the same placements, and the state they leave
        assert deferred.place(tokens, steps, deadline, now, model) == eager.place(tokens, steps, deadline, now, model)
        assert [getattr(deferred, f) for f in _fields] == [getattr(eager, f) for f in _fields]
