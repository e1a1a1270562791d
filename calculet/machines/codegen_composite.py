"""One generated function for events of several machines that the runtime always fires together (issue #20).

Why: a B1 decode step (CalRT 0.7.6's only batch, spec §1, §8) ends with three events on three machines
(:data:`DECODE_STEP_DONE`) — the job's ``complete(ok=True)`` (:class:`~calculet.machines.job.DeviceJobMachine`), its KV lane's ``commit(tokens)``
(:class:`~calculet.machines.kv_sequence.KvSequenceMachine`, §9.2) and its request's ``decode_done``
(:class:`~calculet.machines.request.RequestMachine`, §7.4) — and each went through its own ``fire`` or
``fire_each`` frame and its (state, event) function: ~10 frames a token for ~40 lines of guards and effects
(docs/host_path.md, route 1); it is submitted with two, the job's ``submit`` and its request's ``submit_decode``
(:data:`DECODE_STEP_SUBMITTED`). A *composite* prints those events' rows, one after the other, into one function,
from the same z3 terms as each machine's own hot path (:mod:`.codegen`): the argument acceptance, the shared
atoms, the row tree, the effects, ``last_transition``. It is not a new machine and declares nothing: every
guard and effect still comes from the machines' declarations (``calculet/machines/*.py``), and the composite
means exactly "the events fired in sequence" — the conformance test (``tests/property/test_composite.py``) holds
it to that on reachable states of the three machines.

Per part, in order: the monitor's draw (the ``sampled`` variant: one ``next(draws)`` per event, as each machine's
``fire_sampled`` draws — ``draws`` is a parameter, the caller's ``MONITOR.draws``), the inline rows when the draw
missed and the arguments are of their declared types, else the exact path (``_exact``: the checked path when
the monitors are on, the refusal's reason) — exactly where the machine's own ``fire`` would send it. A part
that raises leaves the parts after it unfired, as a sequence of ``fire`` calls would. The rows of one
(state, event) sit in a one-pass ``while True`` loop that the row taken leaves with ``break`` (the machines'
hot path leaves with ``return``).

What cannot be a composite: the job's ``submit`` and ``complete`` (``JobLaneSystem``, ``job_lanes.py``: a job
left prepared while its lanes' steps are open is refused), and anything that is not one actor step. The
runtime's bookkeeping around the events (the jobs table, the KV manager's open steps and pool check, the
registry's listeners and sinks) stays the runtime's: the composite is the machines' part only.

``python -m calculet.specgen`` writes each composite of :data:`COMPOSITES` to ``calculet/machines/generated/``;
``--check`` fails when one is not what the declarations produce. The runtime binds it
(:func:`calculet.runtime.scheduling.completion.decode_step_done`) only when its recorded shapes are the
machines' (a stale module is not run: the events are then fired one by one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calculet.logic.symbolic import SymbolicVars, symbolic_args
from calculet.machines.codegen import _LocalArgPrinter, _arg_accept, _row_code
from calculet.machines.codegen_rows import conjuncts, guard_term, row_tree_lines, shared_atom_lines
from calculet.machines.core import Machine
from calculet.machines.job import DeviceJobMachine
from calculet.machines.kv_sequence import KvSequenceMachine
from calculet.machines.request import RequestMachine
from calculet.machines.written import qualified, shape

__all__ = ["COMPOSITES", "Composite", "Part", "composite_source"]


@dataclass(frozen=True)
class Part:
    """One event of a composite: fired on the instance passed as ``instance``, its arguments the composite's
    parameters named in ``args`` (event argument -> composite parameter)."""

    machine: type[Machine]
    instance: str
    event: str
    args: tuple[tuple[str, str], ...]
    literals: tuple[tuple[str, Any], ...] = ()
    """Event arguments with a fixed value (``ok=True``: the composite is the success path)."""


@dataclass(frozen=True)
class Composite:
    """Events fired in sequence, as one generated function ``fire_plain``/``fire_sampled`` over ``params``."""

    name: str
    doc: str
    params: tuple[str, ...]
    parts: tuple[Part, ...]


DECODE_STEP_DONE = Composite(
    "decode_step", "a B1 decode step done: the job completes, its lane commits, its request takes the token",
    ("job", "lane", "request", "tokens", "job_id", "stop"),
    (Part(DeviceJobMachine, "job", "complete", (), (("ok", True),)),
     Part(KvSequenceMachine, "lane", "commit", (("tokens", "tokens"),)),
     Part(RequestMachine, "request", "decode_done", (("job", "job_id"), ("stop", "stop")), (("ok", True),))))
"""Route 1 of docs/host_path.md: the completion of a B1 decode step whose lane succeeded (§7.4, §9.2)."""

DECODE_STEP_SUBMITTED = Composite(
    "decode_submit", "a B1 decode step submitted: the job goes on the device, its request's lane into the batch",
    ("job", "request", "job_id"),
    (Part(DeviceJobMachine, "job", "submit", ()),
     Part(RequestMachine, "request", "submit_decode", (("job", "job_id"),))))
"""The submit side of a B1 decode step (§7.4, §14): the lanes' steps open with no lane event (JobLaneSystem's
``enlist``), so two machines. Its ``submit`` is never folded with the job's ``complete`` (module doc)."""

COMPOSITES: tuple[Composite, ...] = (DECODE_STEP_DONE, DECODE_STEP_SUBMITTED)


def _part_lines(c: Composite, k: int, part: Part, sampled: bool, namespace: dict[str, Any]) -> list[str]:
    """Part ``k`` of ``c``: its draw, acceptance, rows per source state, and the exact path for the rest."""
    d = part.machine.definition
    ev = d.events[part.event]
    given = dict(part.args)
    literal = dict(part.literals)
    if set(given) | set(literal) != set(ev.args):
        raise ValueError(f"{c.name}: {d.name}.{part.event} takes {sorted(ev.args)}")
    target = f"_t{k}"
    lines = [f"    # {d.name}: --{part.event}--> on {part.instance}", f"    self = {part.instance}"]
    for name in ev.args:
        lines.append(f"    _a_{name} = {given[name] if name in given else repr(literal[name])}")
    accepts = [_arg_accept(f"_a_{name}", vtype, namespace) for name, vtype in ev.args.items() if name in given]
    test = " and ".join(["not next(draws)"] * sampled + accepts) or "True"
    lines += [f"    {target} = None", f"    if {test}:", "        state = self._state"]
    v = SymbolicVars(d)
    args = symbolic_args(ev)
    rows_by_state: dict[str, list[Any]] = {}
    for index, t in enumerate(d.transitions):
        if t.event == part.event:
            rows_by_state.setdefault(t.source, []).append((index, t))
    for n, (state, rows) in enumerate(rows_by_state.items()):
        tr = _LocalArgPrinter(d, set(ev.args))
        lines.append(f"        {'if' if n == 0 else 'elif'} state == {state!r}:")
        lines.append("            while True:  # one pass: the row taken leaves it")
        guards = [guard_term(t, v, args) for _, t in rows]
        lines += shared_atom_lines(guards, tr, "                ")
        tree = []
        for (index, t), guard in zip(rows, guards):
            _, assigns = _row_code(d, t, tr, v, args, namespace, guard)
            row = f"_p{k}_row_{index}"
            namespace[row] = (k, index)
            body = [f"self._state = {t.target!r}  # {t.name}"]
            if assigns:
                body.insert(0, f"{', '.join(f'self.{a}' for a, _ in assigns)} = {', '.join(v_ for _, v_ in assigns)}")
            body += [f"self.last_transition = {row}", f"{target} = {t.target!r}", "break"]
            tree.append((conjuncts(guard), body))
        lines += row_tree_lines(tree, tr, "                ")
        lines.append("                break")
    args_dict = "{" + ", ".join(f"{name!r}: _a_{name}" for name in ev.args) + "}"
    lines += [f"    if {target} is None:  # drawn, refused or of another type: the exact path, as fire sends it",
              f"        {target} = _exact(self, {part.event!r}, {args_dict})"]
    return lines


def composite_source(c: Composite) -> str:
    """The module text of composite ``c``: header, the machines' shapes, the bindings, the two variants."""
    namespace: dict[str, Any] = {}
    functions: list[str] = []
    for sampled in (False, True):
        params = ", ".join(c.params) + (", draws" if sampled else "")
        functions.append(f"def fire_{'sampled' if sampled else 'plain'}({params}):  # {c.name}")
        functions.append(f'    """{c.doc[0].upper()}{c.doc[1:]}: the events fired in sequence; returns each '
                         'part\'s target."""')
        for k, part in enumerate(c.parts):
            functions += _part_lines(c, k, part, sampled, namespace)
        functions += [f"    return {', '.join(f'_t{k}' for k in range(len(c.parts)))}", ""]
    enums = {name: value for name, value in namespace.items() if name.startswith("_enum_")}
    rows = {name: value for name, value in namespace.items() if name.startswith("_p")}
    others = set(namespace) - set(enums) - set(rows)
    if others:
        raise ValueError(f"{c.name}: generated names without a recipe: {sorted(others)}")
    bindings = [f"    {name!r}: ('row', {k}, {index})," for name, (k, index) in rows.items()]
    bindings += [f"    {name!r}: ('enum', {qualified(value)!r})," for name, value in enums.items()]
    header = [
        f'"""The generated composite "{c.name}" — do not edit: regenerate with `python -m calculet.specgen`.',
        "",
        f"{c.doc[0].upper()}{c.doc[1:]}. Printed by calculet.machines.codegen_composite (issue #20) from the z3 terms",
        "of the guards and effects declared in",
        *(f"{qualified(p.machine)} ({p.event})" for p in c.parts),
        "— the events fired in sequence, in one function. `python -m calculet.specgen --check` fails when this file",
        "is not what the declarations produce; the runtime binds it (calculet.runtime.scheduling.completion).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any as _Any",
        "",
        "_int = int",
        "_exact: _Any = None  # the runtime's exact path: set when bound",
        "",
        f"MACHINES = {tuple(qualified(p.machine) for p in c.parts)!r}",
        f"SHAPES = {tuple(shape(p.machine.definition) for p in c.parts)!r}",
        "",
        "BINDINGS = {  # name: ('row', part, row index in its declaration) or ('enum', class)",
        *bindings,
        "}",
        "",
        *(f"{name}: _Any = None" for name in (*rows, *enums)),
        "",
    ]
    text = "\n".join(header) + "\n" + "\n".join(functions)
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n") + "\n"
