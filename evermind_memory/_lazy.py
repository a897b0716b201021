"""Third-party modules imported on first use, so commands that never need them start without them (issue 19).

numpy and the vector graph (usearch) cost ~0.1-0.2 s of a CLI start-up; `evermind get`, `list`, `count`, `history`,
`export` and a lexical recall read rows only and never touch a vector. A module that needs numpy only inside its
functions writes

    np = lazy_import("numpy", globals(), "np")

instead of `import numpy as np`: the first `np.<name>` imports numpy and puts the real module in that module's
globals in place of the stand-in, so every later use is a plain global lookup (no cost in hot paths).
Annotations are not evaluated (`from __future__ import annotations`), so `np.ndarray` in a signature imports
nothing. Nothing at a module's top level may use the name, or the import happens there.
A module that mypy checks (pyproject.toml's [tool.mypy]) writes it in the `else:` of an `if TYPE_CHECKING:` that
imports numpy as np, so the checker sees the real module.
A leaf module: it imports nothing from the package.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


class _LazyModule:
    """Stands in for module `name` under `alias` in `namespace` until its first attribute is read."""

    def __init__(self, name: str, namespace: dict[str, Any], alias: str) -> None:
        self._lazy_name = name
        self._lazy_namespace = namespace
        self._lazy_alias = alias

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._lazy_name)  # (the import lock makes concurrent first uses safe)
        self._lazy_namespace[self._lazy_alias] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<module {self._lazy_name!r}, imported on first use>"


def lazy_import(name: str, namespace: dict[str, Any], alias: str) -> Any:
    """A stand-in for `import name as alias` in the module whose globals() are `namespace` (see above)."""
    if name in sys.modules:  # already imported by someone: nothing to defer
        # (import_module, not sys.modules[name]: while another thread is still running the module's import, e.g.
        # the model loading aside, sys.modules holds it half made, and import_module waits for that import to end)
        return importlib.import_module(name)
    return _LazyModule(name, namespace, alias)


def is_numpy(value: Any, *kinds: str) -> bool:
    """isinstance(value, (numpy.<kind>, ...)) for kinds such as "integer" and "floating", without importing
    numpy: no value can be a numpy scalar before numpy is imported."""
    if "numpy" not in sys.modules:
        return False
    numpy = importlib.import_module("numpy")  # (waits for a thread still importing it, as in lazy_import)
    return isinstance(value, tuple(getattr(numpy, kind) for kind in kinds))
