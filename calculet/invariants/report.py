"""Running every formal check, and the documents that report it.

``run_checks`` is what ``python -m calculet.verify`` and the tests call; ``verification_document``
renders the body of ``specs/verification.md`` (verify writes it under specgen's banner);
``format_counterexample`` the readable tables a failure prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from calculet.invariants.checks import CheckResult, Counterexample, Progress, check_machine
from calculet.invariants.pool_checks import check_pool_bmc, check_pool_induction
from calculet.invariants.redundancy import check_pool_redundancy, check_system_redundancy
from calculet.invariants.reachability import check_pool_reachability, check_pool_vacuity
from calculet.invariants.strength import check_guards, check_pool_witnesses, check_redundancy, check_witnesses
from calculet.invariants.system_checks import check_system
from calculet.invariants.system_document import proof_scope
from calculet.invariants.traceability import software_figure
from calculet.machines import ALL_MACHINES
from calculet.machines.core import Machine
from calculet.machines.admission_budgets import AdmissionBudgetSystem
from calculet.machines.job_lanes import JobLaneSystem
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.pool import Pool
from calculet.machines.model_couplings import GenerationJobSystem, GenerationRequestSystem
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.system import CoupledSystem


@dataclass(frozen=True)
class VerifyOptions:
    lanes: int = 16
    depth: int = 10
    machines: tuple[str, ...] = ()  # empty: all
    pools: bool = True
    fast: bool = False
    # Coupled systems (requests × lanes): bounded model checking over a small instance; the
    # induction runs at the cutoff size that makes it hold for every size (see system_checks).
    system_requests: int = 3
    system_lanes: int = 3
    system_depth: int = 8


@dataclass
class VerifyRun:
    options: VerifyOptions
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0          # CPU time of the checks (time.process_time)
    process_seconds: float = 0.0  # CPU time of the whole process, imports included (set by verify)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]


def run_checks(options: VerifyOptions, machines: Iterable[type[Machine]], pools: Iterable[type[Pool]],
               progress: Progress | None = None, systems: Iterable[type[CoupledSystem]] = ()) -> VerifyRun:
    run = VerifyRun(options)
    start = time.process_time()
    for machine in machines:
        if options.machines and machine.definition.name not in options.machines:
            continue
        for result in check_machine(machine.definition, machine=machine):
            run.results.append(result)
        run.results.append(check_witnesses(machine.definition))
        run.results += check_guards(machine.definition)
        run.results += check_redundancy(machine.definition)
        if progress:
            progress(f"{machine.definition.name}: per-machine checks")
    if options.pools:
        for pool in pools:
            if options.machines and pool.definition.name not in options.machines \
                    and pool.definition.instance.definition.name not in options.machines:
                continue
            run.results.append(check_pool_witnesses(pool.definition))
            if not options.fast:  # informational, like the per-machine report (#17)
                run.results += check_pool_redundancy(pool.definition)
            run.results += check_pool_vacuity(pool.definition)
            run.results.append(check_pool_reachability(pool.definition))
            run.results += check_pool_induction(pool.definition, options.lanes)
            if progress:
                progress(f"{pool.definition.name}: induction over {options.lanes} lanes")
            if not options.fast:  # a search for counterexamples; the induction above is the proof
                run.results.append(check_pool_bmc(pool.definition, options.lanes, options.depth))
                if progress:
                    progress(f"{pool.definition.name}: bounded model checking to depth {options.depth}")
        for system in systems:
            if options.machines and system.definition.name not in options.machines:
                continue
            run.results += check_system(system.definition, requests=options.system_requests,
                                        lanes=options.system_lanes, progress=progress,
                                        depth=min(options.system_depth, getattr(system, "bmc_depth", options.system_depth)),
                                        reach=True, fast=options.fast)  # explicit search: cheap enough for --fast (#17)
            if not options.fast:
                run.results += check_system_redundancy(system.definition)
    run.seconds = time.process_time() - start
    return run


def summary_rows(run: VerifyRun) -> list[tuple[str, str, str, int, int, float]]:
    """(check, machine, result, passed, total, seconds) grouped by check and machine."""
    groups: dict[tuple[str, str], list[CheckResult]] = {}
    for r in run.results:
        groups.setdefault((r.check, r.machine), []).append(r)
    rows = []
    for (check, machine), items in groups.items():
        passed = sum(r.ok for r in items)
        if all(r.informational for r in items):
            verdict = "report"
        else:
            verdict = "proved" if passed == len(items) else "FAILED"
        if check in ("pool-bmc", "system-bmc") and verdict == "proved":
            verdict = "no bug found"
        rows.append((check, machine, verdict, passed, len(items), sum(r.seconds for r in items)))
    return rows


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return out


def format_counterexample(cx: Counterexample) -> str:
    """Pre-state, arguments and post-state side by side (or a bounded trace, step by step)."""
    lines = [f"invariant {cx.invariant} ({cx.rid or '—'}) broken by {cx.transition}"]
    if cx.trace and "system" in cx.trace[0]:
        return "\n".join(lines + _system_trace(cx.trace))
    if cx.trace:
        for step in cx.trace:
            head = f"step {step['step']}" + (f": lane {step['lane']} takes {step['transition']} {step['args']}"
                                               if step["step"] else ": initial pool")
            lines.append(head)
            pool = step["pool"]
            budget = {k: v for k, v in pool.items() if not k.startswith("lane")}
            if budget:
                lines.append(f"    {budget}")
            for key, lane in pool.items():
                if key.startswith("lane") and (lane.get("state") != "free" or step["step"] == 0 and key == "lane0"):
                    lines.append(f"    {key}: {lane}")
        return "\n".join(lines)
    names = list(dict.fromkeys([*cx.pre, *cx.post]))
    width = max([len(n) for n in names] + [8])
    lines.append(f"  {'variable':<{width}}  {'pre':>14}  {'post':>14}")
    for name in names:
        pre, post = cx.pre.get(name, ""), cx.post.get(name, "")
        mark = "  *" if pre != post else ""
        lines.append(f"  {name:<{width}}  {str(pre):>14}  {str(post):>14}{mark}")
    if cx.args:
        lines.append(f"  arguments: {cx.args}")
    return "\n".join(lines)


def _system_trace(trace: list[dict[str, Any]]) -> list[str]:
    """A coupled system's run, step by step: which request and lane moved, then every request
    that has left New and every lane that is not Free (the others are as they started)."""
    lines = []
    for step in trace:
        if step["step"] == 0:
            lines.append("step 0: initial system (requests New, lanes Free, nothing bound)")
        else:
            who = {"request": f"request {step['request']}", "lane": f"lane {step['lane']}"}.get(
                step.get("involves", ""), f"request {step['request']} on lane {step['lane']}")
            lines.append(f"step {step['step']}: {who} takes {step['transition']} {step['args']}")
        for key, values in step["system"].items():
            if key.startswith("request"):
                idle = values.get("state") == "new" and values.get("lane") == "none"
            else:
                idle = values.get("state") == "free"
            if step["step"] == 0 or not idle:  # the initial system in full: its parameters matter
                lines.append(f"    {key}: {values}")
    return lines


_COUPLED = (GenerationRequestSystem, GenerationJobSystem, JobLaneSystem, AdmissionBudgetSystem)
_LIVE_CHECKED = {  # what checks each coupled system's properties on the live runtime
    GenerationRequestSystem: "the runtime checks the counts on the live instances",   # ModelManager.counter_faults
    GenerationJobSystem: "the runtime checks the counts on the live instances",
    JobLaneSystem: "the runtime's job lane monitor evaluates every invariant on the live jobs and KV lanes",
    AdmissionBudgetSystem: "the runtime's budget monitor evaluates the budget's declared invariants on the "
                           "admission controller's counters and, at each step boundary, recounts them from the "
                           "live requests (counters_are_the_counted_requests)",
}
_SYSTEM_TITLES = {
    "RequestLaneSystem": "Requests × lanes (joint model)",
    "GenerationRequestSystem": "Generations × requests (joint model)",
    "GenerationJobSystem": "Generations × device jobs (joint model)",
    "JobLaneSystem": "Device jobs × KV lanes (joint model)",
    "AdmissionBudgetSystem": "Requests × admission budgets (joint model)",
}


def _system_scope(system: type, o: VerifyOptions, every: bool) -> str:
    """What a coupled system's induction covers: every size (the cutoff argument) or the encoded one."""
    sd = system.definition
    if system is RequestLaneSystem:
        return ("[request_lanes.md](request_lanes.md). Induction moves request 0 and lane 0 by every step "
                f"with R={o.system_requests}, L={o.system_lanes} symbolic instances and bindings that may "
                "name a lane outside them, which makes it hold for every R and L (argument in "
                "`calculet/invariants/system_checks.py`)")
    return (f"{' '.join(sd.doc.split(chr(10) * 2)[0].split()) if sd.doc else sd.name} Induction moves instance 0 of "
            f"each by every step with R={o.system_requests}, L={o.system_lanes} symbolic instances: "
            + ("this holds for every size" if every else
               "proved for this size only (an invariant counts every instance, or a step reads other "
               "instances" + (f" — {_LIVE_CHECKED[system]})"
                              if system in _LIVE_CHECKED else "; no runtime monitor checks it yet)")))


def _system_sections(run: VerifyRun) -> list[str]:
    """One section per coupled system checked: each invariant, how it was proved, and why each
    strengthening was needed."""
    o = run.options
    out: list[str] = []
    for system in (RequestLaneSystem, *_COUPLED):
        sd = system.definition
        results = [r for r in run.results if r.machine == sd.name and r.check.startswith("system")]
        if not results:
            continue
        ind = [r for r in results if r.check == "system-induction"]
        vac = [r for r in results if r.check == "system-vacuity"]
        bmc = [r for r in results if r.check == "system-bmc"]
        broken = {name for r in ind if not r.ok for name in (r.broken or [])}
        steps = [r for r in ind if r.subject != "(initial system)"]
        every = bool(steps) and "every R, L" in steps[0].detail
        rd, ld = sd.request.definition.name, sd.lane.definition.name
        scope = _system_scope(system, o, every)
        out += ["", f"## {_SYSTEM_TITLES.get(sd.name, sd.name)}", "",
                f"`{sd.name}`: R × {rd} and L × {ld} moved together, "
                f"{len(sd.steps)} coupled steps ({len(sd.variants)} row chains) — {scope}; bounded model checking "
                f"searches every run from the initial system ({bmc[0].subject if bmc else '—'}); vacuity: "
                f"{sum(r.ok for r in vac)}/{len(vac)} steps can fire under the invariants"
                + ("" if o.fast or sd.reach_depth else
                   "; reachability from the initial system not searched for this system (vacuity only)") + ".", ""]
        rows = []
        size = " (every R, L)" if every else f" (R={o.system_requests}, L={o.system_lanes})"
        # the invariants, then the step properties (#20): the same induction proves both (a step property has no
        # initiation: it speaks of steps), the same BMC searches both
        kinds = [(inv.name, inv.rid, "strengthening" if inv.strengthening else "asked", "initiation + ")
                 for inv in sd.invariants] + [(sp.name, sp.rid, "step", "") for sp in sd.step_properties]
        for name, rid, kind, initiation in kinds:
            if name in broken:
                how = "NOT INDUCTIVE"
            elif all(r.ok for r in ind):
                how = f"proved{size}: {initiation}{len(steps)} step variants"
            else:
                how = "not checked (another property failed)"
            if not bmc:
                search = "—"
            elif bmc[0].ok:
                search = f"no violation in any run of ≤{o.system_depth} steps"
            elif name in bmc[0].broken:
                search = "BROKEN: " + bmc[0].detail
            else:
                search = "holds on the failing run"
            rows.append(dict(property=f"`{name}`", requirement=rid, kind=kind, induction=how, bmc=search))
        out += [proof_scope(sd, results), ""]  # what holds for every size, what for the encoded one (#17)
        out += _table(rows, ["property", "requirement", "kind", "induction", "bmc"])
        notes = [inv for inv in sd.invariants if inv.strengthening]
        if notes:
            out += ["", "Strengthenings the solver forced (each rules out a counterexample to induction):", ""]
            out += [f"- `{inv.name}`: {inv.strengthening}." for inv in notes]
    return out


def _redundancy_section(run: VerifyRun) -> list[str]:
    """The invariants (per machine, pool and joint system) the others imply alone: informational,
    so a weakened copy of one cannot hide behind a stronger twin unnoticed (#17)."""
    implied = [r for r in run.results if r.check in ("redundancy", "pool-redundancy", "system-redundancy")
               and r.detail.startswith("implied")]
    checked = [r for r in run.results if r.check in ("redundancy", "pool-redundancy", "system-redundancy")]
    if not checked:
        return []
    out = ["", "## Redundancy (report)", "",
           f"{len(checked)} invariants checked against the others of their machine, pool or joint system (with "
           f"every instance invariant); {len(implied)} are implied by the others alone:", ""]
    out += [f"- `{r.machine}.{r.subject}`" for r in implied] or ["- none"]
    return out


def verification_document(run: VerifyRun) -> str:
    """``specs/verification.md`` without its banner: what the last run proved, and how."""
    o = run.options
    covered, total = software_figure()
    out = ["# Verification", "",
           f"What `python -m calculet.verify{' --fast' if o.fast else ''}` proved on the declarations, "
           f"with z3. Pools: induction over {o.lanes} lanes; bounded model checking from the empty pool "
           f"to depth {o.depth}. {run.seconds:.1f} s of CPU time for the checks"
           f"{f' ({run.process_seconds:.1f} s for the whole process, imports included)' if run.process_seconds else ''}"
           f", measured by the run that wrote this page; every solver query is bounded by z3's deterministic ``rlimit``, never by "
           f"wall-clock time, so the verdict does not depend on the machine's load. Result: "
           f"**{'everything holds' if run.ok else 'FAILURES'}**.", "",
           f"Requirement coverage ([software] R-ids with a proof or a test): {covered}/{total}.", "",
           "## Summary", ""]
    out += _table([dict(check=c, machine=m, result=v, passed=f"{p}/{t}", seconds=f"{s:.2f}")
                   for c, m, v, p, t, s in summary_rows(run)], ["check", "machine", "result", "passed", "seconds"])
    out += _machine_section(run)
    out += _pool_section(run)
    out += _system_sections(run)
    out += _redundancy_section(run)
    out += _failure_sections(run)
    out.append("")
    return "\n".join(out)


def _machine_section(run: VerifyRun) -> list[str]:
    """Every machine's invariants and step properties with their consecution status."""
    out = ["", "## Invariants and their proof status", "",
           "Consecution proves each invariant preserved by every declared transition (and its step",
           "properties for every transition); initiation proves it of the initial state.", ""]
    by_machine: dict[str, list[CheckResult]] = {}
    for r in run.results:
        by_machine.setdefault(r.machine, []).append(r)
    inv_rows = []
    for machine in ALL_MACHINES:
        d = machine.definition
        results = by_machine.get(d.name, [])
        cons = [r for r in results if r.check == "consecution"]
        broken = {r.counterexample.invariant for r in cons if r.counterexample}
        if not results:
            continue
        for prop in (*d.invariants, *d.all_step_properties):
            kind = "step" if prop in d.all_step_properties else "state"
            status = "BROKEN" if prop.name in broken else f"proved over {len(cons)} transitions"
            inv_rows.append(dict(machine=d.name, invariant=f"`{prop.name}`", kind=kind, requirement=prop.rid,
                                 status=status))
    return out + _table(inv_rows, ["machine", "invariant", "kind", "requirement", "status"])


def _pool_section(run: VerifyRun) -> list[str]:
    """The KV lane pool's invariants: induction and bounded model checking (none if not run)."""
    pool_results = [r for r in run.results if r.check.startswith("pool")]
    if not pool_results:
        return []
    o = run.options
    p = KvLanePool.definition
    out = ["", "## Pool properties", "",
           f"`{p.name}`: {p.instance.definition.name} × N with the pool's own rules ({p.spec}).", ""]
    ind = [r for r in pool_results if r.check == "pool-induction"]
    bmc = [r for r in pool_results if r.check == "pool-bmc"]
    rows = []
    for inv in p.invariants:
        rows.append(dict(property=f"`{inv.name}`", requirement=inv.rid,
                         induction=("proved, N=%d, %d transitions" % (o.lanes, len(ind)))
                         if all(r.ok for r in ind) else "not inductive",
                         bmc=bmc[0].detail if bmc else "—"))
    out += _table(rows, ["property", "requirement", "induction", "bmc"])
    out += ["", "Per-instance properties that lift to the whole pool (proved per machine above):", ""]
    out += [f"- `{m}.{n}`: {why}" for m, n, why in p.related]
    return out


def _failure_sections(run: VerifyRun) -> list[str]:
    """Each failure with its counterexample, then the (state, event) pairs refused by decision."""
    out: list[str] = []
    failures = run.failures()
    if failures:
        out += ["", "## Failures", ""]
        for r in failures:
            out += [f"### {r.check} — {r.machine} — {r.subject}", "", r.detail, ""]
            if r.counterexample:
                out += ["```", format_counterexample(r.counterexample), "```", ""]
    informational = [r for r in run.results if r.informational and "refused" in r.detail]
    if informational:
        out += ["", "## Where events are refused by decision (completeness)", "",
                "For these (state, event) pairs some values enable no row; the event is then refused with",
                "`TransitionNotAllowed`. Each is a decision of the declaration, not an accident.", ""]
        out += _table([dict(machine=r.machine, pair=r.subject, example=r.detail.replace("refused for some values, e.g. ", ""))
                       for r in informational], ["machine", "pair", "example"])
    return out
