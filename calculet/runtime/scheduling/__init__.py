"""The sans-io scheduling core (§4–§9): requests, admission, fair queues, prefill and decode.

A step is data in, data out (``plan = scheduler.step(now)``; ``scheduler.apply(result)``): nothing
here touches the device, a thread or the wall clock.
"""
