"""The window a local model's server serves (issue 37): each server's answer read, the ask scheduled (one in flight
per model, again after a period and after the first reply, a server without the paths left alone), the served window
ranked above learned and published ones and shared; Ollama's whole-message drop read from the usage (both of Open
WebUI's paths to it), a cut reply teaching no ratio; and, through the Filter against the fake local servers, chats that
are never cut or rejected once the server has answered."""

from __future__ import annotations

import asyncio
import json
import time
import types
import urllib.request

import pytest

import async_context_compression as acc
from devkit import local_servers as local
from devkit import probes
from devkit.fake_provider import FakeProvider, llamacpp_spec, model_tokens, ollama_spec

LONG = "The quarterly figures were compared with the plan in detail. " * 12


# -- each server's answer ------------------------------------------------------------------------------------------


def test_each_servers_answer_names_the_window_it_serves():
    ps = {"models": [local.ollama_ps_entry("other:7b", 2048), local.ollama_ps_entry("llama3:latest", 8192)]}
    assert acc.served_window("/api/ps", ps, "llama3") == 8192  # Ollama's name without a tag is :latest
    assert acc.served_window("/api/ps", ps, "llama3:70b") == 0  # not loaded: it says none
    assert acc.served_window("/api/ps", {"models": []}, "llama3") == 0
    props = local.llamacpp_props("m", 8192)
    assert acc.served_window("/props", props, "m") == 8192  # the slot's n_ctx, not meta.n_ctx_train
    lmstudio = {"data": [local.lmstudio_model("q", 4096, 32768), local.lmstudio_model("r", None, 32768)]}
    assert acc.served_window("/api/v0/models", lmstudio, "q") == 4096  # loaded, not the model's maximum
    assert acc.served_window("/api/v0/models", lmstudio, "r") == 0  # not loaded
    for path in ("/api/ps", "/props", "/api/v0/models"):  # another server's answer, or none
        assert acc.served_window(path, {"object": "list", "data": "x"} if path != "/api/v0/models" else {}, "m") is None
        assert acc.served_window(path, None, "m") is None


def test_the_servers_own_paths_are_under_the_connections_root():
    assert acc.server_root("http://h:11434/") == "http://h:11434"  # an Ollama connection: the root
    assert acc.server_root("http://h:8080/v1") == "http://h:8080"  # an OpenAI connection: without /v1
    assert acc.server_root("file:///etc/passwd") == "" and acc.server_root(None) == ""
    server = acc.ServedServer("openai", "http://h:8080", "", "org/m 1")
    assert (
        server.url("/props") == "http://h:8080/props?model=org/m%201"
        and server.url("/api/ps") == "http://h:8080/api/ps"
    )


class _Store(acc.NullStore):
    """The store's window rows, as every worker shares them (every user's under the model, a user's own under
    (model, user))."""

    def __init__(self):
        self.rows: dict = {}

    async def save_windows(self, rows):
        for model, user, window in rows:
            key = (model, user) if user else model
            if window is None:
                self.rows.pop(key, None)
            else:
                self.rows[key] = (model, window.tokens, window.source, window.published, window.learned_at, user)

    async def read_windows(self):
        return list(self.rows.values())

    async def read_window(self, model):
        return [row for row in self.rows.values() if row[0] == model]

    async def find(self, *args, **kwargs):
        return []

    async def add_ratios(self, rows):
        pass

    async def read_ratios(self):
        return []


# -- the ask: one in flight, a period, the first reply, a server without the paths ------------------------------


class _Server:
    """A fake HTTP getter: path -> (status, answer); the URLs asked."""

    def __init__(self, answers: dict, delay: float = 0.0):
        self.answers, self.delay, self.asked = answers, delay, []

    def __call__(self, url: str, key: str, payload=None) -> tuple:
        self.asked.append((url, key))
        if self.delay:
            import time

            time.sleep(self.delay)
        path = url.split("://", 1)[1].partition("/")[2].partition("?")[0]
        return self.answers.get("/" + path, (404, None))


OLLAMA = acc.ServedServer("ollama", "http://o", "k", "llama3:latest")
LLAMACPP = acc.ServedServer("openai", "http://l", "", "m")


def test_each_connection_type_asks_its_paths_and_remembers_the_one_that_answered():
    get = _Server({"/props": (200, local.llamacpp_props("m", 8192))})
    probe = acc.ServedProbe(get)
    assert asyncio.run(probe.ask(LLAMACPP)) == (8192, "/props")
    assert asyncio.run(probe.ask(LLAMACPP)) == (8192, "/props")
    assert [u for u, _ in get.asked] == ["http://l/props?model=m"] * 2  # the same path again, nothing else
    get = _Server({"/api/ps": (200, {"models": [local.ollama_ps_entry("llama3:latest", 4096)]})})
    probe = acc.ServedProbe(get)
    assert asyncio.run(probe.ask(OLLAMA)) == (4096, "/api/ps")
    assert get.asked == [("http://o/api/ps", "k")]  # an Ollama connection: /api/ps only, with its key
    openai = acc.ServedServer("openai", "http://o", "", "llama3")  # Ollama's /v1: found after the others
    assert asyncio.run(acc.ServedProbe(get).ask(openai)) == (4096, "/api/ps")
    assert [u for u, _ in get.asked[1:]] == ["http://o/props?model=llama3", "http://o/api/v0/models", "http://o/api/ps"]


def test_a_server_without_the_paths_is_left_alone_but_one_that_is_down_is_asked_again():
    get = _Server({})  # every path 404: OpenAI, vLLM
    probe = acc.ServedProbe(get)
    assert asyncio.run(probe.ask(LLAMACPP)) == (0, "")
    assert asyncio.run(probe.ask(LLAMACPP)) == (0, "") and len(get.asked) == 3  # not asked again
    probe.silent["http://l"] -= acc.SERVED_SILENT
    asyncio.run(probe.ask(LLAMACPP))
    assert len(get.asked) == 6  # after SERVED_SILENT it is
    down = _Server({"/props": (0, None)})  # refused or timed out: loading, restarting
    probe = acc.ServedProbe(down)
    asyncio.run(probe.ask(LLAMACPP))
    asyncio.run(probe.ask(LLAMACPP))
    assert len(down.asked) == 6 and not probe.silent


def test_one_ask_in_flight_per_model_again_after_the_period_and_after_the_first_reply():
    probe = acc.ServedProbe(_Server({}))
    started = []

    async def ask():
        started.append(1)
        await asyncio.sleep(0.05)

    async def run():
        first = probe.start_if_due("m", ask)
        assert probe.start_if_due("m", ask) is first  # under way: the same one
        await first
        assert probe.start_if_due("m", ask) is None  # done, not due
        assert probe.start_if_due("n", ask) is not None  # another model's own
        probe.asked_at["m"] -= acc.SERVED_EVERY
        await probe.start_if_due("m", ask)  # due again after the period
        assert probe.after_first_reply("m") and not probe.after_first_reply("m")
        await probe.start_if_due("m", ask)  # the first reply loaded the model: asked once more at once
        assert probe.start_if_due("m", ask) is None

    asyncio.run(run())
    assert len(started) == 4


# -- the served window among the others ------------------------------------------------------------------------


def test_settings_outrank_the_served_window_which_outranks_learned_and_published_ones():
    windows, llamacpp = acc.ModelWindow(), {"id": "m", "openai": {"id": "m", "meta": {"n_ctx_train": 131072}}}
    assert windows.find("m", llamacpp, acc.RequestParams.of({}, llamacpp)) == acc.Window(
        131072, "published"
    )  # the trained size
    windows.learn("m", 16384, "error", 131072, firm=0)  # a trained size is not firm (tests of issue 35)
    assert windows.serve("m", 8192, 131072).source == "served"
    assert (
        windows.find("m", llamacpp, acc.RequestParams.of({}, llamacpp)).tokens == 8192
    )  # served over learned and over published
    assert windows.find("m", llamacpp, acc.RequestParams.of({"options": {"num_ctx": 4096}}, llamacpp)) == acc.Window(
        4096, "settings"
    )
    assert windows.learn("m", 16384, "error", 131072, firm=0) is None  # the server knows better
    assert windows.find("m", llamacpp, acc.RequestParams.of({}, llamacpp)).tokens == 8192
    assert windows.learn("m", 6000, "cut", 131072, firm=0, user="u").tokens == 6000  # under served: kept (the user's)
    assert (
        windows.find("m", llamacpp, acc.RequestParams.of({}, llamacpp), "u").tokens == 6000
        and windows.find("m", llamacpp, acc.RequestParams.of({}, llamacpp)).tokens == 8192
    )
    assert windows.serve("m", 8192, 131072) is None  # the same: nothing to save ...
    windows.learned["m"] = acc.replace(windows.learned["m"], learned_at=windows.learned["m"].learned_at - 7200)
    assert windows.serve("m", 8192, 131072) is not None  # ... until its row would age out
    assert windows.serve("m", 0, 131072) is None  # the server said none: the known one stays
    assert windows.find("m", llamacpp, acc.RequestParams.of({}, llamacpp)).tokens == 8192


def test_a_request_waits_briefly_for_the_first_ask_and_never_for_a_slow_server(monkeypatch):
    served = {"/props": (200, local.llamacpp_props("m", 8192))}
    model = {"id": "m", "urlIdx": 0, "openai": {"id": "m", "meta": {"n_ctx_train": 131072}}}

    async def connect():
        return LLAMACPP

    async def run(windows):
        found = [
            await windows.for_request(acc.NullStore(), "m", model, acc.RequestParams.of({}, model), connect=connect)
        ]
        await asyncio.sleep(0.3)
        found.append(
            await windows.for_request(acc.NullStore(), "m", model, acc.RequestParams.of({}, model), connect=connect)
        )
        return found

    quick = acc.ModelWindow()
    quick.server.get = _Server(served)
    assert [w.tokens for w in asyncio.run(run(quick))] == [8192, 8192]  # the first request fits already
    monkeypatch.setattr(acc, "SERVED_WAIT", 0.1)
    slow = acc.ModelWindow()
    slow.server.get = _Server(served, delay=0.2)  # answers after the request went on
    assert [w.tokens for w in asyncio.run(run(slow))] == [131072, 8192]  # the next one fits
    assert len(slow.server.get.asked) == 1


@pytest.mark.parametrize("known", [acc.Window(8192, "error"), acc.Window(8192, "served"), acc.Window(4096, "cut")])
def test_a_request_never_waits_for_an_ask_where_a_window_is_known(known):
    """Issue 44: the ask (due again every SERVED_EVERY) runs in the background behind a learned or served window."""
    model = {"id": "m", "urlIdx": 0, "openai": {"id": "m", "meta": {"n_ctx_train": 131072}}}

    async def connect():
        return LLAMACPP

    async def run(windows):
        began = time.monotonic()
        window = await windows.for_request(
            acc.NullStore(), "m", model, acc.RequestParams.of({}, model), connect=connect
        )
        return window, time.monotonic() - began, windows.server.running["m"]

    windows = acc.ModelWindow()
    windows.learned["m"] = acc.replace(known, published=131072, learned_at=time.time())
    windows.server.get = _Server({"/props": (200, local.llamacpp_props("m", 8192))}, delay=0.5)
    window, waited, asking = asyncio.run(run(windows))
    assert window.tokens == known.tokens and waited < 0.4 and asking is not None  # asked, not awaited


def test_an_answer_is_shared_with_every_worker_through_the_store():
    store, one, two = _Store(), acc.ModelWindow(), acc.ModelWindow()
    one.server.get = _Server({"/api/ps": (200, {"models": [local.ollama_ps_entry("llama3:latest", 4096)]})})

    async def connect():
        return OLLAMA

    async def run():
        await one.for_request(store, "llama3:latest", None, acc.RequestParams(), connect=connect)
        await two.refresh_model(store.read_window, "llama3:latest")
        return two.find("llama3:latest", None, acc.RequestParams())

    assert asyncio.run(run()).tokens == 4096 and store.rows["llama3:latest"][1:3] == (4096, "served")
    assert [n.text("en") for n in acc.window_notes(two.news("m", acc.Window(4096, "served"), "a1"))] == [
        "window 4.1k, as the model's server serves it"
    ]


# -- Open WebUI's connection for a model --------------------------------------------------------------------------


def test_the_connection_open_webui_holds_for_each_kind_of_model(monkeypatch):
    asked = []

    async def connection(request, kind, index):
        asked.append((kind, index))
        return ("http://o:11434", None, {}) if kind == "ollama" else ("http://l:8080/v1", "sk", {"prefix_id": "loc"})

    monkeypatch.setattr(acc, "owui_connection", connection)
    ollama = {"id": "llama3:latest", "owned_by": "ollama", "ollama": {"model": "llama3:latest", "urls": [1]}}
    llamacpp = {"id": "loc.m", "urlIdx": 0, "openai": {"id": "loc.m", "meta": {"n_ctx_train": 131072}}}
    vllm = {"id": "v", "urlIdx": 0, "openai": {"id": "v", "max_model_len": 32768}}
    custom = {"id": "helper", "info": {"base_model_id": "llama3:latest"}}
    request = types.SimpleNamespace(
        app=types.SimpleNamespace(state=types.SimpleNamespace(MODELS={ollama["id"]: ollama}))
    )
    found = [asyncio.run(acc.owui_served_server(request, m)) for m in (ollama, llamacpp, vllm, custom, None)]
    assert found[0] == acc.ServedServer("ollama", "http://o:11434", "", "llama3:latest")
    assert found[1] == acc.ServedServer("openai", "http://l:8080", "sk", "m")  # Open WebUI's prefix is not its name
    assert found[2] is None  # vLLM's list publishes what it serves
    assert found[3] == found[0]  # a workspace model: its base model's server
    assert found[4] is None
    assert asked == [("ollama", 1), ("openai", 0), ("ollama", 1)]


def test_open_webui_before_0_12_holds_its_connections_in_app_state():
    config = types.SimpleNamespace(
        OLLAMA_BASE_URLS=["http://o:11434"],
        OLLAMA_API_CONFIGS={"0": {"key": "ok"}},
        OPENAI_API_BASE_URLS=["http://a/v1", "http://l:8080/v1"],
        OPENAI_API_KEYS=["", "lk"],
        OPENAI_API_CONFIGS={"http://l:8080/v1": {"prefix_id": "loc"}},  # older rows: by URL
    )
    request = types.SimpleNamespace(app=types.SimpleNamespace(state=types.SimpleNamespace(config=config)))
    assert acc._app_state_connection(request, "ollama", 0) == ("http://o:11434", "ok", {"key": "ok"})
    assert acc._app_state_connection(request, "openai", 1) == ("http://l:8080/v1", "lk", {"prefix_id": "loc"})


# -- Ollama's drop read from the usage ------------------------------------------------------------------------------


def test_a_cut_reply_teaches_the_window_and_no_ratio_on_either_path_to_ollama():
    windows, tokens = acc.ModelWindow(), acc.ModelTokens()
    tokens.add("q", "exact", 1.15, "u")

    def reply(reply_id, counted, usage, windows=windows, chat="c"):
        tokens.note_sent(reply_id, "q", True, counted, user="u")
        windows.note_sent(acc.SentRequest(reply_id, "", "u", "q", counted, 0.0), False)  # a request the filter sent
        return asyncio.run(windows.after_reply(tokens, reply_id, usage, None, chat, None, "u"))[0]

    assert reply("a1", 3000, {"prompt_eval_count": 3450}) == 0 and "a1" in tokens.counted  # its ratio is learned
    assert reply("a2", 4000, {"prompt_eval_count": 3100, "prompt_tokens": 3100}) == 3100  # Ollama's own API
    assert "a2" not in tokens.counted and tokens.learn("a2", {"prompt_eval_count": 3100}, "u") is None
    assert windows.find("q", None, acc.RequestParams(), "u") == acc.replace(
        windows.pending[("q", "u")], tokens=3100, source="cut"
    )
    # Ollama's /v1 reports prompt_tokens alone: a cut where its /api/ps answered, else a provider that rejects
    other = acc.ModelWindow()
    assert reply("b1", 4000, {"prompt_tokens": 3100}, other, "d") == 0
    other.ollama["q"] = True
    assert reply("b2", 4000, {"prompt_tokens": 3100}, other, "e") == 3100


def _chat(f, spec, turns, model=None, request=None, usage_key="prompt_eval_count", sent=lambda body: None, saved=0):
    """inlet, request, outlet of a growing chat against ``spec`` as its server treats a prompt (Ollama: whole messages
    dropped, see local.ollama_chat_prompt), after ``saved`` turns stored before the filter saw the chat; per turn
    (model tokens sent, whether the server cut or rejected it)."""

    async def run():
        out = []
        stored = [{"role": "system", "content": "Be brief."}]
        for i in range(saved):
            stored += [{"role": "user", "content": f"S{i} {LONG}"}, {"role": "assistant", "content": f"R{i} {LONG}"}]
        for i in range(turns):
            stored.append({"id": f"u{i}", "role": "user", "content": f"Q{i} {LONG}"})
            meta = {"chat_id": "c1", "message_id": f"a{i}"}
            body = {"model": model["id"] if model else "llama", "messages": [dict(m) for m in stored]}
            body = await f.inlet(body, {"id": "u1"}, meta, None, model, request, "c1")
            body = await f.request(body, {"id": "u1"}, meta, None, model, "c1", request)
            sent(body)
            own = model_tokens(body["messages"], None, spec)
            kept, _ = local.ollama_chat_prompt(body["messages"], lambda k: model_tokens(k, None, spec) <= spec.window)
            reported = model_tokens(kept, None, spec)
            stored.append({"id": f"a{i}", "role": "assistant", "content": f"A{i} short."})
            outlet_messages = [dict(m) for m in stored[1:]]
            outlet_messages[-1]["usage"] = {usage_key: reported}
            outlet = {"id": f"a{i}", "chat_id": "c1", "messages": outlet_messages}
            await f.outlet(outlet, {"id": "u1"}, meta, None, model, request)
            await f.wait_for_background(10)
            out.append((own, own > spec.window))
        return out

    return asyncio.run(run())


def _filter():
    f = acc.Filter()
    f.summaries.store = _Store()
    f.valves.summary_model = "none-such"  # summaries fail: only the cap protects
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    return f


def test_without_an_answer_ollamas_drop_teaches_the_window_within_a_few_turns():
    f, spec = _filter(), ollama_spec(4096, ratio=1.3)
    replies = _chat(f, spec, 34)
    cut = [n for n, (_, over) in enumerate(replies) if over]
    assert replies[-1][0] > 2500  # it grew to the window
    assert cut and len(cut) <= 3 and cut == list(range(cut[0], cut[0] + len(cut))), cut  # then none after
    assert (
        3000 < f.windows.find("llama", None, acc.RequestParams(), "u1").tokens <= 4096
    )  # what Ollama kept: a bound of num_ctx
    assert f.summaries.store.rows[("llama", "u1")][2] == "cut"  # the user's own chats' (issue 42)


@pytest.fixture
def local_server(monkeypatch):
    """The fake local servers as a model's connection in Open WebUI (``owui_connection`` reads it)."""
    servers = []

    def serve(**specs):
        fake = FakeProvider(chat_models=(), summary_models=(), model_specs=specs).start()
        servers.append(fake)

        async def connection(request, kind, index):
            return (fake.root_url if kind == "ollama" else fake.base_url), "", {}

        monkeypatch.setattr(acc, "owui_connection", connection)
        return fake

    yield serve
    for fake in servers:
        fake.stop()


def test_a_preloaded_ollama_is_never_cut(local_server):
    spec = ollama_spec(4096, ratio=1.3, trained=131072, preloaded=True)
    fake = local_server(**{"llama:8b": spec})
    f, model = _filter(), {"id": "llama:8b", "owned_by": "ollama", "ollama": {"model": "llama:8b", "urls": [0]}}
    replies = _chat(f, spec, 34, model=model, request=object())
    assert replies[-1][0] > 2500 and not [n for n, (_, over) in enumerate(replies) if over]
    assert f.windows.find("llama:8b", model, acc.RequestParams.of({}, model)).source == "served"
    assert [p["path"] for p in fake.probes] == ["/api/ps"]  # once: not again within SERVED_EVERY


def test_llama_server_publishing_its_trained_size_is_never_rejected_where_props_answers(local_server):
    spec = llamacpp_spec(4096, ratio=1.3, trained=131072)
    local_server(m=spec)
    f, model = _filter(), {"id": "m", "urlIdx": 0, "openai": {"id": "m", "meta": {"n_ctx_train": 131072}}}
    replies = _chat(f, spec, 34, model=model, request=object(), usage_key="prompt_tokens")
    assert replies[-1][0] > 2500 and not [n for n, (_, over) in enumerate(replies) if over]
    assert f.windows.find("m", model, acc.RequestParams.of({}, model)) == acc.replace(
        f.windows.learned["m"], tokens=4096, source="served"
    )


def test_an_ollama_loaded_by_the_first_request_is_asked_again_after_its_first_reply(local_server):
    spec = ollama_spec(4096, ratio=1.3, trained=131072)  # /api/ps lists it once a request loaded it
    fake = local_server(**{"llama:8b": spec})
    f, model = _filter(), {"id": "llama:8b", "owned_by": "ollama", "ollama": {"model": "llama:8b", "urls": [0]}}

    def load(body):  # the request reaches the server, which loads the model
        short = {"model": "llama:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        request = urllib.request.Request(f"{fake.root_url}/api/chat", json.dumps(short).encode(), method="POST")
        urllib.request.urlopen(request, timeout=10).read()

    replies = _chat(f, spec, 34, model=model, request=object(), sent=load)
    assert replies[-1][0] > 2500 and not [n for n, (_, over) in enumerate(replies) if over]
    before_reply = [("/api/ps", 200), ("/api/show", 200)]  # not loaded yet: the window it will be loaded with
    assert [(p["path"], p["status"]) for p in fake.probes] == [*before_reply, ("/api/ps", 200)]  # then loaded
    assert f.windows.find("llama:8b", model, acc.RequestParams.of({}, model)) == acc.replace(
        f.windows.learned["llama:8b"], tokens=4096
    )


@pytest.mark.parametrize("in_modelfile", [False, True])
def test_the_first_request_of_a_long_chat_fits_an_ollama_model_not_loaded_yet(local_server, in_modelfile):
    """Issue 44: /api/ps lists no model before its first request. The Modelfile's num_ctx (/api/show) is the window
    it will be loaded with; without one, Ollama's smallest default is assumed (and said) until the first reply."""
    spec = ollama_spec(8192, ratio=1.1, per_message=4, trained=131072, in_modelfile=in_modelfile)
    local_server(**{"llama:8b": spec})
    f, model = _filter(), {"id": "llama:8b", "owned_by": "ollama", "ollama": {"model": "llama:8b", "urls": [0]}}
    first = _chat(f, spec, 1, model=model, request=object(), saved=12)[0]
    assert first[1] is False and first[0] > 2500, first  # over the window as stored: trimmed, not cut by the server
    assert (f.windows.learned.get("llama:8b") or acc.NO_WINDOW).source == ("served" if in_modelfile else "")
    assert bool(f.windows.guessed) is False  # a guess lasts until the model's first reply: here it replied


def test_a_model_the_server_does_not_show_is_not_assumed_to_be_an_ollama_one():
    """A server answering /api/ps serves Ollama's models; one it does not show (404 on /api/show) gets no guess."""
    get = _Server({"/api/ps": (200, {"models": []}), "/api/show": (404, {"error": "model 'm' not found"})})
    assert asyncio.run(acc.ServedProbe(get).ask(acc.ServedServer("openai", "http://o", "", "m"))) == (0, "/api/ps")
    shown = _Server({"/api/ps": (200, {"models": []}), "/api/show": (200, local.ollama_show("m", 131072, None))})
    assert asyncio.run(acc.ServedProbe(shown).ask(OLLAMA)) == (acc.OLLAMA_DEFAULT_WINDOW, "guess")


def test_a_guess_is_assumed_only_while_nothing_firm_is_known_and_a_request_waits_only_then():
    windows, model = acc.ModelWindow(), {"id": "m", "ollama": {"model": "m"}}
    windows.guessed["m"] = 4096
    assert windows.find("m", model, acc.RequestParams.of({}, model)) == acc.Window(4096, "guessed")
    told = acc.window_notes(windows.news("m", windows.find("m", model, acc.RequestParams.of({}, model)), "a1"))
    assert [n.text("en") for n in told] == [
        "window 4.1k assumed: Ollama's smallest default (the model is not loaded yet)"
    ]
    assert not acc.firm_window(windows.find("m", model, acc.RequestParams.of({}, model)), model)
    windows.serve("m", 8192)
    assert windows.find("m", model, acc.RequestParams.of({}, model)).tokens == 8192 and not windows.guessed
    assert acc.firm_window(windows.find("m", model, acc.RequestParams.of({}, model)), model)
    trained_only = {"id": "l", "openai": {"id": "l", "meta": {"n_ctx_train": 131072}}}
    assert not acc.firm_window(acc.Window(131072, "published"), trained_only)
    assert acc.firm_window(acc.Window(32768, "published"), {"openai": {"id": "v", "max_model_len": 32768}})
    assert acc.firm_window(acc.Window(8192, "error"), {}) and not acc.firm_window(acc.NO_WINDOW, {})


def test_ollamas_load_window_comes_from_the_modelfile_else_the_smallest_default_under_the_trained_size():
    assert acc.ollama_load_window(local.ollama_show("m", 131072, 8192)) == (8192, False)
    assert acc.ollama_load_window(local.ollama_show("m", 131072, None)) == (acc.OLLAMA_DEFAULT_WINDOW, True)
    assert acc.ollama_load_window(local.ollama_show("m", 2048, None)) == (2048, True)
    assert acc.ollama_load_window({"parameters": "num_ctx banana\nnum_ctx 16384"}) == (16384, False)
    assert acc.ollama_load_window(None) == (acc.OLLAMA_DEFAULT_WINDOW, True)
    assert acc.ollama_load_window({"parameters": 7, "model_info": ["x"]}) == (acc.OLLAMA_DEFAULT_WINDOW, True)


def test_a_model_known_only_by_its_trained_size_reads_its_row_each_turn():
    """Another worker's lesson reaches this one at its next turn, not after WINDOWS_REFRESH: llama-server without
    /props publishes only the size it was trained for (e2e: a second rejection on the other worker)."""
    store, one, two = _Store(), acc.ModelWindow(), acc.ModelWindow()
    reads = []
    read_window = store.read_window

    async def counted_read(model):
        reads.append(model)
        return await read_window(model)

    store.read_window = counted_read
    llamacpp = {"id": "m", "urlIdx": 0, "openai": {"id": "m", "meta": {"n_ctx_train": 131072}}}
    vllm = {"id": "v", "urlIdx": 0, "openai": {"id": "v", "max_model_len": 32768}}
    params = acc.RequestParams.of({"messages": [{"role": "user", "content": "hi"}]})

    async def turn(model_id, entry, request):  # the window; for_turn also gives what a failed reply taught
        return (await two.for_turn(store, model_id, entry, request, user="u", failed=None))[0]

    async def run():
        assert (await turn("m", llamacpp, params)).tokens == 131072
        one.learn("m", 8192, "error", 131072, firm=0)  # as for_turn learns it: a trained size is not firm
        one.learn("v", 16384, "error", 32768)
        await store.save_windows(one.unsaved)
        return (await turn("m", llamacpp, params)).tokens, (await turn("v", vllm, params)).tokens

    assert asyncio.run(run()) == (8192, 32768)  # vLLM's published window is served: read every WINDOWS_REFRESH
    assert reads == ["m", "m"]


def test_an_ask_over_http_carries_the_key_to_the_server_alone():
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/moved":  # a redirect elsewhere must not take the key along
                self.send_response(302)
                self.send_header("Location", "/props")
                self.end_headers()
                return
            body, status = (
                (b'{"default_generation_settings": {"n_ctx": 8192}}', 200) if self.path == "/props" else (b"no", 404)
            )
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert acc.http_get_json(root + "/props", "sk-1") == (200, {"default_generation_settings": {"n_ctx": 8192}})
        assert acc.http_get_json(root + "/api/ps", "") == (404, None)
        assert acc.http_get_json(root + "/moved", "sk-1")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    assert acc.http_get_json(root + "/props", "sk-1", timeout=0.5) == (0, None)  # nobody there
    assert seen == [("/props", "Bearer sk-1"), ("/api/ps", None), ("/moved", "Bearer sk-1"), ("/props", None)]
