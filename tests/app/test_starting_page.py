"""The starting page (demo.common.starting_page): what `python app.py` serves on its port while gradio and torch load.
Every request gets 503 with Retry-After and a page that says the app is starting; closing it frees the port for the
app; an address it cannot bind gives no starting page, and the app's own launch reports it as before."""

import socket
import urllib.error
import urllib.request

import pytest
from served_app import free_port

from demo.common.starting_page import open_starting_page


def _answer(url: str, data: bytes | None = None) -> urllib.error.HTTPError:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5)
    return refused.value


def test_every_request_is_answered_503_with_a_page_that_says_the_app_is_starting():
    port = free_port()
    starting = open_starting_page({"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)})
    assert starting is not None
    try:
        page = _answer(f"http://127.0.0.1:{port}/")
        assert page.code == 503 and page.headers["Retry-After"] == "1"
        assert page.headers["Content-Type"] == "text/html; charset=utf-8"
        body = page.read().decode()
        assert "<title>MemVir Studio is starting</title>" in body and "opens the app by itself" in body
        assert 'new URL("config", window.location.href)' in body  # what its script waits for: the app's config
        # a client of the API, or a health check, is told to come back, whatever it asks
        for path, data in (("config", None), ("gradio_api/queue/join", b"{}")):
            assert _answer(f"http://127.0.0.1:{port}/{path}", data).code == 503
    finally:
        starting.close()
    with socket.socket() as app:  # the port is the app's now, at once
        app.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        app.bind(("127.0.0.1", port))
        app.listen()


def test_an_address_that_cannot_be_bound_gives_no_starting_page():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert open_starting_page({"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}) is None
    assert open_starting_page({"GRADIO_SERVER_PORT": "not a port"}) is None
    assert open_starting_page({"GRADIO_SERVER_PORT": "70000"}) is None
