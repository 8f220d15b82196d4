"""One registry shape (name -> builder, as timm's `models/_registry.py`) for the losses, the backbones and the datasets.

A registry keeps its entries in registration order, takes new ones through a decorator, refuses a name taken twice,
and refuses an unknown name with one wording everywhere: the known names (and any other forms the caller accepts,
such as `timm:NAME`) and, where one is close, the name the user probably meant.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    """Names -> entries (classes or builder functions) of one kind.

    Args:
        kind: what an entry is, as a refusal says it ("loss", "backbone", "dataset").
        other_forms: names the caller accepts beside the entries, listed after them in a refusal
            (e.g. "timm:NAME (any timm model)").
        error: the exception type a refusal raises (a ValueError subclass, such as memvir.data's DatasetError).
    """

    def __init__(self, kind: str, other_forms: tuple[str, ...] = (), error: type[ValueError] = ValueError):
        self.kind = kind
        self.other_forms = tuple(other_forms)
        self.error = error
        self._entries: dict[str, Entry] = {}

    def register(self, name: str) -> Callable[[Entry], Entry]:
        """Decorator: register the decorated class or function as `name`; ValueError if `name` is taken.

        Returns:
            The decorator, which hands back what it decorates unchanged.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")

        def add(entry: Entry) -> Entry:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
            self._entries[name] = entry
            return entry

        return add

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def get(self, name: str) -> Entry:
        """The entry registered as `name`; `self.error` with `refusal(name)` if there is none."""
        if name not in self._entries:
            raise self.error(self.refusal(name))
        return self._entries[name]

    def refusal(self, name) -> str:
        """Why `name` is refused: the known names and other forms, and the nearest known name where one is close."""
        choices = [*self._entries, *self.other_forms]
        listed = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else "".join(choices)
        close = difflib.get_close_matches(name, self._entries, n=1) if isinstance(name, str) else []
        meant = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{meant}: use one of {listed}"

    def copy(self) -> Registry[Entry]:
        """A registry of the same kind holding the same entries, to register into without changing this one."""
        duplicate = Registry(self.kind, self.other_forms, self.error)
        duplicate._entries = dict(self._entries)
        return duplicate

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
