"""Executing the scheduler's plans on a device (§3, §7.4, §12, §14): the session of one model
generation, the executor with ping/pong and its degrade, sampling, and fault recovery."""
