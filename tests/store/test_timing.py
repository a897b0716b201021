"""Time inputs: parse_time, ttl / expires_at, since / until, and the opt-in recency weight."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evermind_memory import InvalidInput
from evermind_memory.store.timing import (
    MAX_TTL, apply_recency, check_half_life, check_ttl, check_window, expiry, is_expired, parse_time,
    recency_weight, time_text,
)

UTC = timezone.utc
NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def test_parse_time_accepts_aware_times_and_iso_text_with_an_offset():
    want = NOW
    for value in ["2025-05-01T12:00:00Z", "2025-05-01T12:00:00+00:00", "2025-05-01T14:00:00+02:00",
                  "2025-05-01 07:00:00-05:00", NOW.astimezone(timezone(timedelta(hours=9)))]:
        got = parse_time(value, "since")
        assert got == want and got.tzinfo is UTC


@pytest.mark.parametrize("value, message", [
    ("2025-05-01T12:00:00", r"since expects a time with a timezone, got '2025-05-01T12:00:00' \(naive"),
    (datetime(2025, 5, 1), r"since expects a time with a timezone, got datetime.datetime\(2025, 5, 1, 0, 0\) \(naive"),
    ("yesterday", r"since expects an ISO 8601 time with a timezone .*got 'yesterday'"),
    ("", r"since expects an ISO 8601 time"),
    (1714564800, r"since expects a datetime with a timezone or an ISO 8601 string .*got int 1714564800"),
    ("9999-12-31T23:00:00-05:00", r"outside the range of UTC datetimes"),
])
def test_parse_time_refuses_with_a_clear_message(value, message):
    with pytest.raises(InvalidInput, match=message):
        parse_time(value, "since")


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-11))])), st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)))
def test_time_text_orders_like_the_instants_and_parses_back(a, b):
    assert (time_text(a) < time_text(b)) == (a < b) and (time_text(a) == time_text(b)) == (a == b)
    assert parse_time(time_text(a), "t") == a


def test_ttl_and_expires_at():
    assert check_ttl(None) is None
    assert check_ttl(90) == timedelta(seconds=90) and check_ttl(0.5) == timedelta(milliseconds=500)
    assert check_ttl(timedelta(days=2)) == timedelta(days=2)
    assert expiry(now=NOW) is None
    assert expiry(ttl=3600, now=NOW) == NOW + timedelta(hours=1)
    assert expiry(expires_at="2025-05-02T00:00:00+02:00", now=NOW) == datetime(2025, 5, 1, 22, tzinfo=UTC)
    assert not is_expired(None, NOW) and is_expired(NOW, NOW) and not is_expired(NOW + timedelta(seconds=1), NOW)


@pytest.mark.parametrize("kwargs, message", [
    ({"ttl": 0}, r"ttl expects a duration > 0, got 0"),
    ({"ttl": -5}, r"ttl expects a duration > 0"),
    ({"ttl": True}, r"ttl expects seconds \(int or float\) or a timedelta, got bool True"),
    ({"ttl": "3600"}, r"ttl expects seconds .* got str '3600'"),
    ({"ttl": float("nan")}, r"ttl expects a finite duration, got nan"),
    ({"ttl": float("inf")}, r"ttl expects a finite duration"),
    ({"ttl": timedelta(0)}, r"ttl expects a duration > 0"),
    ({"ttl": MAX_TTL + timedelta(days=1)}, r"ttl expects at most 36,525 days .*ttl=None"),
    ({"ttl": 60, "expires_at": "2026-01-01T00:00:00Z"}, r"expected ttl or expires_at, got both"),
    ({"expires_at": "2026-01-01T00:00:00"}, r"expires_at expects a time with a timezone"),
    ({"expires_at": NOW}, r"expires_at expects a time after now \(2025-05-01T12:00:00.000000\+00:00\)"),
    ({"expires_at": "2020-01-01T00:00:00Z"}, r"the fact would never be seen"),
])
def test_expiry_refuses_with_a_clear_message(kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        expiry(now=NOW, **kwargs)


def test_window():
    assert check_window() == (None, None)
    lo, hi = check_window("2025-05-01T00:00:00Z", NOW)
    assert lo == datetime(2025, 5, 1, tzinfo=UTC) and hi == NOW
    assert check_window(NOW, NOW) == (NOW, NOW)  # an instant is a valid window
    with pytest.raises(InvalidInput, match=r"since .* must not be after until"):
        check_window(NOW, NOW - timedelta(seconds=1))
    with pytest.raises(InvalidInput, match=r"until expects a time with a timezone"):
        check_window(until="2025-05-01")


def test_recency_weight_halves_every_half_life_and_is_off_by_default():
    assert check_half_life(None) is None
    assert check_half_life(timedelta(days=7)) == 7 * 86400.0
    for bad in (0, -1, True, "7d", float("nan")):
        with pytest.raises(InvalidInput, match="recency expects"):
            check_half_life(bad)
    w = recency_weight(np.array([0.0, 10.0, 20.0, 30.0, -5.0]), 10.0)
    np.testing.assert_allclose(w, [1.0, 0.5, 0.25, 0.125, 1.0])  # a future time (clock skew) is weight 1
    assert recency_weight(np.array([1e12]), 1.0)[0] == 0.0  # very old: underflows to 0, never NaN


def test_apply_recency_never_lets_an_older_fact_gain():
    times = [NOW, NOW - timedelta(days=7), NOW - timedelta(days=14)]
    np.testing.assert_allclose(apply_recency([0.8, 0.8, 0.8], times, NOW, 7 * 86400), [0.8, 0.4, 0.2])
    neg = apply_recency([-0.5, -0.5, -0.5], times, NOW, 7 * 86400)
    assert neg[0] > neg[1] > neg[2]  # an older negative score goes further down, not up towards 0
    np.testing.assert_allclose(neg, [-0.5, -0.75, -0.875])
