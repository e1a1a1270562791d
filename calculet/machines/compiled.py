"""The compiled form of a declaration: a dispatch table walked with dict and tuple operations.

This is the runtime's hot path. python-statemachine costs ~100 µs per event here, which a B16
decode tick firing dozens of events cannot afford (DESIGN: why a compiled table); this form
costs about a microsecond. It is generated from the one declaration, never written by hand, and
the conformance tests prove it behaves exactly like the reference class.

The generated code is one module per declaration (:func:`~calculet.machines.codegen_module.module_source`). A
shipped declaration's module is written under :mod:`calculet.machines.generated` by ``python -m
calculet.specgen`` and imported here (issue #20: no printing and compiling at start, and a module a compiler such
as mypyc can take); any other declaration — a test's machine, a mutant — has the same text generated and
``exec``'d at import, as every machine had before. :func:`bind` then fills the module's ``BINDINGS`` from the
declaration and sets the runtime's exact paths it calls.
"""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from calculet.machines.monitor import MONITOR as _MONITOR
from calculet.machines.written import MISSING as _MISSING, import_written, module_name, qualified, shape
from calculet.machines.definition import Definition, Transition
from calculet.machines.errors import TransitionNotAllowed


class CompiledInstance:
    """State plus variables of one machine instance; ``fire`` is the only way to change them.

    ``__init__``, ``snapshot``, ``fire`` and ``fire_each`` are generated per machine
    (:func:`~calculet.machines.codegen.lifecycle_source`, :func:`~calculet.machines.codegen.fire_source`, :func:`~calculet.machines.codegen.fire_each_source`; the monitor
    installs the variant of ``fire`` and ``fire_each`` its configuration needs): ``fire`` takes the event's arguments as named parameters (no dict per
    event) and calls the generated ``_fire_i`` of (state, event) with them positionally; that
    function accepts them with inline type tests, so the exact (slower) argument check runs only
    for a call the inline test does not accept, or for an event the monitor samples.
    """

    __slots__ = ()  # the slots are the generated ``Instance``'s, typed as declared (the machine's class derives from both)

    _state: str
    last_transition: Transition | None
    definition: Definition
    _table: dict[str, dict[str, Callable[..., int]]]
    _fire_table: dict[str, dict[str, Callable[..., int]]]
    _rows: dict[str, dict[str, tuple[Transition, ...]]]
    _source: str
    _argspec: dict[str, tuple[tuple[str, Callable[[Any], str | None]], ...]]
    _var_names: tuple[str, ...]
    _param_names: tuple[str, ...]
    _initial_values: tuple[tuple[str, Any], ...]
    _fire_plain: Callable[..., str]
    """The generated ``fire`` without the monitor's draw (``fire`` is it while monitors are off)."""
    fire_each: Callable[..., list[str]]
    """``fire_each(instances, event, **columns)``: ``event`` on each instance in order, the i-th
    instance with the i-th value of each argument column; the targets, in order (generated per
    machine, :func:`~calculet.machines.codegen.fire_each_source`: one call per decode step's
    lanes instead of one per lane, issue #20)."""

    def _slow_init(self, extra: dict[str, Any], **given: Any) -> None:
        """The exact parameter check (the generated ``__init__`` sends here what it cannot accept)."""
        d = self.definition
        params = {**{k: v for k, v in given.items() if v is not _MISSING}, **extra}
        missing = [p for p in self._param_names if p not in params]
        unexpected = [p for p in params if p not in d.params]
        if missing or unexpected:
            raise TypeError(f"{d.name}: missing parameters {missing}, unexpected {unexpected}")
        for name in self._param_names:
            value = params[name]
            reason = d.params[name].type.check(value)
            if reason is not None:
                raise ValueError(f"{d.name}: parameter {name}={value!r}: {reason}")
            object.__setattr__(self, name, value)
        for name, value in self._initial_values:
            object.__setattr__(self, name, value)
        self._state = d.initial
        self.last_transition = None  # the row the last event took (None before any)

    # ------------------------------------------------------------------ reading

    state = property(attrgetter("_state"), doc="""The current state, read-only (R4.2: only ``fire`` changes it).

    A property whose getter is C (``operator.attrgetter`` of the private slot the generated code writes), so a
    read costs no Python frame: the runtime's hot paths read it once per lane per step (issue #20) as any other
    caller does, instead of reaching for the private slot.""")

    def at(self, *states: str) -> bool:
        return self._state in states

    def values(self) -> dict[str, Any]:
        """Variables only (parameters are fixed and reported by ``params``)."""
        return {name: getattr(self, name) for name in self._var_names}

    def params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names}

    def snapshot(self) -> "CompiledInstance":
        """A detached copy, used as the pre-state by monitors and step properties. This generic copy is
        what each machine's generated ``snapshot`` does without the loop (:func:`compile_instance_type`)."""
        copy = type(self).__new__(type(self))  # the allocator, without __init__ (also a compiled base's)
        for name in ("_state", "last_transition", *self._param_names, *self._var_names):
            setattr(copy, name, getattr(self, name))
        return copy

    def enabled_events(self) -> list[str]:
        return list(self._table.get(self._state, _EMPTY))

    def __repr__(self) -> str:
        return f"<{self.definition.name} {self._state} {self.values()}>"

    # ------------------------------------------------------------------ writing

    def can_fire(self, event: str, **args: Any) -> bool:
        """Whether ``fire`` would succeed; tries it on a detached copy, so nothing changes."""
        try:
            self._check(event, args)
        except TransitionNotAllowed:
            return False
        return self._table[self._state][event](self.snapshot(), args) >= 0

    def fire(self, event: str, **args: Any) -> str:
        """Take the first enabled row for (state, event); raise ``TransitionNotAllowed`` otherwise.

        The generated code evaluates the guards before it writes anything, so a refused event
        leaves state and variables exactly as they were. With monitors on, the declared
        invariants are checked after each sampled event (:meth:`_fire_checked`). Each machine's
        class has its own faster ``fire`` (:func:`~calculet.machines.codegen.fire_source`: the
        arguments as named parameters, no dict per event); this generic one is the exact path it
        falls back to.
        """
        if _MONITOR.enabled and _MONITOR.sampled():
            return self._fire_checked(event, args)
        return self._fire_exact(event, args)

    def _fire_exact(self, event: str, args: dict[str, Any]) -> str:
        """The slow path: exact argument check, then the guards (refusal raises with the reason)."""
        dispatch = self._check(event, args)
        source = self._state
        taken = dispatch(self, args)
        if taken < 0:
            raise TransitionNotAllowed(self.definition.name, source, event, "no guard is true for these values")
        self.last_transition = self._rows[source][event][taken]
        return self._state

    def _fire_checked(self, event: str, args: dict[str, Any]) -> str:
        """The exact path with the monitor: the invariants and step properties checked after the event."""
        dispatch = self._check(event, args)
        pre = self.snapshot()
        source = self._state
        taken = dispatch(self, args)
        if taken < 0:
            raise TransitionNotAllowed(self.definition.name, source, event, "no guard is true for these values")
        row = self._rows[source][event][taken]
        self.last_transition = row
        _MONITOR.after(self, pre, row)
        return self._state

    def _check(self, event: str, args: dict[str, Any]) -> Callable[..., int]:
        """The dispatch function for (state, event), after checking the event's arguments."""
        dispatch = self._table.get(self._state, _EMPTY).get(event)
        if dispatch is None:
            if event not in self.definition.events:
                raise TransitionNotAllowed(self.definition.name, self._state, event, "unknown event")
            raise TransitionNotAllowed(self.definition.name, self._state, event,
                                       "no transition for this event in this state")
        spec = self._argspec[event]
        if len(args) != len(spec):
            expected = sorted(n for n, _ in spec)
            raise TransitionNotAllowed(self.definition.name, self._state, event,
                                       f"arguments {sorted(args)} do not match {expected}")
        for name, check in spec:
            if name not in args:
                raise TransitionNotAllowed(self.definition.name, self._state, event,
                                           f"missing argument {name!r}")
            reason = check(args[name])
            if reason is not None:
                raise TransitionNotAllowed(self.definition.name, self._state, event,
                                           f"argument {name}: {reason}")
        return dispatch


_EMPTY: dict[str, Any] = {}


def _fire_exact_or_checked(instance: CompiledInstance, event: str, args: dict[str, Any]) -> str:
    """Where the generated ``fire`` sends what its fast path does not take (or the monitor samples)."""
    if _MONITOR.enabled:
        return instance._fire_checked(event, args)
    return instance._fire_exact(event, args)


def _fire_one_by_one(instances: Sequence[CompiledInstance], event: str, columns: dict[str, Any],
                     drawn: list[bool] | None) -> list[str]:
    """``fire_each`` one instance at a time: where the monitor drew an instance (``drawn[i]``) its event
    is checked (the exact path), any other fires through the plain ``fire`` — the exact check and a
    refusal's reason exactly as for single events."""
    given = {name: column for name, column in columns.items() if column is not _MISSING}
    out = []
    for i, x in enumerate(instances):
        args = {name: column[i] for name, column in given.items()}
        out.append(_fire_exact_or_checked(x, event, args) if drawn is not None and drawn[i]
                   else x._fire_plain(event, **args))
    return out


def _fire_split(run: Callable[..., list[str]], instances: Sequence[CompiledInstance], event: str,
                columns: dict[str, Any], drawn: list[bool]) -> list[str]:
    """``fire_each`` when the monitor drew some instances: the drawn ones' events checked (the exact
    path), the runs of instances between them through the event's inline loop ``run`` on slices of
    the instances and columns, in order — what ``_fire_one_by_one`` does, without sending every lane
    of the step through the one-by-one path for one draw (issue #20: a B16 step's sampled check cost
    the whole step's fires; R9.2.3 still checks exactly the drawn events)."""
    given = [(name, column) for name, column in columns.items() if column is not _MISSING]
    n = len(instances)
    out: list[str] = []
    start = 0
    while start < n:
        stop = drawn.index(True, start) if True in drawn[start:] else n
        if stop > start:
            out += run(instances[start:stop], *(c if c is _MISSING else c[start:stop] for c in columns.values()))
        if stop < n:
            out.append(_fire_exact_or_checked(instances[stop], event, {name: c[stop] for name, c in given}))
        start = stop + 1
    return out


def resolve_binding(d: Definition, recipe: tuple[Any, ...]) -> Any:
    """The object a generated module's ``BINDINGS`` recipe names in ``d``: a row ``("row", index)``, an
    initial value ``("init", var)``, or a type's enum class or exact check ``("enum"|"check", "param"|"var", name)``
    / ``(..., "arg", event, name)`` (written by :func:`calculet.machines.codegen_module._recipe`)."""
    kind, *path = recipe
    if kind == "row":
        return d.transitions[path[0]]
    if kind == "init":
        return d.vars[path[0]].initial()
    where, *names = path
    vtype = (d.params[names[0]].type if where == "param" else d.vars[names[0]].type if where == "var"
             else d.events[names[0]].args[names[1]])
    return vtype.enum_cls if kind == "enum" else vtype.check


def bind(namespace: dict[str, Any], d: Definition) -> None:
    """Make a generated module's namespace runnable for ``d``: its ``BINDINGS`` resolved in the declaration, the
    exact paths it falls back to set, and its ``fire``/``fire_each`` named after the machine (a traceback reads
    ``RequestMachine.fire``)."""
    for name, recipe in namespace["BINDINGS"].items():
        namespace[name] = resolve_binding(d, recipe)
    namespace.update(_exact=_fire_exact_or_checked, _one_by_one=_fire_one_by_one, _split=_fire_split,
                     _slow_init=CompiledInstance._slow_init)
    for variant in ("plain", "sampled"):
        fire = namespace[f"fire_{variant}"]
        if not hasattr(fire, "__code__"):  # compiled (mypyc): its names are the compiler's
            continue
        fire.__code__ = fire.__code__.replace(co_qualname=f"{d.name}.fire")
        fire.__qualname__ = f"{d.name}.fire"
        namespace[f"fire_each_{variant}"].__qualname__ = f"{d.name}.fire_each"


def written_module(d: Definition, declaration: type | None) -> ModuleType | None:
    """The written module of ``declaration`` if it has one made for this declaration, else None. A module whose
    recorded shape is not the declaration's (a row renamed, a bound changed, without ``specgen``) is not used:
    the machine is then generated at import, with a warning naming the command that rewrites it."""
    name = None if declaration is None else module_name(declaration)
    if name is None:
        return None
    expected = {"DECLARATION": qualified(declaration), "SHAPE": shape(d)}  # type: ignore[arg-type]
    return import_written(name, expected, f"{d.name}'s hot path")


def generated_namespace(d: Definition, declaration: type | None = None) -> tuple[dict[str, Any], str]:
    """The generated module's namespace for ``d`` (bound), and its source: the written module of a shipped
    declaration, else the same text generated and ``exec``'d now."""
    module = written_module(d, declaration)
    if module is not None:
        namespace = module.__dict__
        # the module's text (its .py beside it, also when the module was compiled to an extension)
        source = Path(module.__file__).with_name(module.__name__.rsplit(".", 1)[1] + ".py").read_text(  # type: ignore[arg-type]
            encoding="utf-8")
    else:
        from calculet.machines.codegen_module import module_source  # z3: only when generating

        source = module_source(d, "?" if declaration is None else qualified(declaration))
        namespace = {"__name__": f"<calculet generated {d.name}>"}
        exec(compile(source, f"<calculet generated {d.name}>", "exec"), namespace)  # noqa: S102 - from the declaration
    bind(namespace, d)
    return namespace, source


def compile_instance_type(d: Definition, declaration: type | None = None) -> type[CompiledInstance]:
    """The compiled instance class of ``d`` (``declaration``: the class that declares it, whose written module is
    used when it has one)."""
    namespace, source = generated_namespace(d, declaration)
    rows: dict[str, dict[str, list[Transition]]] = {}
    for t in d.transitions:
        rows.setdefault(t.source, {}).setdefault(t.event, []).append(t)
    argspec = {name: tuple((arg, typ.check) for arg, typ in ev.args.items())
               for name, ev in d.events.items()}
    attributes = {
        "__slots__": (),  # the generated Instance's, typed
        "__doc__": f"Compiled instance of {d.name} (generated from its declaration).",
        "definition": d,
        "_table": namespace["_table"],
        "_fire_table": namespace["_ft"],
        "fire": namespace["fire_plain"],  # the monitor installs the variant its configuration needs
        "_fire_plain": namespace["fire_plain"],
        "fire_each": staticmethod(namespace["fire_each_plain"]),
        "__init__": namespace["__init__"],
        "snapshot": namespace["snapshot"],
        "_rows": {s: {e: tuple(r) for e, r in evs.items()} for s, evs in rows.items()},
        "_source": source,
        "_check_invariants": namespace["_check_invariants"],
        "_argspec": argspec,
        "_var_names": tuple(d.vars),
        "_param_names": tuple(d.params),
        "_initial_values": tuple(d.initial_values().items()),
    }
    cls = type(f"{d.name}Instance", (CompiledInstance, namespace["Instance"]), attributes)
    _MONITOR.install(cls, namespace)
    return cls
