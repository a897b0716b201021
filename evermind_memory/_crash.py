"""Named crash points for fault-injection tests: `EVERMIND_CRASH_AT="name:n"` SIGKILLs the process at the n-th
hit of `name`. A leaf module (no package imports), so the store and adaptation can both mark their points.
"""

from __future__ import annotations

import os
import signal

_CRASH_COUNTS: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Fault injection: SIGKILL this process at the n-th hit of `name` when EVERMIND_CRASH_AT="name:n".

    Costs one environment lookup when unset. Used only by crash tests in child processes.
    """
    spec = os.environ.get("EVERMIND_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.rpartition(":")
    if point != name:
        return
    _CRASH_COUNTS[name] = _CRASH_COUNTS.get(name, 0) + 1
    if _CRASH_COUNTS[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
