"""Issue 46, seam 3: what the filter may call on its store is written as code (FilterStore, layer 5), and every
store it is handed keeps it: the database's (ChatStore), the null store (no database), and the tests' fakes."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from acc_builders import RecordStore, SharedStore

import async_context_compression as acc

SOURCE = Path(acc.__file__).read_text(encoding="utf-8")
CONTRACT = sorted(n for n, member in vars(acc.FilterStore).items() if inspect.isfunction(member) and n[0] != "_")


def _parameters(function) -> list:
    """(name, kind, default) of each parameter a call passes: the contract's without ``self``."""
    found = list(inspect.signature(function).parameters.values())
    found = found[1:] if inspect.isfunction(function) else found
    return [(p.name, p.kind, p.default) for p in found]


def breaches(store) -> list:
    """The contract's methods ``store`` lacks, or has with other parameters, or not awaitable where they are."""
    wrong = []
    for name in CONTRACT:
        wanted, found = getattr(acc.FilterStore, name), getattr(store, name, None)
        if not callable(found) or _parameters(found) != _parameters(wanted):
            wrong.append(name)
        elif inspect.iscoroutinefunction(found) != inspect.iscoroutinefunction(wanted):
            wrong.append(name)
    return wrong


STORES = {
    "ChatStore": lambda: acc.ChatStore(lambda: None),
    "NullStore": acc.NullStore,
    "RecordStore": RecordStore,
    "SharedStore": SharedStore,
}


@pytest.mark.parametrize("make", STORES.values(), ids=STORES.keys())
def test_every_store_the_filter_is_handed_keeps_the_whole_contract(make):
    store = make()
    assert isinstance(store, acc.FilterStore)
    assert breaches(store) == []


def test_a_store_that_breaks_the_contract_is_found():
    class Renamed(acc.NullStore):
        async def read_sent(self, reply):  # the filter passes ``reply_id``
            return None

    class Blocking(acc.NullStore):
        def forget_sent(self, reply_id):  # not awaitable
            return None

    class Partial:
        async def find(self, user_id, chat_id, anchor, limit=16):
            return []

    assert breaches(Renamed()) == ["read_sent"] and breaches(Blocking()) == ["forget_sent"]
    assert "find" not in breaches(Partial()) and len(breaches(Partial())) == len(CONTRACT) - 1


def test_the_contract_lists_every_method_the_filter_calls_on_a_store():
    """Each ``<...>.store.X`` and ``store.X`` in the product names a member of the contract; nothing reaches a store
    by a string."""
    called = {
        node.attr
        for node in ast.walk(ast.parse(SOURCE))
        if isinstance(node, ast.Attribute)
        and (getattr(node.value, "id", None) == "store" or getattr(node.value, "attr", None) == "store")
    }
    assert called and called <= set(CONTRACT)
    assert "getattr(store" not in SOURCE and "getattr(self.summaries.store" not in SOURCE
    assert "def __getattr__" not in SOURCE


async def test_the_null_store_keeps_nothing_and_grants_no_lease():
    store = acc.NullStore()
    await store.save(acc.SummaryRecord("u1", "c1", "a", 1, 3, "fp", "summary"))
    assert await store.find("u1", "c1", "a") == []
    async with store.hold("u1:c1", "w1") as lease:
        assert not lease
    assert await store.read_windows() is None and await store.read_ratios() is None
    with pytest.raises(acc.StoreUnavailable):
        await store.table("summary")
