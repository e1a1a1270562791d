"""``specs/request_lanes.md``: the coupled request × lane system as a document (§9.2, §4).

Its steps (with the request and lane rows each can take), the binding and the invariants are
read from the :class:`~calculet.machines.system.CoupledSystem` declaration, like the machine
documents, so the document cannot drift from what :mod:`calculet.invariants.system_checks`
proves. :mod:`calculet.specgen` lists :func:`request_lanes_document` among its producers.
"""

from __future__ import annotations

from typing import Iterable

from calculet.invariants.checks import CheckResult
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.system import SystemDefinition, Variant

__all__ = ["proof_scope", "request_lanes_document", "system_document"]


def proof_scope(sd: SystemDefinition, results: Iterable[CheckResult]) -> str:
    """One sentence for ``specs/verification.md``: which of a coupled system's checks hold for every
    number of instances and which only for the instances encoded (#17: the counting properties),
    read from the results of the run that writes the page."""
    mine = [r for r in results if r.machine == sd.name]
    steps = [r for r in mine if r.check == "system-induction" and not r.subject.startswith("(")]
    every = bool(steps) and all("every R, L" in r.detail for r in steps)
    ghosts = every and any("ghost counts" in r.detail for r in steps)
    counts = [inv.name for inv in sd.invariants if inv.counts]
    always, encoded = [], []
    if every:
        which = f"each count ({', '.join(f'`{n}`' for n in counts)})" if counts else "each count a step guard reads"
        how = (f"{which} split into its encoded terms and a ghost for the "
               "instances not encoded, which no step changes (argument in `calculet/invariants/system_induction.py`)"
               if ghosts else "the cutoff argument in `calculet/invariants/system_checks.py`")
        always.append(f"initiation and the induction of all {_properties(sd)} — {how}")
    elif steps:
        why = steps[0].detail.split("(", 1)[1].split(")")[0] if "(" in steps[0].detail else "not every size"
        encoded.append(f"the induction of all {_properties(sd)} ({why})")
    found = [r for r in mine if r.check == "system-reachability"]
    if found:
        size = " × ".join(part.split("=")[1] for part in found[0].subject.split(", ")[:2])
        always.append(f"reachability of every step, on runs of {size} instances ({found[0].subject.split(', ', 2)[2]} "
                      "search) — a run of fewer instances is a run of more, the others idle")
    found = [r for r in mine if r.check == "system-bmc"]
    if found:
        encoded.append(f"bounded model checking ({found[0].subject}): no bug within the depth, for that many "
                       "instances")
    return (f"Proved for every size: {'; '.join(always) if always else 'nothing'}. "
            f"For the encoded instances only: {'; '.join(encoded) if encoded else 'nothing'}.")


def _properties(sd: SystemDefinition) -> str:
    """How many properties the induction proves ("7 properties", or "7 properties and 2 step properties")."""
    steps = len(sd.step_properties)
    return f"{len(sd.invariants)} properties" + (f" and {steps} step properties" if steps else "")


def request_lanes_document() -> str:
    """The document of the one coupled system calculet declares."""
    return system_document(RequestLaneSystem.definition)


def system_document(sd: SystemDefinition) -> str:
    """The coupled steps, the binding and the invariants of ``sd``, all read from the
    declaration (specgen puts its banner on top)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    def rows(v: Variant) -> tuple[str, str]:
        return (" → ".join(f"`{t.name}`" for t in v.request_rows) or "—",
                " → ".join(f"`{t.name}`" for t in v.lane_rows) or "—")

    rd, ld = sd.request.definition, sd.lane.definition
    out = [f"# {sd.name}", ""]
    if sd.spec:
        out += [f"Spec: {sd.spec}", ""]
    out += [sd.doc, "",
            f"Instances: R × `{rd.name}` ([request.md](request.md)) and L × `{ld.name}` "
            "([kv_sequence.md](kv_sequence.md)). Ghost state: `binding[i]` — the lane request *i* holds, "
            "or none; `seq[i]` — its KV sequence id (positive, shared with no other request). Lane *j* "
            "*names* request *i* when it holds `(seq[i], generation of i)`.", "",
            "## Steps", "",
            "Each step is atomic: the request rows and the lane rows fire together, on request *i* and "
            "lane *j*. An event (not a row name) fires the machine's first enabled row, as the runtime "
            "does; the row chains it can take are listed. *local*: the step reads only its own request "
            "and lane (so steps on other requests and lanes commute).", "",
            "| step | request rows | lane rows | binding | local | meaning |", "|---|---|---|---|---|---|"]
    for step in sd.steps:
        variants = sd.variants_of(step.name)
        req = sorted({rows(v)[0] for v in variants})
        lane = sorted({rows(v)[1] for v in variants})
        binding = {"keep": "—", "bind": "i → j", "unbind": "i → none"}[step.binding]
        out.append(f"| `{step.name}` | {'<br>'.join(req)} | {'<br>'.join(lane)} | {binding} | "
                   f"{'yes' if step.name in sd.local else 'no'} | {cell(step.doc)} |")
    out += ["", "## Invariants", "",
            "Proved by induction for every number of requests and lanes, and searched by bounded model "
            "checking from the initial system (`python -m calculet.verify`; results in "
            "[verification.md](verification.md)). *strengthening*: not asked for, but needed to make the "
            "others inductive; the note names the counterexample to induction it rules out.", "",
            "| invariant | requirement | kind | meaning |", "|---|---|---|---|"]
    for inv in sd.invariants:
        kind = "strengthening" if inv.strengthening else "asked"
        meaning = inv.doc + (f" — *needed because* {inv.strengthening}" if inv.strengthening else "")
        out.append(f"| `{inv.name}` | {inv.rid} | {kind} | {cell(meaning)} |")
    if sd.step_properties:
        out += ["", "## Step properties", "",
                "Properties of each step (the system before, the step taken, the system after), proved by the same "
                "induction for every number of requests and lanes (no state can express them: both states of a "
                "wrong step may satisfy every invariant).", "",
                "| property | requirement | meaning |", "|---|---|---|"]
        out += [f"| `{sp.name}` | {sp.rid} | {cell(sp.doc)} |" for sp in sd.step_properties]
    if sd.omitted:
        out += ["", "## Rows no step takes", ""]
        out += [f"- `{row}`: {why}" for row, why in sd.omitted]
    out.append("")
    return "\n".join(out)
