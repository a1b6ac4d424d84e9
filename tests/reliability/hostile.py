"""Helpers of the attack tests (cache and artifact trust): a deadline for calls that must not hang."""

from __future__ import annotations

import contextlib
import signal


class Hung(AssertionError):
    """A call that had to finish in seconds (it met a FIFO, say) did not."""


@contextlib.contextmanager
def deadline(seconds: int = 30):
    """Fail with :class:`Hung` if the block runs longer than ``seconds`` (SIGALRM, main thread only).

    A blocked ``open`` or ``read`` of a FIFO is interrupted by the signal, so a
    hang becomes a test failure instead of a stuck test run.
    """
    def on_alarm(signum, frame):
        raise Hung(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
