"""The four declared lifecycles (§2, §4, §9, §10–12, §14), the admission budget's counters (§5.1) and the declaration core.

Each machine is declared exactly once, here; its compiled dispatch, its reference
python-statemachine class, its z3 encoding and its document are derived from that declaration.
"""

from calculet.machines.admission_budgets import AdmissionBudgetMachine
from calculet.machines.core import Machine
from calculet.machines.errors import InvalidDefinition, InvariantViolation, TransitionNotAllowed
from calculet.machines.job import DeviceJobMachine
from calculet.machines.kv_sequence import KV_SEQUENCE_STATE, KvSequenceMachine
from calculet.machines.model import ModelMachine
from calculet.machines.request import RequestMachine

ALL_MACHINES: tuple[type[Machine], ...] = (RequestMachine, KvSequenceMachine, ModelMachine, DeviceJobMachine,
                                           AdmissionBudgetMachine)
REPORTED_STATES = {KvSequenceMachine.definition.name: KV_SEQUENCE_STATE}
"""By machine name: the machines whose spec enumeration is a projection of their state
(:mod:`calculet.machines.projection`)."""

__all__ = ["ALL_MACHINES", "REPORTED_STATES", "AdmissionBudgetMachine", "DeviceJobMachine", "InvalidDefinition", "InvariantViolation",
           "KvSequenceMachine", "Machine", "ModelMachine", "RequestMachine", "TransitionNotAllowed"]
