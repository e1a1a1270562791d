"""The ``calculet-scheduler/v1`` configuration (§15), loaded from YAML.

Why a strict schema: §15 configures a scheduler whose wrong value can silently cost fairness
(§5.3), starve long prompts (§6) or ask the device for something it cannot do (§2, §14). So the
loader rejects unknown keys, wrong types and out-of-range values, and every error names the
field path (``queues.decode_weight: must be > 0``) so a person can fix the file without reading
the code. Scalars are *strict*: a quoted ``"8"`` is not an integer and ``1`` is not ``true``.

The values in §15 are the current product's settings; they are the defaults here (ambiguity 18
reads them as defaults, so does this package). Fields that §15 does not list but other sections
need (ambiguity 8) have defaults chosen and documented on each field:

* ``admission``: the §5.1 ``CapacityBudget`` (``max_sequences``, ``max_kv_tokens``,
  ``max_inflight_jobs``) and the §6 long-task quota (R6.11);
* ``queues.wfq_decode_weight``: the ``decode_weight`` of the §5.3 WFQ cost formula, kept apart
  from the WRR weight of the same name (ambiguity 7, see :class:`QueuesConfig`);
* ``batch.select_thresholds`` (§8, R8.2) and ``batch.max_tenant_lane_share`` (§7.2 item 3);
* ``executor.drain_deadline_ms`` (§12), ``executor.physical_devices`` (§3, R1.8) and the §14
  degrade thresholds;
* ``tenants`` (§5.3), ``models`` and ``trust`` (§11 steps 1–2), ``server`` and ``monitoring``.

What the device can do is never decided by this file alone (DESIGN principle 8):
:func:`cross_validate` checks the requested profiles, in-flight depth and device count against
the verified package manifest and the runtime's capability contract, and fails fast (R15.19).

The rooms: :mod:`~calculet.config.base` (strict scalars, the section base),
:mod:`~calculet.config.admission` (admission, queues, the capacity budget),
:mod:`~calculet.config.execution` (batch, executor, recovery, monitoring),
:mod:`~calculet.config.service` (tenants, models, trust, server),
:mod:`~calculet.config.scheduler` (the whole file and its JSON Schema),
:mod:`~calculet.config.loading` (YAML and data to a config),
:mod:`~calculet.config.error_messages` and :mod:`~calculet.config.cross_validation`.
Their public names are re-exported here.
"""

from calculet.config.admission import (
    AdmissionConfig,
    CapacityBudget,
    LongPrefillQuota,
    QueuesConfig,
)
from calculet.config.base import SCHEMA_ID, LabelName, PosFloat, PosInt
from calculet.config.cross_validation import cross_validate
from calculet.config.execution import (
    BatchConfig,
    DegradeConfig,
    ExecutorConfig,
    MonitoringConfig,
    RecoveryConfig,
)
from calculet.config.loading import (
    DEFAULT_CONFIG_PATH,
    EXAMPLE_CONFIG_PATH,
    default_config,
    load_config,
    parse_config,
)
from calculet.config.scheduler import SchedulerConfig, config_json_schema
from calculet.config.service import DeviceConfig, ModelEntry, ServerConfig, TenantConfig, TrustConfig

__all__ = [
    "SCHEMA_ID",
    "DEFAULT_CONFIG_PATH",
    "EXAMPLE_CONFIG_PATH",
    "AdmissionConfig",
    "LongPrefillQuota",
    "QueuesConfig",
    "BatchConfig",
    "DegradeConfig",
    "ExecutorConfig",
    "RecoveryConfig",
    "MonitoringConfig",
    "DeviceConfig",
    "TenantConfig",
    "ModelEntry",
    "TrustConfig",
    "ServerConfig",
    "SchedulerConfig",
    "CapacityBudget",
    "LabelName",
    "PosFloat",
    "PosInt",
    "default_config",
    "parse_config",
    "load_config",
    "cross_validate",
    "config_json_schema",
]
