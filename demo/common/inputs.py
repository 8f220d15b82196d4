"""What a visitor types into the page or sends to its API, checked before anything else reads it: the one place for
the app's input checks.

Text first (`check_text`): a field longer than MAX_TEXT_CHARS is refused by its length before it is parsed, and a
lone surrogate (what a browser's JSON.stringify sends for half an emoji, and what the server cannot encode back) or a
control character is refused by name; a refusal never echoes the value whole (`shown`). `demo.common.handlers`
applies it to every text argument of every handler, and `demo.common.shims.refuse_outside_choices` to the dropdowns
and radios, whose values gradio checks before a handler runs.

Numbers next. Integer controls are plain gr.Number / gr.Slider without rounding (Gradio's precision=0 rounds 1.5 to
2 before the handler sees it): a value that is not a whole number is refused with its name, never silently changed.
Every number is bounded: 1e308 epochs is a whole number to Python, and a status line that divides by it overflows.
"""

from __future__ import annotations

import math
import unicodedata

# Far above any dataset name, path, repo id, class name or list of classes the page takes; far below what costs the
# server anything to refuse.
MAX_TEXT_CHARS = 1_000
# The largest whole number a browser's number box holds exactly (a JavaScript double): past it the page could not
# have sent the number it shows, and every count the app derives from one stays far from overflowing a float.
MAX_WHOLE_NUMBER = 2**53
MAX_NUMBER = 1e12  # rates and factors: far above any that trains, far below a float's range
_SHOWN_CHARS = 40


class InputRefused(ValueError):
    """A value a visitor sent that the app does not read: too long, not valid text, out of range."""


def shown(value, most: int = _SHOWN_CHARS) -> str:
    """`value` as a refusal may quote it: at most `most` characters, surrogates and control characters escaped."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > most:
        text = text[: most - 1] + "…"
    return "".join(c if unicodedata.category(c) not in ("Cs", "Cc") else f"\\u{ord(c):04x}" for c in text)


def check_text(value, name: str, most: int = MAX_TEXT_CHARS):
    """`value` unchanged when it is not text, or text the app can read; else InputRefused naming `name`."""
    if not isinstance(value, str):
        return value
    if len(value) > most:
        raise InputRefused(f"{name} is {len(value):,} characters long; at most {most:,} are accepted: shorten it")
    for character in value:
        category = unicodedata.category(character)
        if category == "Cs":
            raise InputRefused(f"{name} holds a broken character (a lone surrogate, U+{ord(character):04X}), which "
                               "is not text: type it again")
        if category == "Cc":
            raise InputRefused(f"{name} holds a control character (U+{ord(character):04X}): remove it and try again")
    return value


def _as_float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def whole_number(value, name: str, minimum: int, maximum: int = MAX_WHOLE_NUMBER) -> int:
    """`value` as an int when it is a whole number from `minimum` to `maximum`; else InputRefused naming `name`."""
    if value is None or value == "":
        raise InputRefused(f"{name} is empty: enter a whole number of at least {minimum}")
    number = _as_float(check_text(value, name))
    if not math.isfinite(number) or number != int(number) or number < minimum:
        raise InputRefused(f"{name} must be a whole number of at least {minimum}, got {shown(value)}")
    if number > maximum:
        raise InputRefused(f"{name} must be a whole number from {minimum} to {maximum:,}, got {shown(value)}")
    return int(number)


def box_number(value, name: str) -> int | float:
    """The number a box holds, for the library to judge (memvir's TrainConfig is the policy for the settings it owns):
    a whole one as an int (a slider sends 3 as 3.0), any other as a float. InputRefused naming `name` only for what is
    no number: an empty box, text, or a number past what a box holds exactly (MAX_WHOLE_NUMBER, either sign)."""
    if value is None or value == "":
        raise InputRefused(f"{name} is empty: enter a number")
    number = _as_float(check_text(value, name))
    if math.isnan(number) or abs(number) > MAX_WHOLE_NUMBER:
        raise InputRefused(f"{name} must be a number from -{MAX_WHOLE_NUMBER:,} to {MAX_WHOLE_NUMBER:,}, "
                           f"got {shown(value)}")
    return int(number) if number.is_integer() else number

def positive_number(value, name: str, maximum: float = MAX_NUMBER) -> float:
    """`value` as a float when it is a number above 0 and at most `maximum`; else InputRefused naming `name`."""
    number = _as_float(check_text(value, name)) if value not in (None, "") else math.nan
    if not math.isfinite(number) or number <= 0:
        raise InputRefused(f"{name} must be a number above 0, got {shown(value)}")
    if number > maximum:
        raise InputRefused(f"{name} must be a number above 0 and at most {maximum:g}, got {shown(value)}")
    return number


def whole_numbers(text, name: str, most: int) -> list[int]:
    """Distinct whole numbers >= 0 typed as "3, 17, 40" (commas or spaces), at most `most` of them; [] for an empty
    box; else InputRefused naming `name`. The length is checked before anything is split."""
    parts = str(check_text(text or "", name)).replace(",", " ").split()
    if len(parts) > most:
        raise InputRefused(f"{name}: at most {most}, got {len(parts)}")
    numbers = [whole_number(part, name, 0) for part in parts]
    if len(set(numbers)) != len(numbers):
        raise InputRefused(f"{name}: each may appear once, got {shown(text)}")
    return numbers
