"""Calling a served app's events as the page's script does, through gradio's queue (POST queue/join, then the
queue/data event stream), with the request body written by json.dumps: a lone surrogate goes as "\\ud800", as a
browser's JSON.stringify sends it, which gradio_client cannot send at all (it encodes the body as UTF-8 first)."""

import json
import uuid

import httpx


class BrowserSession:
    """One page's session on the app served at `url` (its events share their gr.State, as one tab's do)."""

    def __init__(self, url: str, timeout: float = 120.0):
        self.url = url.rstrip("/") + "/"
        self.session_hash = uuid.uuid4().hex[:11]
        self.timeout = timeout
        config = httpx.get(self.url + "config", timeout=timeout).json()
        self.events = {dependency["api_name"]: dependency["id"] for dependency in config["dependencies"]
                       if dependency.get("api_name")}

    def call(self, api_name: str, data: list, event_data=None) -> "Answer":
        """Send one event; the answer the stream ended with."""
        body = json.dumps({"data": data, "event_data": event_data, "fn_index": self.events[api_name],
                           "trigger_id": None, "session_hash": self.session_hash})
        joined = httpx.post(self.url + "gradio_api/queue/join", content=body,
                            headers={"content-type": "application/json"}, timeout=self.timeout)
        joined.raise_for_status()
        size, last = 0, None
        with httpx.stream("GET", self.url + "gradio_api/queue/data", params={"session_hash": self.session_hash},
                          timeout=self.timeout) as stream:
            for line in stream.iter_lines():
                size += len(line)
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("msg") in ("process_completed", "close_stream", "unexpected_error"):
                    last = message
                    break
        return Answer(last, size)


class Answer:
    """What an event answered: its outputs (`data`), or gradio's error text (`error`); `size`: characters read."""

    def __init__(self, message: dict | None, size: int):
        self.message = message or {}
        self.size = size
        output = self.message.get("output") or {}
        self.data = output.get("data")
        self.error = output.get("error") if not self.message.get("success", False) else None
        if self.message.get("msg") == "unexpected_error":
            self.error = self.message.get("message")

    def __repr__(self) -> str:
        return f"Answer({str(self.message)[:300]!r}, size={self.size})"
