"""Device adapters: the CalRT protocol (:mod:`calculet.adapters.calrt`) and its implementations.

The runtime imports the protocol, the return codes and the capability contract from
``calculet.adapters.calrt``. Devices are plug-ins found by name through the ``calculet.devices``
entry points (:mod:`calculet.adapters.devices`, ``docs/devices.md``); the simulated NPU
(:mod:`calculet.adapters.sim`, registered as ``sim``) is the default and the only device calculet
ships. Conformance evidence — what the service may offer above C3 — is
:mod:`calculet.adapters.calrt.evidence`. Package signing and verification live in ``calculet.packages``; the manifest
schema in :mod:`calculet.packages.manifest`.
"""
