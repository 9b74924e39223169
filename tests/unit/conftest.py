"""Shared setup of the unit tests: the repository root is importable
(``import async_context_compression``, ``import devkit``) however pytest is
started, and ``acc_builders`` (next to this file) holds the message builders."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
for _path in (_ROOT, _HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)
