"""The branch digest covers tool calls' arguments (issue 42): two branches that differ only in a call's arguments
share no summary and no recall."""

from __future__ import annotations

import importlib.util
import json
import pathlib

from acc_builders import AS, A, T, text_of

import async_context_compression as acc

# the recall chat and its request helpers (tests/unit is not on the path: pytest.ini)
_SPEC = importlib.util.spec_from_file_location(
    "recall_request_path", pathlib.Path(__file__).with_name("test_recall_request_path.py")
)
recall_path = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(recall_path)
COVERED, LISBON, chat, summarized = recall_path.COVERED, recall_path.LISBON, recall_path.chat, recall_path.summarized
recall_filter, request, run = recall_path.recall_filter, recall_path.request, recall_path.run

SECRET = '{"secret": "PASSPHRASE-ORCHID-55"}'
PUBLIC = '{"secret": "public-value"}'


def test_calls_that_differ_only_in_their_arguments_have_different_digests():
    one = A("c1", name="vault_put", arguments=SECRET)
    other = A("c1", name="vault_put", arguments=PUBLIC)
    assert acc.canonical_digest(one) != acc.canonical_digest(other)
    assert acc.canonical_digest(one) == acc.canonical_digest(A("c1", name="vault_put", arguments=SECRET))
    assert acc.canonical_digest(AS("plain")) == acc.canonical_digest(AS("plain"))  # no call: as in 1.5.0


def branch(arguments: str) -> list:
    """The recall chat with a vault call (these arguments) folded into its summary, before Lisbon's reply."""
    canon = chat()
    return [*canon[:LISBON], A("v1", name="vault_put", arguments=arguments), T("v1", "stored"), *canon[LISBON:]]


def test_a_branch_that_differs_only_in_a_calls_arguments_shares_neither_summary_nor_recall():
    one, other = branch(SECRET), branch(PUBLIC)
    f = recall_filter(records=[summarized(one, COVERED + 2)])
    question = "What secret did we put into the vault with vault_put?"
    first, _ = run(f, request(one, question))
    assert acc.is_summary_message(first["messages"][1])  # branch one has its summary, and indexes its folded turns
    assert "PASSPHRASE-ORCHID-55" in text_of(first["messages"][-1]["content"])
    out, _ = run(f, request(other, question))
    assert not any(acc.is_summary_message(m) for m in out["messages"])
    assert "PASSPHRASE-ORCHID-55" not in json.dumps(out["messages"], ensure_ascii=False)
