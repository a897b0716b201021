"""BLAS threads inside our numpy calls: one by default, because waiting BLAS threads spin.

numpy's OpenBLAS starts one thread per core and, between two matrix products, its threads busy-wait for the
next one. Our products are small (a query, a batch of facts through a small model), so extra threads save
little when cores are free, and when they are not (other processes, our own vector and adaptation threads) the
spinning threads steal the cores the work needs: measured on this 2-core machine under load,
`embed_many(500)` took 7.4 s with 2 BLAS threads and 0.8 s with 1 (benchmarks/contention.py has the figures
for remember_many and recall). So every library entry point that runs numpy products (embedding, recall's
exact search, an adaptation round) holds `blas_limited()`: OpenBLAS runs EVERMIND_BLAS_THREADS threads
(default 1; 0 leaves BLAS as it is) until the outermost such call in the process ends, then gets its previous
setting back. OpenBLAS's setting is per process: numpy work of other threads of the program runs with the
limit meanwhile. Where no OpenBLAS is loaded (macOS Accelerate, MKL), nothing changes.
A leaf module: it imports nothing from the package.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import Any, Callable, Iterator, TypeVar

ENV = "EVERMIND_BLAS_THREADS"
_SET = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
        "openblas_set_num_threads")
_GET = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
        "openblas_get_num_threads")

F = TypeVar("F", bound=Callable[..., Any])


def _candidates() -> list[str]:
    """Shared libraries that may be numpy's OpenBLAS, loaded ones first."""
    import glob  # (here and in _find: only a process that runs numpy products needs them)

    found = []
    try:
        with open("/proc/self/maps") as maps:
            found += sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    except OSError:
        pass
    try:
        import numpy

        root = os.path.dirname(os.path.dirname(numpy.__file__))
        found += glob.glob(os.path.join(root, "numpy.libs", "*openblas*")) + glob.glob(
            os.path.join(os.path.dirname(numpy.__file__), ".dylibs", "*openblas*"))
    except ImportError:
        pass
    return found


class _Controller:
    """The process's OpenBLAS thread setting, changed while any of our calls runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = 0
        self._set: Any = None
        self._get: Any = None
        self._found = False

    def _find(self) -> None:
        import ctypes

        self._found = True
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            setter = next((getattr(lib, n) for n in _SET if hasattr(lib, n)), None)
            getter = next((getattr(lib, n) for n in _GET if hasattr(lib, n)), None)
            if setter is not None and getter is not None:
                setter.restype, getter.restype = None, ctypes.c_int
                self._set, self._get = setter, getter
                return

    @staticmethod
    def limit() -> int:
        """EVERMIND_BLAS_THREADS, 1 when unset or unreadable; 0 means: leave BLAS alone."""
        try:
            return max(0, int(os.environ.get(ENV, "1")))
        except ValueError:
            return 1

    @contextlib.contextmanager
    def limited(self) -> Iterator[None]:
        limit = self.limit()
        if not limit or "numpy" not in sys.modules:
            yield
            return
        with self._lock:
            if not self._found:
                self._find()
            if self._set is not None:
                if self._depth == 0:
                    self._saved = int(self._get())
                    if self._saved != limit:
                        self._set(limit)
                self._depth += 1
        try:
            yield
        finally:
            if self._set is not None:
                with self._lock:
                    self._depth -= 1
                    if self._depth == 0 and self._saved != limit:
                        self._set(self._saved)

    def threads(self) -> int | None:
        """OpenBLAS's current thread count (None where none was found)."""
        with self._lock:
            if not self._found:
                self._find()
            return None if self._get is None else int(self._get())


_controller = _Controller()


def blas_limited() -> contextlib.AbstractContextManager:
    """Hold BLAS at EVERMIND_BLAS_THREADS threads (default 1) for the block (re-entrant, thread-safe)."""
    return _controller.limited()


def blas_threads() -> int | None:
    """The OpenBLAS thread count now (None where numpy uses another BLAS)."""
    return _controller.threads()


def single_blas(func: F) -> F:
    """Decorate a function whose numpy products should run under blas_limited()."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _controller.limited():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
