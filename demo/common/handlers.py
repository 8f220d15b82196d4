"""What every event handler of the page shares: its context bound in, who is asking, and refusals as messages.

Handlers are module-level functions whose first parameters are what they work on (the run manager, the retrieval
service), so tests call them directly; `bind` fixes those for the page. Bad input anywhere becomes a warning toast
plus a message in the page (`reporting`), never a traceback.
"""

from __future__ import annotations

import functools
import inspect
import logging

import gradio as gr

log = logging.getLogger(__name__)


def bind(handler, *context):
    """`handler` with its first parameters fixed to `context`, as functools.partial would, but still a function
    whose signature and type hints Gradio reads: it finds the gr.Request and gr.SelectData it passes by their
    annotations, which it cannot see through a partial (it would pass None), and names the API's parameters after
    the remaining ones."""

    @functools.wraps(handler)
    def bound(*args, **kwargs):
        return handler(*context, *args, **kwargs)

    signature = inspect.signature(handler)
    bound.__signature__ = signature.replace(parameters=list(signature.parameters.values())[len(context):])
    return bound


def visitor_key(visitor: str | None, request: gr.Request | None) -> str:
    """Who is asking: the key the browser keeps (survives reloads), else the API client's session."""
    if visitor:
        return visitor
    return getattr(request, "session_hash", None) or "anonymous"


def reporting(message_slot: int, outputs: int, cleared: dict | None = None):
    """Turn a refused request into a warning toast and a message in output `message_slot`; other outputs keep
    their values, except those `cleared` maps (output index -> value) to what they show instead: an earlier answer
    left beside a refusal would read as its answer. Unexpected errors are logged with their traceback for the
    operator, shown as one line."""

    def decorate(handler):
        @functools.wraps(handler)
        def wrapper(*args, **kwargs):
            try:
                return handler(*args, **kwargs)
            except ValueError as error:
                message = str(error)
            except Exception as error:  # noqa: BLE001 - the page shows a line, the log keeps the traceback
                log.exception("%s failed", handler.__name__)
                message = f"Something went wrong ({type(error).__name__}: {error})."
            gr.Warning(message)
            values = [gr.skip()] * outputs
            for slot, value in (cleared or {}).items():
                values[slot] = value
            values[message_slot] = f"⚠️ {message}"
            return tuple(values) if outputs > 1 else values[0]

        return wrapper

    return decorate
