"""Time inputs of the store's public calls: `ttl` / `expires_at` (expiry), `since` / `until` (recall windows),
the half-life of the opt-in recency weight, and the canonical UTC text the SQLite columns hold.

Pure functions, no store state. Every time is an aware datetime: a naive one (or an ISO string without an
offset) is refused, because guessing the zone silently shifts a window by hours. The store keeps times as
`time_text` (UTC, microseconds, fixed width), so comparing the text compares the instants.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Sequence, Union

from .._lazy import lazy_import
from ..errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy", globals(), "np")  # imported on first use (_lazy.py)

TimeArg = Union[datetime, str]  # an aware datetime or ISO 8601 text with an offset (parse_time)
DurationArg = Union[float, timedelta]  # seconds or a timedelta (ttl, recency's half-life)

MAX_TTL = timedelta(days=36_525)  # 100 years: any longer is "forever" (no ttl), and now + ttl must fit a datetime
_EXAMPLE = "e.g. '2025-05-01T09:30:00+00:00', '2025-05-01T09:30:00Z' or datetime(2025, 5, 1, tzinfo=timezone.utc)"


def parse_time(value: object, what: str) -> datetime:
    """An aware datetime or an ISO 8601 string with an offset -> an aware datetime in UTC.

    Args:
        value: the input.
        what: how to name it in errors (e.g. "since", 'where["created_at"]').
    Returns:
        the same instant with tzinfo=timezone.utc.
    Raises:
        InvalidInput: not a datetime or str, unparsable, naive (no timezone), or outside what UTC can hold.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
        except ValueError:
            raise InvalidInput(f"{what} expects an ISO 8601 time with a timezone ({_EXAMPLE}), got "
                               f"{value!r:.60}.") from None
    elif isinstance(value, datetime):
        dt = value
    else:
        raise InvalidInput(
            f"{what} expects a datetime with a timezone or an ISO 8601 string ({_EXAMPLE}), "
            f"got {type(value).__name__} {value!r:.40}."
        )
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise InvalidInput(
            f"{what} expects a time with a timezone, got {value!r:.60} (naive: no offset). "
            f"Add one, {_EXAMPLE}; naive times are refused because their zone would be a guess."
        )
    try:
        return dt.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        raise InvalidInput(f"{what}: {value!r:.60} is outside the range of UTC datetimes (years 1 to 9999).") from None


def time_text(dt: datetime) -> str:
    """The canonical text of an aware datetime, as the store's time columns hold it (UTC, microseconds).

    Fixed width for years 1..9999, so text order is time order (`utc_now()` writes the same form).
    """
    return dt.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _seconds(value: object, what: str, *, zero: bool = False) -> float:
    """Seconds (int or float, not bool) or a timedelta -> finite float seconds > 0 (>= 0 with zero=True)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidInput(f"{what} expects seconds (int or float) or a timedelta, got {type(value).__name__} "
                           f"{value!r:.40}.")
    if not math.isfinite(seconds):
        raise InvalidInput(f"{what} expects a finite duration, got {value!r}.")
    if seconds < 0 or (seconds == 0 and not zero):
        raise InvalidInput(f"{what} expects a duration {'>=' if zero else '>'} 0, got {value!r:.40}.")
    return seconds


def check_retention(value: object, what: str) -> timedelta:
    """A retention period: seconds >= 0 (int or float) or a timedelta >= 0, at most MAX_TTL.

    Raises:
        InvalidInput: a bool, a non-number, NaN, infinite, negative or longer than MAX_TTL.
    """
    seconds = _seconds(value, what, zero=True)
    if seconds > MAX_TTL.total_seconds():
        raise InvalidInput(f"{what} expects at most {MAX_TTL.days:,} days, got {value!r:.40}.")
    return timedelta(seconds=seconds)


def check_ttl(ttl: object) -> timedelta | None:
    """remember's `ttl`: None (keep until forgotten), seconds > 0 or a timedelta > 0, at most MAX_TTL.

    Raises:
        InvalidInput: a bool, a non-number, NaN, infinite, <= 0 or longer than MAX_TTL.
    """
    if ttl is None:
        return None
    seconds = _seconds(ttl, "ttl")
    if seconds > MAX_TTL.total_seconds():
        raise InvalidInput(f"ttl expects at most {MAX_TTL.days:,} days ({MAX_TTL.total_seconds():.0f} s), got "
                           f"{ttl!r:.40}; pass ttl=None to keep the fact until it is forgotten.")
    return ttl if isinstance(ttl, timedelta) else timedelta(seconds=seconds)


def expiry(*, ttl: object = None, expires_at: object = None, now: datetime) -> datetime | None:
    """When a fact remembered at `now` expires: from `ttl` or `expires_at` (at most one), or None (never).

    Args:
        ttl: None, seconds or a timedelta (see `check_ttl`).
        expires_at: None, an aware datetime or an ISO 8601 string with an offset.
        now: the remember time (aware).
    Returns:
        the expiry instant in UTC, or None.
    Raises:
        InvalidInput: both given, a bad ttl, a naive or unparsable expires_at, or one not after `now`.
    """
    if ttl is not None and expires_at is not None:
        raise InvalidInput("remember() expected ttl or expires_at, got both; pass only one.")
    delta = check_ttl(ttl)
    if delta is not None:
        return (now + delta).astimezone(timezone.utc)
    if expires_at is None:
        return None
    at = parse_time(expires_at, "expires_at")
    if at <= now:
        raise InvalidInput(
            f"expires_at expects a time after now ({time_text(now)}), got {time_text(at)}: the fact would never be "
            "seen. Use forget() to remove a fact."
        )
    return at


def is_expired(expires_at: datetime | None, now: datetime) -> bool:
    """Whether a fact with this expiry is gone at `now` (an expiry equal to now counts as expired)."""
    return expires_at is not None and expires_at <= now


def check_window(since: object = None, until: object = None) -> tuple[datetime | None, datetime | None]:
    """recall's `since` / `until` (inclusive bounds, each optional) -> UTC datetimes.

    Raises:
        InvalidInput: a naive or unparsable time, or since after until.
    """
    lo = None if since is None else parse_time(since, "since")
    hi = None if until is None else parse_time(until, "until")
    if lo is not None and hi is not None and lo > hi:
        raise InvalidInput(f"since ({time_text(lo)}) must not be after until ({time_text(hi)}); swap them.")
    return lo, hi


def check_half_life(half_life: object) -> float | None:
    """recall's opt-in `recency` half-life: None (off, the default), seconds > 0 or a timedelta -> seconds.

    Raises:
        InvalidInput: a bool, a non-number, NaN, infinite or <= 0.
    """
    return None if half_life is None else _seconds(half_life, "recency")


def recency_weight(age_s: np.ndarray | float, half_life_s: float) -> np.ndarray:
    """0.5 ** (age / half_life) per age in seconds; ages below 0 (a clock step back) count as 0 (weight 1).

    Args:
        age_s: (N,) ages in seconds (or a scalar).
        half_life_s: seconds > 0 (from `check_half_life`).
    Returns:
        (N,) float64 weights in (0, 1].
    """
    age = np.maximum(np.asarray(age_s, dtype=np.float64), 0.0)  # (N,)
    return np.exp2(-age / half_life_s)  # (N,)


def apply_recency(scores: Sequence[float], times: Sequence[datetime], now: datetime, half_life_s: float) -> np.ndarray:
    """Scores decayed by age: s * w for s >= 0 and s * (2 - w) for s < 0, with w = recency_weight(age).

    Multiplying a negative score (a cosine below 0) by w < 1 would lift it towards 0, ranking an old fact above
    a newer one with the same score; `s * (2 - w)` lowers it by the same fraction of |s| instead, so an older
    fact never gains on a newer one.

    Args:
        scores: (N,) recall scores.
        times: (N,) aware datetimes (created_at or updated_at, the caller's choice).
        now: the reference time (aware).
        half_life_s: seconds > 0.
    Returns:
        (N,) float64 decayed scores.
    """
    s = np.asarray(scores, dtype=np.float64)  # (N,)
    age = np.array([(now - t).total_seconds() for t in times], dtype=np.float64)  # (N,)
    w = recency_weight(age, half_life_s)  # (N,)
    return np.where(s >= 0, s * w, s * (2.0 - w))  # (N,)
