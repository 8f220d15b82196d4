"""Runs reported to a tracker: a Trainer listener that sends what metrics.jsonl records to trackio or TensorBoard.

`TrainConfig.report_to` picks the tracker ("none" by default); the Trainer imports this module only when one is
picked, and the tracker's package only when the run starts, so that the training path keeps its few imports (a lent
GPU machine may have neither package).

What is sent, at the step of the record: each logged step's numbers (memvir.events.StepEvent.record: the loss, the
class count s(i) as `num_classes`, the mean cos(x, W_y) as `mean_target_cosine`, k, the learning rate, images/s, and
the spread and Adam figures on the steps that have them) under `train/`; each evaluation's retrieval metrics
(Recall@K, precision@1, R-Precision, MAP@R) under `test/`, the validation classes' under `val/`. The run's settings
(`TrainConfig.to_dict()`) are the run's config. Under torchrun only rank 0 reports (`reporter_for`), as only rank 0
writes the run folder.

- trackio: the project `config.report_project`, the run named after the run folder (a resumed run continues its trackio
  run). Locally by default (trackio's folder: TRACKIO_DIR, else trackio under the Hugging Face cache; `trackio show`
  opens its dashboard), or a Hugging Face Space (`config.report_space`, its metrics kept in `config.report_bucket`
  when named) with the user's own Hub login.
- tensorboard: event files in the run folder's `tensorboard/` (`tensorboard --logdir RUN/tensorboard`), the settings as
  the text `config`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import sys
from abc import ABC, abstractmethod
from pathlib import Path

from memvir.events import EvalEvent, StatusEvent, StepEvent

TENSORBOARD_FOLDER = "tensorboard"
"""Where in the run folder the TensorBoard event files go."""

_ENDS = ("stopped", "finished", "failed")
"""The states after which `Trainer.run` returns: the tracker's run is closed (flushed) there."""

_STEP_FIELDS_KEPT_OUT = ("type", "step", "epoch")  # the step is the x axis; the epoch follows from it


def reporter_for(config, out_dir: str | Path | None, world):
    """The listener that reports a Trainer's run to `config.report_to`, or None where this process does not report:
    "none", or a rank other than 0 under torchrun (the ranks' events are the same; one voice per run)."""
    if config.report_to == "none" or not world.is_main:
        return None
    reporters = {"trackio": TrackioReporter, "tensorboard": TensorBoardReporter}
    return reporters[config.report_to](config, out_dir)


def step_metrics(event: StepEvent) -> dict[str, float]:
    """A logged step's numbers as the tracker receives them: metrics.jsonl's step record, under `train/`, without the
    values a GPU step leaves unknown (None) and the flags (`warmup`)."""
    return {f"train/{name}": float(value) for name, value in event.record().items()
            if name not in _STEP_FIELDS_KEPT_OUT and _is_number(value)}


def eval_metrics(event: EvalEvent) -> dict[str, float]:
    """An evaluation's metrics as the tracker receives them: the test classes' under `test/`, the validation classes'
    (`val_*` in metrics.jsonl) under `val/`."""
    metrics = {}
    for name, value in event.metrics.items():
        if _is_number(value):
            key = f"val/{name.removeprefix('val_')}" if name.startswith("val_") else f"test/{name}"
            metrics[key] = float(value)
    return metrics


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class _Reporter(ABC):
    """Sends the events' metrics to a tracker opened at the run's first event (when its step is known) and closed
    when the run ends; the process's exit closes it too, whatever ends the process."""

    def __init__(self, config, out_dir: str | Path | None):
        self.config = config
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self._open = False

    def __call__(self, event) -> None:
        if isinstance(event, StepEvent):
            metrics = step_metrics(event) if event.logged else {}
        elif isinstance(event, EvalEvent):
            metrics = eval_metrics(event)
        elif isinstance(event, StatusEvent):
            if event.state in _ENDS:
                self.close()
            elif not self._open:
                self._start(event.step)
            return
        else:
            return
        if metrics:
            if not self._open:
                self._start(event.step)
            self._send(metrics, event.step)

    def _start(self, step: int) -> None:
        self._begin(step)
        self._open = True
        atexit.register(self.close)

    def close(self) -> None:
        """Flush and close the tracker's run (a no-op when none is open)."""
        if not self._open:
            return
        self._open = False
        atexit.unregister(self.close)
        self._end()

    def _settings(self) -> dict:
        return self.config.to_dict()

    # what each tracker implements
    @abstractmethod
    def _begin(self, step: int) -> None:
        """Open the tracker's run at `step`: 0 for a new run, the checkpoint's step for a resumed one."""

    @abstractmethod
    def _send(self, metrics: dict[str, float], step: int) -> None:
        """Send one logged step's or evaluation's numbers at `step`."""

    @abstractmethod
    def _end(self) -> None:
        """Flush and close the tracker's run."""


def _missing(package: str, version: str) -> ValueError:
    return ValueError(f"report_to {package} needs the {package} package, which is not installed: pip install "
                      f"{package}=={version} (or report_to none)")


class TrackioReporter(_Reporter):
    """The run in trackio (locally, or on a Space when `config.report_space` names one)."""

    def _begin(self, step: int) -> None:
        try:
            import trackio
        except ImportError:
            raise _missing("trackio", "0.43.0") from None
        name = self.out_dir.name if self.out_dir is not None else None  # None: trackio makes up a name
        # trackio announces itself on stdout; the CLI's stdout is its one result line, so its words go to stderr
        with contextlib.redirect_stdout(sys.stderr):
            # the Run object, not trackio.log: trackio's module functions find the run in a context variable that a
            # Trainer running in another thread (the app's) would not see
            self._run = trackio.init(
                project=self.config.report_project, name=name, config=self._settings(),
                space_id=self.config.report_space, bucket_id=self.config.report_bucket,
                resume="allow" if step > 0 and name is not None else "never",
                auto_log_cpu=False, auto_log_gpu=False,  # what the issue asks for, not the machine's load
                embed=False,
            )

    def _send(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def _end(self) -> None:
        import trackio

        with contextlib.redirect_stdout(sys.stderr):
            # trackio.finish, not the Run's: it finishes the run this thread started and forgets it, which the Run's
            # own finish does not, so that trackio's exit hook does not finish it again (printing on stdout)
            try:
                trackio.finish()
            except RuntimeError:  # another thread than the run's (the exit's): trackio knows no run here
                self._run.finish()


class TensorBoardReporter(_Reporter):
    """Event files in the run folder's `tensorboard/`."""

    def __init__(self, config, out_dir: str | Path | None):
        if out_dir is None:
            raise ValueError("report_to tensorboard writes its event files into the run folder; give the Trainer an "
                             "out_dir (the CLI's --out), or report to trackio")
        super().__init__(config, out_dir)

    def _begin(self, step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing("tensorboard", "2.21.0") from None
        # a resumed run starts again from its checkpoint's step: what a stopped or killed process wrote past it is
        # hidden (purge_step), as metrics.jsonl is cut back to the checkpoint's records
        self._writer = SummaryWriter(log_dir=str(self.out_dir / TENSORBOARD_FOLDER),
                                     purge_step=step + 1 if step > 0 else None)
        if step == 0:
            settings = json.dumps(self._settings(), indent=2)
            # indented four spaces: TensorBoard's text view reads markdown, and this keeps the JSON as written
            self._writer.add_text("config", "\n".join("    " + line for line in settings.splitlines()), 0)

    def _send(self, metrics: dict[str, float], step: int) -> None:
        for tag, value in metrics.items():
            self._writer.add_scalar(tag, value, step)

    def _end(self) -> None:
        self._writer.close()
