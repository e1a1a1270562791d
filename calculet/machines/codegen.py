"""Generate the hot path's Python from the z3 terms of a declaration's guards and effects.

The declared guards and effects are first evaluated on z3 terms (the very terms the formal
checks prove), then those terms are translated to straight-line Python: short-circuit ``and``/
``or``, direct slot reads, one function per (state, event) that picks the first enabled row and
applies its effect. The runtime therefore executes exactly the formula that was proved, at the
cost of a few attribute reads — the helper functions' type dispatch is paid once, at import.
The conformance tests compare this code with the reference class, which calls the original
callables concretely, so a translation fault cannot hide.

Each function here returns source text; :func:`calculet.machines.codegen_module.module_source` joins it into one
module per declaration, which ``python -m calculet.specgen`` writes to ``calculet/machines/generated/`` for the
shipped machines (imported by the runtime, issue #20) and :mod:`.compiled` ``exec``'s for any other declaration.
Objects the text cannot spell as literals (rows, enum classes, exact type checks, initial values) go into the
``namespace`` a function is given, under the name the text reads; the module records where each is found in the
declaration.
"""

from __future__ import annotations

from typing import Any, Callable

import z3

from calculet.logic.symbolic import SymbolicVars, symbolic_args
from calculet.logic.types import Bool, EnumType, Int
from calculet.machines.codegen_rows import conjuncts, guard_term, row_tree_lines, shared_atom_lines
from calculet.machines.definition import Definition, Transition
from calculet.machines.errors import InvalidDefinition


class ExprPrinter:
    """Walks a z3 term of the linear fragment and prints it in some dialect.

    The base dialect is Python (the generated hot path); :class:`MathPrinter` prints the same
    terms for the documents in ``specs/``.
    """

    AND, OR, NOT, IMPLIES = " and ", " or ", "not ", "{p} <= {c}"
    BINARY = {z3.Z3_OP_EQ: "==", z3.Z3_OP_LE: "<=", z3.Z3_OP_LT: "<", z3.Z3_OP_GE: ">=", z3.Z3_OP_GT: ">"}
    NARY = {z3.Z3_OP_ADD: " + ", z3.Z3_OP_SUB: " - ", z3.Z3_OP_MUL: " * "}

    def __init__(self, d: Definition, arg_names: set[str]) -> None:
        self.d = d
        self.arg_names = arg_names
        self.state_names = list(d.states)
        self.shared: dict[int, str] = {}
        """z3 term id → the name of a local already holding its value (:func:`shared_atom_lines`)."""

    # Dialect hooks -------------------------------------------------------------------------
    def state_is(self, name: str, primed: bool = False) -> str:
        return f"(self._state == {name!r})"

    def symbol(self, name: str) -> str:
        if name == "state":
            return "self._state"
        if name in self.arg_names:
            return f"a[{name!r}]"
        if name in self.d.vars or name in self.d.params:
            return f"self.{name}"
        raise TypeError(f"unknown symbol {name!r}")

    def implies(self, premise: str, conclusion: str) -> str:
        return f"((not {premise}) or {conclusion})"

    def ite(self, cond: str, then: str, other: str) -> str:
        return f"({then} if {cond} else {other})"

    def negate(self, inner: str) -> str:
        return f"(not {inner})"

    def distinct(self, left: str, right: str) -> str:
        return f"({left} != {right})"

    # The walk ------------------------------------------------------------------------------
    def expr(self, e: Any) -> str:
        if self.shared and isinstance(e, z3.ExprRef) and e.get_id() in self.shared:
            return self.shared[e.get_id()]
        if isinstance(e, bool):
            return self.expr(z3.BoolVal(e))
        if isinstance(e, int):
            return repr(int(e))
        if not isinstance(e, z3.ExprRef):
            raise TypeError(f"cannot translate {e!r}")
        if z3.is_int_value(e):
            return repr(e.as_long())
        if z3.is_true(e):
            return "True"
        if z3.is_false(e):
            return "False"
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            return self.symbol(e.decl().name())
        kind = e.decl().kind()
        kids = e.children()
        if kind == z3.Z3_OP_EQ and self._is_state(kids[0]) and z3.is_int_value(kids[1]):
            return self.state_is(self.state_names[kids[1].as_long()],
                                 kids[0].decl().name() != "state")
        if kind == z3.Z3_OP_EQ and z3.is_int_value(kids[1]) and self._enum_of(kids[0]) is not None:
            member = self._enum_of(kids[0])(kids[1].as_long())
            return f"({self.expr(kids[0])} {self.BINARY[kind]} {self.enum_literal(member)})"
        if kind == z3.Z3_OP_AND:
            return "(" + self.AND.join(self.expr(k) for k in kids) + ")"
        if kind == z3.Z3_OP_OR:
            return "(" + self.OR.join(self.expr(k) for k in kids) + ")"
        if kind == z3.Z3_OP_NOT:
            return self.negate(self.expr(kids[0]))
        if kind == z3.Z3_OP_IMPLIES:
            return self.implies(self.expr(kids[0]), self.expr(kids[1]))
        if kind == z3.Z3_OP_ITE:
            return self.ite(self.expr(kids[0]), self.expr(kids[1]), self.expr(kids[2]))
        if kind == z3.Z3_OP_DISTINCT and len(kids) == 2:
            return self.distinct(self.expr(kids[0]), self.expr(kids[1]))
        if kind in self.BINARY:
            return f"({self.expr(kids[0])} {self.BINARY[kind]} {self.expr(kids[1])})"
        if kind in self.NARY:
            return "(" + self.NARY[kind].join(self.expr(k) for k in kids) + ")"
        if kind == z3.Z3_OP_UMINUS:
            return f"(-{self.expr(kids[0])})"
        raise TypeError(f"operator {e.decl().name()} is outside the linear fragment calculet compiles")

    @staticmethod
    def _is_state(e: Any) -> bool:
        return z3.is_const(e) and e.decl().name() in ("state", "state_post")

    def _enum_of(self, e: Any) -> Any:
        if not z3.is_const(e):
            return None
        name = e.decl().name().removesuffix("_post")
        decl = self.d.vars.get(name) or self.d.params.get(name)
        return decl.type.enum_cls if decl is not None and isinstance(decl.type, EnumType) else None

    def enum_literal(self, member: Any) -> str:
        return repr(int(member))


class MathPrinter(ExprPrinter):
    """The documents' dialect: ∧ ∨ ¬ ⇒, names bare, a post-state variable primed."""

    AND, OR = " ∧ ", " ∨ "
    BINARY = {z3.Z3_OP_EQ: "=", z3.Z3_OP_LE: "≤", z3.Z3_OP_LT: "<", z3.Z3_OP_GE: "≥", z3.Z3_OP_GT: ">"}

    def state_is(self, name: str, primed: bool = False) -> str:
        return f"state{'′' if primed else ''} = {name}"

    def enum_literal(self, member: Any) -> str:
        return member.name

    def symbol(self, name: str) -> str:
        if name.endswith("_post"):
            return self.symbol(name[: -len("_post")]) + "′"
        return name

    def top(self, e: Any) -> str:
        text = self.expr(e)
        return text[1:-1] if text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]) else text

    def implies(self, premise: str, conclusion: str) -> str:
        return f"({premise} ⇒ {conclusion})"

    def ite(self, cond: str, then: str, other: str) -> str:
        return f"(if {cond} then {then} else {other})"

    def negate(self, inner: str) -> str:
        return f"¬{inner}"

    def distinct(self, left: str, right: str) -> str:
        return f"({left} ≠ {right})"


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


class _LocalArgPrinter(ExprPrinter):
    """The fast path's dialect: an event argument is a local variable ``_a_<name>``, read once."""

    def symbol(self, name: str) -> str:
        if name in self.arg_names:
            return f"_a_{name}"
        return super().symbol(name)


def _row_code(d: Definition, t: Transition, tr: ExprPrinter, v: SymbolicVars, args: dict[str, Any],
              enums: dict[str, Any], term: Any = None) -> tuple[str, list[tuple[str, str]]]:
    """(guard, [(variable, value)]) of one row as Python in ``tr``'s dialect (``term``: the guard as
    :func:`~.codegen_rows.guard_term` gave it, when the caller has it)."""
    try:
        if term is None:
            term = guard_term(t, v, args)
        guard = "True" if term is None else tr.expr(term)
        shared, tr.shared = tr.shared, {}  # an effect reads the pre-state as it is: no shared atom in it
        updates = {} if t.effect is None else dict(t.effect(v, *[args[n] for n in t.effect_args]))
        assigns = []
        for key, value in updates.items():
            code = tr.expr(value)
            vtype = d.vars[key].type
            if isinstance(vtype, EnumType):
                enum_name = f"_enum_{vtype.enum_cls.__name__}"
                enums[enum_name] = vtype.enum_cls
                code = f"{enum_name}({code})"
            assigns.append((key, code))
        tr.shared = shared
    except TypeError as exc:
        raise InvalidDefinition(d.name, f"{t.name}: cannot compile: {exc}") from None
    return guard, assigns


def _arg_accept(local: str, vtype: Any, namespace: dict[str, Any]) -> str:
    """A cheap test that accepts a valid value of ``vtype`` held in ``local`` (a False sends the
    call to the exact check, so the inline test may be stricter than ``vtype.check``, never looser)."""
    if isinstance(vtype, Bool):
        return f"({local} is True or {local} is False)"
    if isinstance(vtype, Int):
        parts = [f"{local}.__class__ is _int"]
        if vtype.ge is not None:
            parts.append(f"{local} >= {vtype.ge!r}")
        if vtype.le is not None:
            parts.append(f"{local} <= {vtype.le!r}")
        return "(" + " and ".join(parts) + ")"
    if isinstance(vtype, EnumType):
        enum_name = f"_enum_{vtype.enum_cls.__name__}"
        namespace[enum_name] = vtype.enum_cls
        return f"({local}.__class__ is {enum_name})"
    checker = f"_check_{len(namespace)}"
    namespace[checker] = vtype.check
    return f"({local} is not _M and {checker}({local}) is None)"


def machine_arg_names(d: Definition) -> tuple[str, ...]:
    """Every event argument name of ``d``, in declaration order: the generated ``fire``'s keywords."""
    names: dict[str, None] = {}
    for ev in d.events.values():
        names.update(dict.fromkeys(ev.args))
    return tuple(names)


def dispatch_source(d: Definition, namespace: dict[str, Any]) -> str:
    """The source of two functions per (state, event), both returning the index of the row taken or -1 (nothing
    changed), and of the tables that find them (``_table``, ``_ft``: state → event → function): ``_dispatch_i(self, a)``, the guards and effects alone on an argument dict (the exact
    path and ``can_fire``), and ``_fire_i(self, <every argument of the machine>)``, which returns
    the target state or None (nothing changed) — the hot path
    called by the generated ``fire`` (:func:`fire_source`) with the arguments as positional
    locals — no dict is built per event. It first accepts its event's arguments with inline type
    and bound tests and checks that no other event's argument was given (None when it cannot: the
    caller then runs the exact check, so a refusal says why), then records the row taken in
    ``last_transition``."""
    v = SymbolicVars(d)
    lines: list[str] = []
    names: dict[tuple[str, str], tuple[str, str]] = {}
    all_args = machine_arg_names(d)
    by_key: dict[tuple[str, str], list[Transition]] = {}
    for t in d.transitions:
        by_key.setdefault((t.source, t.event), []).append(t)
    for index, ((state, event), rows) in enumerate(by_key.items()):
        ev = d.events[event]
        args = symbolic_args(ev)
        names[(state, event)] = (f"_dispatch_{index}", f"_fire_{index}")
        for fast in (False, True):
            tr = (_LocalArgPrinter if fast else ExprPrinter)(d, set(ev.args))
            if fast:
                params = "".join(f", _a_{n}" for n in all_args)
                lines.append(f"def _fire_{index}(self{params}, _M=_M, _int=_int):  # {d.name}: {state} --{event}-->")
                lines += _accept_lines(ev, all_args, namespace)
            else:
                lines.append(f"def _dispatch_{index}(self, a):  # {d.name}: {state} --{event}-->")
            guards = [guard_term(t, v, args) for t in rows]
            if fast:  # the hot path: shared atoms once, rows as a tree of their shared conjuncts
                lines += shared_atom_lines(guards, tr, "    ")
            tree = []
            for i, t in enumerate(rows):
                guard, assigns = _row_code(d, t, tr, v, args, namespace, guards[i])
                body = [f"self._state = {t.target!r}  # {t.name}"]
                if assigns:
                    body.insert(0, f"{', '.join(f'self.{k}' for k, _ in assigns)} = {', '.join(c for _, c in assigns)}")
                if fast:
                    namespace[f"_row_{index}_{i}"] = t
                    body += [f"self.last_transition = _row_{index}_{i}", f"return {t.target!r}"]
                    tree.append((conjuncts(guards[i]), body))
                else:
                    lines += [f"    if {guard}:  # {t.name}", *("        " + line for line in body),
                              f"        return {i}"]
            lines += row_tree_lines(tree, tr, "    ")
            tr.shared = {}
            lines.append("    return None" if fast else "    return -1")
            lines.append("")
    table: dict[str, dict[str, str]] = {}
    fire: dict[str, dict[str, str]] = {}
    for (state, event), (slow_name, fast_name) in names.items():
        table.setdefault(state, {})[event] = slow_name
        fire.setdefault(state, {})[event] = fast_name
    lines += [f"_table = {_table_text(table)}", "", f"_ft = {_table_text(fire)}", ""]
    return "\n".join(lines)


def _table_text(table: dict[str, dict[str, str]]) -> str:
    """A state → event → function-name table as a Python literal, one state per line (small diffs)."""
    rows = [f"    {state!r}: {{{', '.join(f'{event!r}: {name}' for event, name in events.items())}}}," for
            state, events in table.items()]
    return "{\n" + "\n".join(rows) + "\n}"


def _accept_lines(ev: Any, all_args: tuple[str, ...], namespace: dict[str, Any]) -> list[str]:
    """The fast path's argument acceptance: exactly the declared names, each of its type (an
    argument not given arrives as ``_M``, which no type test accepts)."""
    out: list[str] = []
    foreign = [n for n in all_args if n not in ev.args]
    if foreign:
        out += ["    if " + " or ".join(f"_a_{n} is not _M" for n in foreign) + ":", "        return None"]
    if ev.args:
        accept = " and ".join(_arg_accept(f"_a_{name}", vtype, namespace) for name, vtype in ev.args.items())
        out += [f"    if not ({accept}):", "        return None"]
    return out


def fire_source(d: Definition) -> str:
    """The machine's ``fire(self, event, <its argument names>=_M)``, in two variants: ``fire_plain``
    (monitors off) and ``fire_sampled`` (monitors on), which the monitor installs as the class's
    ``fire`` (:meth:`~calculet.machines.monitor.Monitor.install`) — so monitors off cost nothing
    per event, and a sampled monitor one ``next(_draws)`` (a walk over a precomputed random pattern).

    The arguments arrive as named parameters — Python binds them without building a dict — and
    go to the (state, event) function positionally (issue #20: ``fire`` within 1.5x of the
    generated dispatch). Anything the fast path does not take — an unknown event, a refused guard
    or argument, an argument of another event, or an event the monitor samples — goes to
    ``exact(self, event, args)`` with the arguments as a dict: the exact check, with the reason of
    a refusal, and the monitor. A name no event of the machine declares is refused by Python
    itself: ``TypeError: <Machine>.fire() got an unexpected keyword argument`` (no ``**kwargs``
    dict is built per event for that case either), state unchanged. (Their qualified name,
    ``<Machine>.fire``, is set when the module is bound: :func:`~calculet.machines.compiled.bind`.)"""
    all_args = machine_arg_names(d)
    clash = sorted(set(all_args) & {"self", "event", "fast", "target", "a"})
    if clash:
        raise InvalidDefinition(d.name, f"event arguments {clash} clash with the generated fire's own names")
    keywords = "".join(f"{n}=_M, " for n in all_args)
    positional = "".join(f", {n}" for n in all_args)
    pack = ["    a = {}"] + [f"    if {n} is not _M:\n        a[{n!r}] = {n}" for n in all_args]
    lines = [f"def _given({positional[2:]}):  # {d.name}: the arguments given, as the exact path takes them",
             *pack, "    return a", ""]
    for variant in ("plain", "sampled"):
        lines.append(f"def fire_{variant}(self, event, {keywords[:-2]}):  # {d.name}" if keywords else
                     f"def fire_{variant}(self, event):  # {d.name}")
        lines += [*_fire_body(variant, positional, "    "), ""]
    return "\n".join(lines)


def fire_each_source(d: Definition, namespace: dict[str, Any]) -> str:
    """The machine's ``fire_each(instances, event, <its argument names>=<columns>)``: ``event`` fired on
    every instance in order, ``instances[i]`` with the i-th value of each argument column — exactly
    ``[x.fire(event, **{name: column[i]}) for i, x in enumerate(instances)]``, returning the targets.

    Why: a decode step fires the same event on every lane of its batch (submit, settle, result), and
    one call per instance cost more than the guards and effects it runs (issue #20). The loop, the
    argument acceptance and every (state, event) row of ``event`` are generated inline, from the same
    z3 terms as ``_fire_i``; anything the inline code does not take (a refused guard or argument, a
    state without the event) goes to ``exact`` for that instance, as ``fire`` sends it. Like ``fire``
    it comes in two variants, generated into ``fire``'s namespace (its ``_draws``): ``fire_each_plain``
    and ``fire_each_sampled``, which draws once per instance as ``fire`` would and, when a draw hits,
    fires the drawn instances through the checked path and the runs between them inline
    (``split(run, instances, event, columns, drawn)``), so exactly the drawn events are checked."""
    v = SymbolicVars(d)
    all_args = machine_arg_names(d)
    columns = "".join(f", {n}" for n in all_args)
    given = "{" + ", ".join(f"{n!r}: {n}" for n in all_args) + "}"
    lines: list[str] = []
    each: dict[str, str] = {}
    for index, (event, states) in enumerate(_rows_by_event(d).items()):
        # built here and passed down: each event's argument terms then stay alive until the next event's are
        # built, as before this loop's body became helpers, so z3 numbers later terms the same way and the
        # examples the checks report (any model the solver picks) do not change
        args = symbolic_args(d.events[event])
        each[event] = f"_each_{index}"
        lines += _each_event_lines(d, index, event, states, args, v, namespace, all_args, columns, given)
    table = "{" + ", ".join(f"{e!r}: {f}" for e, f in each.items()) + "}"
    lines += [f"_each = {table}", ""]
    for variant in ("plain", "sampled"):
        lines += _fire_each_entry_lines(d, variant, all_args, columns, given)
    return "\n".join(lines)


def _rows_by_event(d: Definition) -> dict[str, dict[str, list[Transition]]]:
    """The declaration's rows grouped by event, then by source state, in declaration order."""
    by_event: dict[str, dict[str, list[Transition]]] = {}
    for t in d.transitions:
        by_event.setdefault(t.event, {}).setdefault(t.source, []).append(t)
    return by_event


def _each_event_lines(d: Definition, index: int, event: str, states: dict[str, list[Transition]],
                      args: dict[str, Any], v: SymbolicVars, namespace: dict[str, Any], all_args: tuple[str, ...],
                      columns: str, given: str) -> list[str]:
    """``_each_<index>(instances, <columns>)``: ``event`` fired on every instance, its argument
    acceptance and every (state, row) inline; what the inline code does not take goes to ``_exact``
    (one instance) or, for arguments that do not fit the event, ``_one_by_one`` (all of them)."""
    ev = d.events[event]
    tr = _LocalArgPrinter(d, set(ev.args))
    own = list(ev.args)
    lines = [f"def _each_{index}(instances{columns}):  # {d.name}: --{event}--> on each instance"]
    # an argument of another event given, or one of this event's missing: fire by fire (the reason)
    odd = [f"{n} is not _M" for n in all_args if n not in ev.args] + [f"{n} is _M" for n in ev.args]
    if odd:
        lines += ["    if " + " or ".join(odd) + ":", f"        return _one_by_one(instances, {event!r}, {given}, None)"]
    lines += ["    targets = []", "    append = targets.append"]
    if own:
        loop = ", ".join(["self", *(f"_a_{n}" for n in own)])
        lines.append(f"    for {loop} in zip(instances{''.join(f', {n}' for n in own)}):")
    else:
        lines.append("    for self in instances:")
    lines.append("        state = self._state")
    accept = " and ".join(_arg_accept(f"_a_{n}", vtype, namespace) for n, vtype in ev.args.items()) or "True"
    for k, (state, rows) in enumerate(states.items()):
        lines.append(f"        {'if' if k == 0 else 'elif'} state == {state!r} and {accept}:")
        lines += _each_row_lines(d, rows, f"_each_row_{index}_{k}", tr, v, args, namespace)
    pack = "{" + ", ".join(f"{n!r}: _a_{n}" for n in own) + "}"
    return lines + [f"        append(_exact(self, {event!r}, {pack}))", "    return targets", ""]


def _each_row_lines(d: Definition, rows: list[Transition], prefix: str, tr: ExprPrinter, v: SymbolicVars,
                    args: dict[str, Any], namespace: dict[str, Any]) -> list[str]:
    """One state's rows inside ``_each_<index>``'s loop: the first whose guard holds applies its effect,
    records its target and moves to the next instance (each row is bound in ``namespace`` as
    ``<prefix>_<i>``, the ``last_transition`` it sets)."""
    guards = [guard_term(t, v, args) for t in rows]
    lines = shared_atom_lines(guards, tr, " " * 12)
    tree = []
    for i, t in enumerate(rows):
        _, assigns = _row_code(d, t, tr, v, args, namespace, guards[i])
        namespace[f"{prefix}_{i}"] = t
        body = [f"self._state = {t.target!r}  # {t.name}", f"self.last_transition = {prefix}_{i}",
                f"append({t.target!r})", "continue"]
        if assigns:
            body.insert(0, f"{', '.join(f'self.{n}' for n, _ in assigns)} = {', '.join(c for _, c in assigns)}")
        tree.append((conjuncts(guards[i]), body))
    lines += row_tree_lines(tree, tr, " " * 12)
    tr.shared = {}
    return lines


def _fire_each_entry_lines(d: Definition, variant: str, all_args: tuple[str, ...], columns: str,
                           given: str) -> list[str]:
    """``fire_each_<variant>(instances, event, <argument columns>)``: checks every column's length,
    then runs the event's ``_each`` function, or, for an event without one, fires instance by instance
    through ``_one_by_one``. Sampled, when a draw hits, ``_split`` runs ``_each`` on the runs of
    instances between the drawn ones and only the drawn ones through the checked path, in order: one
    hit among a step's 16 lanes no longer sends all 16 through the slow path (issue #20, R9.2.3)."""
    lines = [f"def fire_each_{variant}(instances, event{''.join(f', {n}=_M' for n in all_args)}):  # {d.name}",
             "    n = len(instances)",
             *[f"    if {n} is not _M and len({n}) != n:\n"
               f"        raise ValueError(f'fire_each: {n} has {{len({n})}} values for {{n}} instances')"
               for n in all_args],
             # one instance (every event of a B1 decode step): ``fire``'s own body — the same draw, row and refusal —
             # without building the draws, the run and the loop for one element, nor a ``fire`` frame (issue #20)
             *_one_instance_lines(variant, all_args),
             "    run = _each.get(event)"]
    if variant == "sampled":
        lines += ["    drawn = list(_islice(_draws, n))",
                  "    if run is None:",
                  f"        return _one_by_one(instances, event, {given}, drawn)",
                  "    if True in drawn:",
                  f"        return _split(run, instances, event, {given}, drawn)"]
    else:
        lines += ["    if run is None:", f"        return _one_by_one(instances, event, {given}, None)"]
    return lines + [f"    return run(instances{columns})", ""]


def _one_instance_lines(variant: str, all_args: tuple[str, ...]) -> list[str]:
    """``fire_each``'s case of one instance: the lines of :func:`fire_source`'s ``fire_<variant>`` on
    ``instances[0]`` with each column's one value, the target in a list — so ``fire_each([x], e, a=[v])`` is
    ``[x.fire(e, a=v)]`` (the same draw, table row and exact path), one frame fewer per B1 event (#20)."""
    values = "".join(f", {n}" for n in all_args)
    unpack = [f"        {n} = {n} if {n} is _M else {n}[0]" for n in all_args]
    return ["    if n == 1:", "        self = instances[0]", *unpack,
            *_fire_body(variant, values, "        ", lambda answer: f"[{answer}]")]


def _fire_body(variant: str, values: str, indent: str, answer: Callable[[str], str] = str) -> list[str]:
    """The body of a generated ``fire_<variant>`` on ``self`` with the argument names ``values`` (", a, b"): the
    sampled draw, the (state, event) row, and the exact path for what the row does not take. ``answer`` wraps
    each returned target (``fire_each``'s case of one instance returns it in a list)."""
    exact = answer(f"_exact(self, event, _given({values[2:]}))")
    lines = ["if next(_draws):", f"    return {exact}"] if variant == "sampled" else []
    lines += ["try:",
              "    fast = _ft[self._state][event]",
              "except KeyError:",
              f"    return {exact}",
              f"target = fast(self{values})",
              "if target is not None:",
              f"    return {answer('target')}",
              f"return {exact}"]
    return [indent + line for line in lines]


def lifecycle_source(d: Definition, namespace: dict[str, Any]) -> str:
    """``__init__(self, **params)`` and ``snapshot(self)`` as straight-line Python: parameters
    accepted with the same inline tests as event arguments (anything else takes the exact check
    in ``slow_init(self, extra, **params)``), variables set to their initial values, slots copied one by one."""
    params = list(d.params)
    lines = [f"def __init__(self, *, {''.join(f'{p}=_MISSING, ' for p in params)}**extra):  # {d.name}"]
    if params:
        accept = " and ".join(_arg_accept(p, d.params[p].type, namespace) for p in params)
        lines += [f"    if extra or not ({accept}):",
                  f"        return _slow_init(self, extra, {', '.join(f'{p}={p}' for p in params)})"]
    else:
        lines += ["    if extra:", "        return _slow_init(self, extra)"]
    lines += [f"    self.{p} = {p}" for p in params]
    for i, (name, value) in enumerate(d.initial_values().items()):
        namespace[f"_init_{i}"] = value
        lines.append(f"    self.{name} = _init_{i}")
    lines += [f"    self._state = {d.initial!r}", "    self.last_transition = None", ""]
    lines.append(f"def snapshot(self):  # {d.name}")
    lines.append("    copy = _new(self.__class__)")
    lines += [f"    copy.{n} = self.{n}" for n in [*params, *d.vars, "_state", "last_transition"]]
    lines += ["    return copy", ""]
    return "\n".join(lines)




class _StepPrinter(ExprPrinter):
    """Python for a step property: unprimed names read the pre-state, primed ones the post-state."""

    def symbol(self, name: str) -> str:
        if name == "state":
            return "pre._state"
        if name == "state_post":
            return "self._state"
        if name.endswith("_post"):
            return f"self.{name[: -len('_post')]}"
        return f"pre.{name}"

    def state_is(self, name: str, primed: bool = False) -> str:
        return f"({'self' if primed else 'pre'}._state == {name!r})"


def invariant_source(d: Definition) -> str:
    """``check(self, pre)``: (name, R-id) of each invariant (and, given ``pre``, step property)
    that is false — the proved formulas as straight-line Python, for cheap run-time monitors."""
    v = SymbolicVars(d)
    post = SymbolicVars(d, "_post")
    printer = ExprPrinter(d, set())
    steps = _StepPrinter(d, set())
    lines = [f"def _check_invariants(self, pre):  # {d.name}", "    broken = []"]
    for inv in d.invariants:
        lines.append(f"    if not {printer.expr(inv.predicate(v))}:")
        lines.append(f"        broken.append(({inv.name!r}, {inv.rid!r}))")
    if d.step_properties:
        lines.append("    if pre is not None:")
        for sp in d.step_properties:
            lines.append(f"        if not {steps.expr(sp.predicate(v, post))}:")
            lines.append(f"            broken.append(({sp.name!r}, {sp.rid!r}))")
    lines.append("    return broken")
    return "\n".join(lines) + "\n"
