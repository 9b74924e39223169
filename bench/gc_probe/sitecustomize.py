"""Loaded by every Open WebUI process of ``bench/load.py --gc-log`` (through
PYTHONPATH): appends each full garbage collection (generation 2) and any
collection over 30 ms to the file named by ACC_GC_LOG, as
``<unix time> <pid> <generation> <seconds>``. A bench aid, not the product."""

import gc
import os
import time

_PATH = os.environ.get("ACC_GC_LOG")
_started = [0.0]


def _note(phase, info):
    if phase == "start":
        _started[0] = time.monotonic()
        return
    took = time.monotonic() - _started[0]
    if _PATH and (info.get("generation") == 2 or took > 0.03):
        with open(_PATH, "a", encoding="utf-8") as log:
            log.write(f"{time.time():.3f} {os.getpid()} {info.get('generation')} {took:.3f}\n")


gc.callbacks.append(_note)
