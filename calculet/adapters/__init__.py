"""Device adapters: the CalRT protocol (:mod:`calculet.adapters.calrt`) and its implementations.

The runtime imports the protocol, the return codes and the capability contract from
``calculet.adapters.calrt``; the simulated NPU (:mod:`calculet.adapters.sim`) is the embedded
default. Package signing and verification live in ``calculet.packages``; the manifest
schema in :mod:`calculet.packages.manifest`.
"""
