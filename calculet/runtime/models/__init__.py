"""Model lifecycle (§3, §10–§13): generations loaded, unloaded, drained and rolled back.

``manager`` (the ModelManager façade) over ``prepare`` (§11 steps 1–4), ``load`` (steps 5–11),
``unload`` (§12), ``recovery`` (the engine's reset/restart hooks), ``generations`` (the shared
table), ``operations`` (the lifecycle lock on the actor), ``capacity`` (§13.1) and ``reports``
(steps, errors, reports, statistics). ``port`` is what the manager needs of the engine: this
package imports nothing from :mod:`calculet.runtime.engine`.
"""
