"""remember(dedup=True) for the CLI and the MCP server, which also say whether the fact was stored already."""

from __future__ import annotations

from typing import Any


def remember_deduped(store: Any, text: str, **kwargs: Any) -> tuple[str, bool]:
    """store.remember(text, dedup=True, **kwargs): (the id, whether it is a fact stored before this call).

    Told by the fact's first change, which a new fact makes after the store's last change before the call; its
    times cannot tell (a fact remembered with at= in the past has an old created_at).
    """
    before = store.info()["max_seq"]
    fid = store.remember(text, dedup=True, **kwargs)
    return fid, store.history(fid)[0].seq <= before
