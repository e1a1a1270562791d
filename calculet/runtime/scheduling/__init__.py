"""The sans-io scheduling core (§4–§9): requests, admission, fair queues, prefill and decode.

A step is data in, data out (``plan = scheduler.step()``; ``scheduler.on_decode_complete(...)``):
nothing here touches the device, a thread or the wall clock. ``scheduler`` wires the rooms
together — ``registry`` (requests), ``admission`` and ``fairness`` (§5, §6 WFQ), ``prefill`` and
``decode`` (§6, §7), ``kv`` (the lanes, §9), ``jobs`` (in-flight jobs), ``profiles`` (§8),
``generations`` (which generation requests are pinned to), ``apply`` (what the device's results
do) — and ``plan`` holds the values it exchanges with the engine's actor.
"""
