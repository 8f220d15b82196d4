"""Numbers typed into the page or sent to its API, checked as the controls mean them.

Integer controls are plain gr.Number / gr.Slider without rounding (Gradio's precision=0 rounds 1.5 to 2 before the
handler sees it): a value that is not a whole number is refused with its name, never silently changed.
"""

from __future__ import annotations

import math


def _as_float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def whole_number(value, name: str, minimum: int) -> int:
    """`value` as an int when it is a whole number >= `minimum`; else ValueError naming `name`."""
    if value is None or value == "":
        raise ValueError(f"{name} is empty: enter a whole number of at least {minimum}")
    number = _as_float(value)
    if not math.isfinite(number) or number != int(number) or number < minimum:
        raise ValueError(f"{name} must be a whole number of at least {minimum}, got {value}")
    return int(number)


def positive_number(value, name: str) -> float:
    """`value` as a float when it is a finite number above 0; else ValueError naming `name`."""
    number = _as_float(value) if value not in (None, "") else math.nan
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be a number above 0, got {value}")
    return number


def whole_numbers(text, name: str, most: int) -> list[int]:
    """Distinct whole numbers >= 0 typed as "3, 17, 40" (commas or spaces), at most `most` of them; [] for an empty
    box; else ValueError naming `name`."""
    parts = str(text or "").replace(",", " ").split()
    numbers = [whole_number(part, name, 0) for part in parts]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"{name}: each may appear once, got {text}")
    if len(numbers) > most:
        raise ValueError(f"{name}: at most {most}, got {len(numbers)}")
    return numbers
