"""What every event handler of the page shares: who is asking, and refusals as messages.

Handlers are methods of a small class per tab or concern that holds what they work on (demo.train.tab.TrainHandlers
the run manager, demo.retrieve.tab.RetrieveHandlers the retrieval service, ...). The page wires the bound methods:
Gradio reads a bound method's signature and type hints without `self`, so it passes gr.Request and gr.SelectData by
their annotations and names the API's parameters after the rest; tests call the same methods. Bad input anywhere
becomes a warning toast plus a message in the page (`reporting`), never a traceback: every text argument is checked
first (demo.common.inputs.check_text), and each refusal is logged as one line.
"""

from __future__ import annotations

import functools
import inspect
import logging

import gradio as gr

from demo.common.inputs import InputRefused, check_text, shown

log = logging.getLogger(__name__)


def visitor_key(visitor: str | None, request: gr.Request | None) -> str:
    """Who is asking: the key the browser keeps (survives reloads), else the API client's session, which also
    stands in for a key that is not text (the handlers that act for a visitor refuse such a key: `reporting`)."""
    try:
        if visitor and check_text(visitor, VISITOR_KEY):
            return visitor
    except InputRefused:
        pass
    return getattr(request, "session_hash", None) or "anonymous"


VISITOR_KEY = "the page's visitor key (reload the page for a new one)"
# What a refusal calls a handler's text parameters; any other is named after the parameter, "folder_path" as
# "the folder path".
TEXT_NAMES = {"visitor": VISITOR_KEY, "focus_classes": "the classes shown", "checkpoint_choice": "the checkpoint",
              "query_class": "the query's class", "repo_id": "the repo id"}


def check_texts(parameters: list[str], args: tuple, kwargs: dict) -> None:
    """InputRefused (demo.common.inputs) for the first text argument of a handler of these `parameters` (or text in
    a list argument, such as uploaded files' paths) that is too long or not text, named as the page names it."""
    named = list(zip(parameters, args, strict=False)) + list(kwargs.items())
    for name, value in named:
        label = TEXT_NAMES.get(name, f"the {name.replace('_', ' ')}")
        for item in value if isinstance(value, list | tuple) else (value,):
            check_text(item, label)


def reporting(message_slot: int, outputs: int, cleared: dict | None = None):
    """Turn a refused request into a warning toast and a message in output `message_slot`; other outputs keep
    their values, except those `cleared` maps (output index -> value) to what they show instead: an earlier answer
    left beside a refusal would read as its answer. Unexpected errors are logged with their traceback for the
    operator; the page is told only the error's kind (its text may hold the server's paths).

    A generator handler (one that says something at once, then its answer) keeps what it yielded before a refusal;
    the refusal is its last answer."""

    def decorate(handler):
        parameters = list(inspect.signature(handler).parameters)
        # A method's `self` is its first parameter and its first argument: neither is a text to check.
        skipped = 1 if parameters[:1] == ["self"] else 0

        def refusal(error: Exception):
            if isinstance(error, ValueError):
                message = str(error)
                log.warning("%s refused: %s", handler.__name__, shown(message, 300))
            else:
                log.error("%s failed", handler.__name__, exc_info=error)
                message = (f"Something went wrong on the server ({type(error).__name__}); its log has the details. "
                           "Try again, or tell the app's operator.")
            gr.Warning(message)
            values = [gr.skip()] * outputs
            for slot, value in (cleared or {}).items():
                values[slot] = value
            values[message_slot] = f"⚠️ {message}"
            return tuple(values) if outputs > 1 else values[0]

        if inspect.isgeneratorfunction(handler):
            @functools.wraps(handler)
            def generating(*args, **kwargs):
                try:
                    check_texts(parameters[skipped:], args[skipped:], kwargs)
                    yield from handler(*args, **kwargs)
                except Exception as error:  # noqa: BLE001 - the page shows a line, the log keeps the traceback
                    yield refusal(error)

            generating.reported_outputs = outputs
            return generating

        @functools.wraps(handler)
        def wrapper(*args, **kwargs):
            try:
                check_texts(parameters[skipped:], args[skipped:], kwargs)
                return handler(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - the page shows a line, the log keeps the traceback
                return refusal(error)

        wrapper.reported_outputs = outputs  # what the page wires it to: a test checks that they agree
        return wrapper

    return decorate
