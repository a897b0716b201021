"""A damaged row never blocks the rest of the store: reads that return many facts skip the unreadable ones.

A fact row whose timestamp, tags or text cannot be decoded (one flipped byte on disk, a hand edit) raises
RowDamaged when it is converted (backend.FactRow). `readable()` converts a batch, leaves such rows out and says
so once with a StoreWarning naming the first and pointing at repair; `check()` counts them and `repair()` fixes
or quarantines them (store/repair.py). A read of that one fact (`get`) raises RowDamaged itself.
"""

from __future__ import annotations

import warnings
from typing import Callable, Iterable, TypeVar

from ..errors import RowDamaged, StoreWarning

T = TypeVar("T")
R = TypeVar("R")


def readable(items: Iterable[T], convert: Callable[[T], R], what: str) -> list[R]:
    """convert(item) for every item whose row is readable; the others are skipped with one StoreWarning.

    Args:
        items: rows (or (row, score) pairs) in the order to return.
        convert: turns one into its public value; raises RowDamaged for an unreadable row.
        what: the public call, named in the warning.
    """
    out: list[R] = []
    skipped: list[RowDamaged] = []
    for item in items:
        try:
            out.append(convert(item))
        except RowDamaged as exc:
            skipped.append(exc)
    if skipped:
        warnings.warn(f"{what}() skipped {len(skipped)} damaged fact row{'s' * (len(skipped) > 1)}: {skipped[0]}",
                      StoreWarning, stacklevel=3)
    return out
