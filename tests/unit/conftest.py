"""Shared setup of the unit tests: the repository root is importable
(``import async_context_compression``, ``import devkit``) however pytest is
started (``acc_builders``, the shared builders and fakes, is one folder up:
see ``pythonpath`` in pytest.ini)."""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
