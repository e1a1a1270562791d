"""The sans-io runtime: it decides, adapters perform I/O (DESIGN principle 1)."""
