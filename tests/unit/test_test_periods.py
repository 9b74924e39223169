"""The periods tests wait on (issue 45) can be shortened through ACC_TEST_<name>, read once at import; anything else
keeps the product's period."""

from __future__ import annotations

import importlib.util
import sys

import async_context_compression as acc


def test_a_test_period_is_read_from_its_variable(monkeypatch):
    monkeypatch.setenv("ACC_TEST_SOME_PERIOD", "2.5")
    assert acc.period_from_env("SOME_PERIOD", 10.0) == 2.5


def test_a_missing_tiny_or_wrong_value_keeps_a_safe_period(monkeypatch):
    monkeypatch.delenv("ACC_TEST_SOME_PERIOD", raising=False)
    assert acc.period_from_env("SOME_PERIOD", 10.0) == 10.0
    monkeypatch.setenv("ACC_TEST_SOME_PERIOD", "0")
    assert acc.period_from_env("SOME_PERIOD", 10.0) == 0.5  # never a busy loop
    monkeypatch.setenv("ACC_TEST_SOME_PERIOD", "soon")
    assert acc.period_from_env("SOME_PERIOD", 10.0) == 10.0


def test_the_windows_refresh_served_asks_and_lease_take_their_test_periods_at_import(monkeypatch):
    monkeypatch.setenv("ACC_TEST_WINDOWS_REFRESH", "2")
    monkeypatch.setenv("ACC_TEST_SERVED_EVERY", "3")
    monkeypatch.setenv("ACC_TEST_LEASE_TTL", "12")
    spec = importlib.util.spec_from_file_location("acc_with_test_periods", acc.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, fresh)  # its dataclasses look their module up
    spec.loader.exec_module(fresh)
    assert (fresh.WINDOWS_REFRESH, fresh.SERVED_EVERY) == (2.0, 3.0)
    assert (fresh.LEASE_TTL, fresh.LEASE_RENEW) == (12.0, 4.0)  # renewed thrice per lease, as the product's 30 / 10
    assert (acc.WINDOWS_REFRESH, acc.SERVED_EVERY) == (10.0, 300.0)  # read once, at import: not on each use
    assert (acc.LEASE_TTL, acc.LEASE_RENEW) == (30.0, 10.0)
