"""The part of an asyncio transport that the in-process benches' fake sockets share (issues #13, #20).

``bench/loop_profile.py`` and ``bench/stream_loop.py`` hand a request's bytes to the service's edge protocol as a
socket read would and collect the response from a transport of their own; each keeps what it needs of the bytes
(:meth:`write`), and both answer the rest of the transport interface the same way: a loopback address, no flow
control, closing remembered.
"""

from __future__ import annotations

from typing import Any

EXTRA = {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}


class QuietTransport:
    """A transport with no socket behind it: never paused, never buffering; subclasses say what a write keeps."""

    closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return EXTRA.get(name, default)

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0
