"""A second OS process for the cross-process tests (not a test module).

    python race_worker.py claim KIND URL SCHEMA NAME ROUNDS
    python race_worker.py summarize KIND URL SCHEMA NAME
    python race_worker.py hold KIND URL SCHEMA NAME TTL RENEW_EVERY

Opens its own async engine on the database, creates the schema, prints
``ready`` and waits for ``go`` on stdin. Then ``claim`` calls ``try_claim``
on the scopes ``race-0`` .. ``race-{ROUNDS-1}`` in order; ``summarize`` runs
a Filter's outlet on the test chat (tests/db/test_background_summary.py)
with a slow fake summarizer and waits for its background work. Either
prints one JSON line: the rounds it won, or the summarizer calls it made.
``hold`` takes the lease ``hold-scope`` with SummaryStore.hold, prints
whether it got it, and keeps it (heartbeat running) until it is killed.
"""

import asyncio
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]
sys.path.append(os.path.dirname(HERE))  # acc_builders, the shared fakes

from pg_support import lease_row  # noqa: E402

import async_context_compression as acc  # noqa: E402


def make_engine(kind: str, url: str, schema: str):
    from sqlalchemy.ext.asyncio import create_async_engine

    if kind == "sqlite":
        return create_async_engine(url, connect_args={"timeout": 10})
    return create_async_engine(url, connect_args={"options": f"-csearch_path={schema}"})


async def wait_for_go(store) -> bool:
    await lease_row(store, "warm-up")  # schema and a pooled connection before the start signal
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return line.strip() == "go"


async def claim(store, name: str, rounds: int) -> dict:
    won = []
    for i in range(rounds):
        if await store.try_claim(f"race-{i}", f"{name}:{i}", ttl=600):
            won.append(i)
    return {"name": name, "won": won}


async def summarize(store, name: str) -> dict:
    import test_background_summary as t
    from acc_builders import FakeSummarizer, make_filter

    # The stored chat is expanded by the filter's own fallback (the tests
    # check it against Open WebUI's): no 4-second attempt to import Open WebUI.
    acc._owui_output_converter = lambda: None
    # Nor to read Open WebUI's config: importing it here takes seconds on the event loop (in its server it is loaded).
    acc._OWUI_CONFIG[:] = [None]
    summarizer = FakeSummarizer(delay=0.5)
    f = make_filter(store=store, complete=summarizer, **t.VALVES)
    chat = t.stored_chat(range(8))
    body = {"model": t.MODEL, "chat_id": "chat-1", "messages": chat}
    for _ in range(5):
        await f.outlet(dict(body), __user__=dict(t.ALICE), __metadata__={"chat_id": "chat-1"})
    await f.wait_for_background()
    return {"name": name, "calls": len(summarizer.calls)}


async def hold(store, name: str, ttl: float, renew_every: float) -> None:
    async with store.hold("hold-scope", name, ttl=ttl, renew_every=renew_every) as held:
        print(json.dumps({"name": name, "held": bool(held)}), flush=True)
        await asyncio.sleep(600)  # until SIGKILL


async def run_processes(db_args: list, mode: str, names: list, *extra: str, timeout: float = 60) -> list:
    """For the tests: start one worker process per name, start them all at
    once, and return their JSON results."""
    import subprocess

    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), mode, *db_args, name, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    try:
        for proc in procs:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
            if line.strip() != "ready":
                raise AssertionError(
                    f"worker did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
                )
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            try:
                out, err = await asyncio.wait_for(asyncio.to_thread(proc.communicate), timeout)
            except TimeoutError:
                proc.kill()
                raise AssertionError(f"worker gave no result in {timeout} s: {proc.communicate()[1][-3000:]}") from None
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def main(mode: str, kind: str, url: str, schema: str, name: str, *rest: str) -> None:
    engine = make_engine(kind, url, schema)
    store = acc.SummaryStore(lambda: engine)
    try:
        if mode == "hold":
            await lease_row(store, "warm-up")
            await hold(store, name, float(rest[0]), float(rest[1]))
        elif await wait_for_go(store):
            result = await (claim(store, name, int(rest[0])) if mode == "claim" else summarize(store, name))
            print(json.dumps(result), flush=True)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
    # These tests are about the shared database, not interpreter teardown (tests/unit/test_tokens.py covers
    # that): once the result is out, leave without finalizing, where a late library thread could abort us.
    sys.stdout.flush()
    os._exit(0)
