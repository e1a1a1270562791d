"""The engine (§3): the single actor that joins the scheduler, the executor and the model
manager, run by a thread in service or by a virtual-time driver in simulation."""
