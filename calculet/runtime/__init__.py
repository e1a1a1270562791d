"""The sans-io runtime: it decides, adapters perform I/O (DESIGN principle 1).

Rooms, bottom to top (``lint-imports`` keeps the arrows pointing down): ``request`` and ``actor``
(what crosses the core's boundary; the mailbox of the one owner of state), ``scheduling`` and
``streams``, ``execution``, ``models`` (which reaches the engine only through its own
``EnginePort``), and ``engine`` (the actor core and the thread or virtual-time driver that runs it).
"""
