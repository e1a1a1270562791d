"""Signed calbin model packages (§11 load steps 1–2): keys, building and signing, verification,
archives and the ``calbin-package/v1`` manifest. A package is data the device adapters and the
model manager read; it is not itself a device adapter."""
