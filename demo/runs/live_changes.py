"""A run's live changes in the page's words: one formatter for the status line, the note beside the live controls,
the loss chart's marks and the results table.

Everything is read from the typed fields of the Trainer's control events and records (memvir.events.ControlEvent:
the settings changed, the values they replaced, the step), never from the Trainer's sentence. A control record
written before records carried the values they replaced (`previous`) has only that sentence to tell them: such a
record falls back to it here, in `legacy_words` alone, with the settings' names swapped for the page's.
"""

from __future__ import annotations

from dataclasses import dataclass

from memvir.config import SettingRefused
from memvir.events import ControlEvent, ControlRefused

# The live settings (memvir.config.LIVE_SETTINGS, each of them: a test checks) as the page's controls name them
LIVE_LABELS = {"memvir_n": "N", "memvir_m": "M", "warmup_epochs": "warm-up (epochs)", "lr": "lr",
               "class_lr": "class lr", "focus_classes": "classes shown"}


@dataclass(frozen=True)
class LiveChange:
    """One setting changed while the run trained: from `old` to `new`, the first step trained with `new` being
    `step`."""

    step: int
    setting: str
    old: object
    new: object

    def words(self) -> str:
        """'N 4 -> 6'."""
        return f"{label(self.setting)} {value_words(self.old)} -> {value_words(self.new)}"


def label(setting: str) -> str:
    return LIVE_LABELS.get(setting, setting)


def refusal_words(error: Exception) -> str:
    """A refused value in the page's words: a setting TrainConfig refused is named as the page's control names it
    ('N must be an integer >= 0, got -1', where the library says memvir_n); any other refusal as it was said."""
    if isinstance(error, SettingRefused):
        return f"{label(error.setting)} {error.detail}"
    return str(error)


def value_words(value) -> str:
    """A setting's value as the page writes it: 2, 0.5, 0.00133, [3, 1]."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def changes_words(changes: dict, previous: dict) -> str:
    """'N 2 -> 3, M 10 -> 5': each of `changes` (setting: new value) from its value in `previous`."""
    return ", ".join(f"{label(name)} {value_words(previous.get(name, '?'))} -> {value_words(value)}"
                     for name, value in changes.items())


def event_changes(event: ControlEvent) -> list[LiveChange]:
    """The changes a ControlEvent applied, each at the first step trained with it (the event's step is the last
    trained before it)."""
    return [LiveChange(event.step + 1, name, event.previous.get(name), value) for name, value in event.changes.items()]


def applied_words(event: ControlEvent) -> str:
    """'N 2 -> 3: applied at step 429'."""
    return f"{changes_words(event.changes, event.previous)}: applied at step {event.step + 1}"


def refused_words(event: ControlRefused, live: dict) -> str:
    """'N 10 -> 50 refused at step 11: its memory could not be allocated (...); the run trains on with N = 10, M = 2',
    `live` being the run's settings as they stand."""
    return (f"{changes_words(event.changes, live)} refused at step {event.step + 1}: its memory could not be "
            f"allocated ({event.reason}); the run trains on with N = {value_words(live['memvir_n'])}, "
            f"M = {value_words(live['memvir_m'])}")


PENDING = "pending, the run applies it before its next step"


def pending_words(asked: dict, live: dict) -> str:
    """'Asked for N 2 -> 3: pending, the run applies it before its next step.'"""
    return f"Asked for {changes_words(asked, live)}: {PENDING}."


def record_event(record: dict) -> ControlEvent:
    """A control record of metrics.jsonl read back as the event it was (memvir.events.ControlEvent.record)."""
    return ControlEvent.from_record(record)


def record_changes(records: list[dict] | None) -> list[LiveChange]:
    """Every live change a run's records hold, in order (the records that say what they replaced)."""
    changes = []
    for record in records or ():
        if record.get("type") == "control":
            event = record_event(record)
            if event.previous:
                changes += event_changes(event)
    return changes


def story(changes: list[LiveChange]) -> str:
    """'N 4 -> 6 at step 522, M 10 -> 20 at step 700'."""
    return ", ".join(f"{change.words()} at step {change.step:,}" for change in changes)


def control_words(record: dict) -> tuple[int, str, str]:
    """(the first step trained with it, its changes, the sentence) of a control record in the page's words:
    (429, 'N 2 -> 3', 'N 2 -> 3: applied at step 429')."""
    event = record_event(record)
    if event.previous:
        return event.step + 1, changes_words(event.changes, event.previous), applied_words(event)
    sentence = legacy_words(event.message)
    return event.step + 1, sentence.split(": applied")[0], sentence


def legacy_words(message: str) -> str:
    """A control record without `previous` (written before records carried it): its Trainer's sentence, 'memvir_n 2
    -> 3: applied at step 429', with the settings' names in the page's words, 'N 2 -> 3: applied at step 429'. Kept
    for run folders written then; every newer record is read from its fields."""
    words = []
    for word in message.split(" "):
        name = word.rstrip(",:")
        words.append(label(name) + word[len(name):] if name in LIVE_LABELS else word)
    return " ".join(words)
