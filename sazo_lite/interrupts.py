"""Ctrl-C held while state is being written: what makes a pass or a sampler update atomic.

``InterruptsDeferred`` is a context manager: a SIGINT that arrives inside it is held and
delivered (the default handler raises ``KeyboardInterrupt``) when the block has finished, so a
block that writes several arrays either writes all of them or, if interrupted before it
starts, none. Used by ``MeZO``'s passes and ``load_state_dict``, and by the samplers' updates
and ``load_state_dict``.

Example:
    >>> with InterruptsDeferred():
    ...     a, b = 1, 2          # never a without b
"""
from __future__ import annotations

import threading

try:  # the C module: the same handlers as ``signal``, without its enum conversions (µs a call)
    import _signal as signal
except ImportError:  # pragma: no cover - other interpreters
    import signal

__all__ = ["InterruptsDeferred"]


class InterruptsDeferred:
    """Holds Ctrl-C (SIGINT) while a block runs, then delivers it.

    Only the main thread receives signals; elsewhere, or when SIGINT is ignored or not handled
    in Python, this does nothing. Nested uses hand the signal outwards.
    """

    __slots__ = ("previous", "caught")

    def __enter__(self):
        self.previous, self.caught = None, None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self.previous = previous
                signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame):
        if self.caught is None:
            self.caught = (signum, frame)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            if self.caught is not None:
                self.previous(*self.caught)  # the default handler raises KeyboardInterrupt here
        return False
