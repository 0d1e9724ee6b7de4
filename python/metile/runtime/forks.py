"""Process-wide state a forked child must not inherit as it was."""

from __future__ import annotations

import os
import threading


def renew_lock_after_fork(namespace: dict, name: str = "_lock") -> None:
    """Give a forked child a fresh `namespace[name]` lock: a fork while another thread held
    the parent's (compiling a library, say) left the child's copy held forever, and its
    first launch waited on it.  A `with` block already inside the lock releases the object
    it took."""
    os.register_at_fork(after_in_child=lambda: namespace.__setitem__(name, threading.Lock()))
