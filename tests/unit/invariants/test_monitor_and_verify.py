"""Run-time monitors, counterexample output and the verify command."""

from __future__ import annotations

import json

import pytest

from calculet import verify
from calculet.invariants.checks import check_machine
from calculet.machines.monitor import MONITOR
from calculet.invariants.mutation import derive, replace_row
from calculet.invariants.report import format_counterexample
from calculet.invariants.traceability import catalogue, software_figure, unknown_references
from calculet.machines import KvSequenceMachine, RequestMachine
from calculet.machines.errors import InvariantViolation


@pytest.mark.req("R9.2.3", "R17.2.3")
def test_a_variable_corrupted_behind_the_machines_back_is_caught_at_the_next_transition():
    kv = KvSequenceMachine.create(max_seq=8, lane=0)
    kv.fire("reserve", seq=1, gen=1, tokens=4)
    object.__setattr__(kv, "reserved_len", 99)  # corruption: no transition did this
    with pytest.raises(InvariantViolation) as caught:
        kv.fire("commit", tokens=1)
    assert caught.value.invariant == "lengths_ordered" and caught.value.rid == "R9.2.3"
    assert caught.value.pre["reserved_len"] == 99


def test_in_production_mode_violations_are_counted_not_raised():
    MONITOR.configure(enabled=True, mode="count")
    MONITOR.reset()
    r = RequestMachine.create(prompt_tokens=2, max_new_tokens=2, max_seq=8)
    object.__setattr__(r, "closes", 1)  # a close nobody performed
    r.fire("bind", gen=1)
    stats = MONITOR.statistics()
    assert stats.violations[("RequestMachine", "terminal_closed_once")] == 1
    assert stats.checks >= 1


def test_monitors_off_cost_nothing_and_check_nothing():
    MONITOR.configure(enabled=False)
    MONITOR.reset()
    r = RequestMachine.create(prompt_tokens=2, max_new_tokens=2, max_seq=8)
    object.__setattr__(r, "closes", 1)
    r.fire("bind", gen=1)
    assert MONITOR.statistics().checks == 0


def test_counterexample_is_a_readable_pre_post_table():
    mutant = derive(KvSequenceMachine, "KvOffByOne", lambda rows, d: replace_row(
        rows, "commit@active", effect=lambda v, tokens: {"committed_len": v.committed_len + tokens + 1}))
    failure = next(r for r in check_machine(mutant.definition, include=["consecution"]) if not r.ok)
    text = format_counterexample(failure.counterexample)
    assert "invariant lengths_ordered (R9.2.3) broken by commit@active" in text
    assert "committed_len" in text and "pre" in text and "post" in text and "*" in text


def test_traceability_catalogue_and_figure():
    ids = [r.id for r in catalogue()]
    assert len(ids) == 241 and len(set(ids)) == 241
    covered, total = software_figure()
    assert total == 185 and covered > 100
    assert unknown_references() == []


def test_verify_fast_passes_and_writes_json(tmp_path, capsys):
    out = tmp_path / "verify.json"
    code = verify.main(["--fast", "--machine", "KvSequenceMachine", "--machine", "KvLanePool",
                        "--lanes", "4", "--depth", "3", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["results"]
    printed = capsys.readouterr().out
    assert "consecution" in printed and "requirement coverage" in printed


def test_verify_rejects_bad_options():
    with pytest.raises(SystemExit):
        verify.main(["--lanes", "0"])
