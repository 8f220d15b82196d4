"""The client API: the app's public endpoints, as `gr.api` functions of plain values (docs/app.md, "The client API").

A program drives the app with gradio_client (`Client(url).predict(..., api_name="/start_run")`) or HTTP. The page's
own events are not this API: they are private (api_visibility="private"), so the page's wiring may change without
changing it, and no public endpoint answers with a component update. Each function here takes and returns plain
values: text, numbers, booleans, lists and dicts, and files (`gradio.FileData`) for images sent and for downloads.
The functions call the run manager (demo.runs.manager) and the retrieval service (demo.retrieve.service) directly, as
the page's handlers do.

Who is asking: `visitor`, a key the client keeps (as the page keeps one in the browser), or, left empty, the client's
session. A visitor steers only runs they started and watches the others; on a Space a push uses the visitor's own
sign-in, never the server's token (demo.common.hub_access). A refusal is a gradio error whose message says what was
wrong and what to do (gradio_client raises it as `AppError`); an unexpected failure is logged with its traceback and
the client told only its kind.
"""

from __future__ import annotations

import functools
import inspect
import logging
from pathlib import Path

import gradio as gr
from gradio import FileData
from PIL import Image

from demo.common.handlers import check_texts, visitor_key
from demo.common.inputs import shown, whole_number
from demo.common.uploads import load_image
from demo.retrieve import threshold as threshold_view
from demo.retrieve.galleries import Gallery
from demo.retrieve.service import LoadedCheckpoint, RetrievalError, RetrievalService
from demo.runs import live_changes
from demo.runs.live_run import LiveRun
from demo.runs.manager import RunError, RunManager
from demo.train import past_runs, words
from demo.train.live_view import status_markdown
from demo.train.presets import PAGE_DEFAULTS, tuned_baseline
from demo.train.results_table import final_metrics
from demo.train.tab import LIVE_SNAPSHOT_EVERY, TrainHandlers, push_run
from memvir.config import LIVE_SETTINGS
from memvir.retrieval.diagnosis.failures import hardest_queries, largest_differences
from memvir.retrieval.diagnosis.per_class import confused_class_pairs, per_class_difference, per_class_metrics
from memvir.retrieval.diagnosis.ranking import QueryRankings
from memvir.retrieval.diagnosis.verification import OperatingPoint, matches

log = logging.getLogger(__name__)

# The endpoints, in the order docs/app.md's table lists them (tests/app/test_client_api.py checks both against the
# running app's).
ENDPOINTS = ("start_run", "run_status", "list_runs", "update_run", "stop_run", "pause_run", "resume_run",
             "compare_with_baseline", "push_run", "checkpoints", "gallery", "search", "compare", "hardest",
             "class_metrics", "threshold", "checkpoint_zip", "gallery_embeddings")
MAX_ROWS = 100  # the most rows one answer lists (hardest queries, confused pairs of classes)
DEFAULTS = PAGE_DEFAULTS


def answering(method):
    """A client API method whose text arguments are checked first (demo.common.handlers.check_texts) and whose
    refusals (ValueError: RunError, RetrievalError, UploadError, ...) reach the client as their message."""
    parameters = list(inspect.signature(method).parameters)[1:]  # after `self`

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            check_texts(parameters, args, kwargs)
            return method(self, *args, **kwargs)
        except ValueError as error:
            log.warning("/%s refused: %s", method.__name__, shown(str(error), 300))
            raise gr.Error(str(error), print_exception=False) from None
        except Exception as error:  # noqa: BLE001 - the client gets a line, the log keeps the traceback
            log.error("/%s failed", method.__name__, exc_info=error)
            raise gr.Error(f"Something went wrong on the server ({type(error).__name__}); its log has the details. "
                           "Try again, or tell the app's operator.", print_exception=False) from None

    return wrapper


def _path(file) -> str:
    """The path gradio saved a file a client sent to. Only a FileData dict: gradio checks that its path is an upload
    before the call; a bare path, or a dict without FileData's marker, would name any file on the server."""
    if not (isinstance(file, dict) and isinstance(file.get("path"), str)
            and (file.get("meta") or {}).get("_type") == "gradio.FileData"):
        raise ValueError(f"send files as uploads (gradio_client.handle_file(path)), got {shown(file, 80)}")
    return file["path"]


def _point(point: OperatingPoint | None) -> dict | None:
    if point is None:
        return None
    return {"threshold": point.threshold, "fmr": point.fmr, "fnmr": point.fnmr, "false_matches": point.false_matches,
            "false_non_matches": point.false_non_matches}


class RunApi:
    """The client API's run endpoints, bound to the run manager (demo.runs.manager.RunManager)."""

    def __init__(self, runs: RunManager):
        self.runs = runs

    def _run(self, run_id: str, visitor: str) -> LiveRun | None:
        """The run named, else the one the visitor's page would show (their own latest, else the latest that
        trains, as demo.runs.manager.RunManager.attach picks); None when there is none."""
        if not run_id:
            return self.runs.attach(visitor)
        run = self.runs.get(run_id)
        if run is None:
            raise RunError(f"there is no run {run_id!r} on this server (/run_status names the run a visitor sees)")
        return run

    def _status(self, run: LiveRun | None, visitor: str, history: bool = False) -> dict:
        if run is None:
            return {"run_id": None, "state": "none", "status_line": status_markdown(None, visitor)}
        with run.lock:
            last = run.last_step
            records = list(run.records)
            answer = {
                "run_id": run.id, "state": run.state, "message": run.message, "yours": run.owner == visitor,
                "dataset": run.config.dataset, "step": last.step if last else 0, "total_steps": run.total_steps,
                "epoch": last.epoch if last else 0, "loss": last.loss if last else None,
                "num_classes": last.num_classes if last else None,
                "num_virtual_sets": last.num_virtual_sets if last else None,
                "live_values": dict(run.live_values), "pending": dict(run.pending),
                "changes": [{"step": change.step, "setting": change.setting, "old": change.old, "new": change.new}
                            for change in run.changes],
                "snapshot_steps": [view.step for view in run.snapshots],
                "can_resume": run.can_resume,
            }
        answer["controls_note"] = run.controls_note()
        answer["status_line"] = status_markdown(run, visitor)
        answer["evaluations"] = [{k: v for k, v in record.items() if k != "type"} for record in records
                                 if record.get("type") == "eval"]
        if history:
            answer["steps"] = [{"step": record["step"], "epoch": record["epoch"], "loss": record.get("loss"),
                                "num_classes": record.get("num_classes"),
                                "num_virtual_sets": record.get("num_virtual_sets")}
                               for record in records if record.get("type") == "step"]
        baseline = run.baseline
        answer["baseline"] = None if baseline is None else {
            "run_id": baseline.id, "state": baseline.state, "training": baseline.training,
            "step": baseline.last_step.step if baseline.last_step else 0, "total_steps": baseline.total_steps}
        return answer

    @answering
    def start_run(self, dataset: str = DEFAULTS["dataset"], backbone: str = DEFAULTS["backbone"],
              loss: str = DEFAULTS["loss"], batch_size: int = DEFAULTS["batch_size"], epochs: int = DEFAULTS["epochs"],
              lr: float = DEFAULTS["lr"], seed: int = DEFAULTS["seed"], memvir_n: int = DEFAULTS["memvir_n"],
              memvir_m: int = DEFAULTS["memvir_m"], warmup_epochs: float = DEFAULTS["warmup_epochs"],
              snapshot_every: int = LIVE_SNAPSHOT_EVERY, eval_every: int = DEFAULTS["eval_every"],
              folder_path: str = "", zip_file: FileData | None = None,
              memvir_schedule: str = DEFAULTS["memvir_schedule"], val_classes: int = DEFAULTS["val_classes"],
              memvir_store_dtype: str = DEFAULTS["memvir_store_dtype"],
              memvir_reduction: str = DEFAULTS["memvir_reduction"], focus_classes: str = "",
              class_lr: float = DEFAULTS["class_lr"], adam_eps: float = DEFAULTS["adam_eps"],
              loss_scale: float | None = DEFAULTS["loss_params"]["scale"], hub_dataset: str = "", visitor: str = "",
              request: gr.Request = None) -> dict:
        """Start a training run with the Train tab's settings; its status (as /run_status gives it) once its Trainer is
        built.

        Args:
            dataset: glyphs, glyphs-mini, "folder" (with folder_path), "zip" (with zip_file) or "hub" (with
                hub_dataset).
            backbone: a backbone of the library (the Train tab's list).
            loss: a loss of the library.
            batch_size: images per step.
            epochs: epochs to train.
            lr: the embedding's learning rate.
            seed: the run's seed.
            memvir_n: N, past steps used as virtual classes (0 = the baseline).
            memvir_m: M, steps between the past steps used.
            warmup_epochs: epochs before virtual classes.
            snapshot_every: an embedding snapshot every this many steps (0 = none).
            eval_every: Recall@1 every this many epochs (0 = at the end).
            folder_path: a folder on the server with one sub-folder of images per class (dataset "folder").
            zip_file: a zip of class folders (dataset "zip").
            memvir_schedule: curriculum (the paper's) or all-at-once.
            val_classes: validation classes held out of training.
            memvir_store_dtype: float32 or float16 (MemVir's memory).
            memvir_reduction: official or balanced.
            focus_classes: the training classes the snapshots show, "3, 17, 40" (empty: the run's own pick).
            class_lr: the class weights' learning rate.
            adam_eps: Adam's eps.
            loss_scale: the loss's scale (ignored by a loss without one).
            hub_dataset: OWNER/NAME[@REVISION] of a Hub image-classification dataset (dataset "hub").
            visitor: who is asking (any key the client keeps); empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        run = TrainHandlers(self.runs).start_run(
            dataset, backbone, loss, batch_size, epochs, lr, seed, memvir_n, memvir_m, warmup_epochs, snapshot_every,
            eval_every, folder_path, _path(zip_file) if zip_file else None, memvir_schedule, val_classes,
            memvir_store_dtype, memvir_reduction, focus_classes, class_lr, adam_eps, loss_scale, hub_dataset, visitor)
        return self._status(run, visitor)

    @answering
    def run_status(self, run_id: str = "", history: bool = False, visitor: str = "",
                   request: gr.Request = None) -> dict:
        """A run's state: run_id, state (starting, running, paused, stopped, finished, failed; "none" without a
        run), step, total_steps, epoch, the latest loss, classes s(i) and virtual sets, live_values, pending changes,
        the changes applied (step, setting, old, new), controls_note, status_line (the page's), evaluations (the
        Recall@1 records), snapshot_steps, yours (whether the visitor steers it), baseline; with history, every
        logged step's loss, classes and virtual sets.

        Args:
            run_id: the run; empty: the one the visitor's page shows (their latest, else the latest that trains).
            history: also the logged steps.
            visitor: who is asking; empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        return self._status(self._run(run_id, visitor), visitor, history)

    @answering
    def list_runs(self, visitor: str = "", request: gr.Request = None) -> dict:
        """The runs this server keeps, newest first, as the Train tab lists them: {runs: [{run_id, label, state,
        dataset, loss, memvir_n, memvir_m (as live changes left them), epochs, step, total_steps, started_at (Unix
        seconds), yours, has_model, final (the last evaluation's metrics, or null)}]}. /run_status gives any of them in
        full.

        Args:
            visitor: who is asking (`yours` says which runs they steer); empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        listed = []
        for run in past_runs.newest_first(self.runs):
            with run.lock:
                final = final_metrics(run.records)
                listed.append({
                    "run_id": run.id, "state": run.state, "dataset": run.config.dataset, "loss": run.config.loss,
                    "memvir_n": run.live_values["memvir_n"], "memvir_m": run.live_values["memvir_m"],
                    "epochs": run.config.epochs, "step": past_runs.steps_done(run), "total_steps": run.total_steps,
                    "started_at": run.started_at, "yours": run.owner == visitor,
                    "final": None if final is None else {k: v for k, v in final.items() if k != "type"},
                })
            listed[-1]["label"] = past_runs.run_label(run, visitor)
            listed[-1]["has_model"] = past_runs.has_model(run)
        return {"runs": listed}

    @answering
    def update_run(self, setting: str, value: float, run_id: str = "", visitor: str = "",
               request: gr.Request = None) -> dict:
        """Change a live setting of the visitor's running run before its next step: {run_id, setting, old, new,
        message}. The run's Trainer checks it (its ranges, MemVir's memory) and refuses what does not fit, saying
        why; /run_status's controls_note says when it applied.

        Args:
            setting: memvir_n, memvir_m, warmup_epochs, lr or class_lr.
            value: its new value.
            run_id: the run; empty: the visitor's.
            visitor: who is asking; empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        if setting not in LIVE_SETTINGS or setting == "focus_classes":
            live = ", ".join(name for name in LIVE_SETTINGS if name != "focus_classes")
            raise RunError(f"the live settings are {live}, got {setting!r}")
        if setting in ("memvir_n", "memvir_m") and isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON may carry 3 as 3.0; a fraction goes on, for TrainConfig to refuse
        run = self._run(run_id, visitor)
        if run is None or not run.training:
            raise RunError("no run is training: the new value applies to the next /start_run")
        with run.lock:  # from what the run will use once the changes already asked for apply: 2 -> 4 -> 2 ends at 2
            before = run.pending.get(setting, run.live_values[setting])
        if before == value:
            return {"run_id": run.id, "setting": setting, "old": before, "new": value,
                    "message": "The run already uses this setting."}
        self.runs.update(run.id, visitor, {setting: value})
        asked = live_changes.changes_words({setting: value}, {setting: before})
        message = f"Asked for {asked}: {live_changes.PENDING}."
        return {"run_id": run.id, "setting": setting, "old": before, "new": value, "message": message}

    @answering
    def stop_run(self, run_id: str = "", visitor: str = "", request: gr.Request = None) -> dict:
        """Stop the visitor's run (and its baseline); it saves a checkpoint before its next step and can resume.

        Args:
            run_id: the run; empty: the visitor's.
            visitor: who is asking; empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        run = self._run(run_id, visitor)
        return self._status(self.runs.stop(run.id if run else None, visitor), visitor)

    @answering
    def pause_run(self, run_id: str = "", visitor: str = "", request: gr.Request = None) -> dict:
        """Pause the visitor's run before its next step; /resume_run continues it.

        Args:
            run_id: the run; empty: the visitor's.
            visitor: who is asking; empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        run = self._run(run_id, visitor)
        return self._status(self.runs.pause(run.id if run else None, visitor), visitor)

    @answering
    def resume_run(self, run_id: str = "", visitor: str = "", request: gr.Request = None) -> dict:
        """Continue the visitor's paused run, or a stopped one from its checkpoint (any visitor may resume a run an
        earlier server left).

        Args:
            run_id: the run; empty: the visitor's.
            visitor: who is asking; empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        run = self._run(run_id, visitor)
        return self._status(self.runs.resume(run.id if run else None, visitor), visitor)

    @answering
    def compare_with_baseline(self, run_id: str = "", visitor: str = "", request: gr.Request = None) -> dict:
        """The visitor's run without MemVir (N = 0), trained beside it, or loaded when such a run finished before:
        the baseline's status, with a message saying which and with what optimiser.

        Args:
            run_id: the run; empty: the visitor's.
            visitor: who is asking; empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        run = self._run(run_id, visitor)
        tuned = tuned_baseline(run.config) if run else None  # the baseline's own tuned optimiser, where one was
        baseline = self.runs.compare_with_baseline(run.id if run else None, visitor,
                                                   tuned.settings() if tuned else None)
        if baseline.training:
            started = words.BASELINE_BESIDE if run.training else words.BASELINE_ALONE
            message = f"{started} {words.baseline_optimiser(tuned)}"
        else:
            message = (f"Baseline (N = 0): a finished run of these settings, `{baseline.id}`, loaded rather than "
                       f"trained again. {words.baseline_optimiser(tuned, trained_before=True)}")
        return {**self._status(baseline, visitor), "message": message}

    @answering
    def push_run(self, repo_id: str, run_id: str = "", visitor: str = "",
                    oauth_token: gr.OAuthToken | None = None, request: gr.Request = None) -> str:
        """Push the visitor's finished (or stopped) run to a Hub model repo; its URL. On a Space it pushes with the
        visitor's own sign-in, never the server's token.

        Args:
            repo_id: OWNER/NAME of the repo (created if the token may).
            run_id: the run; empty: the visitor's.
            visitor: who is asking; empty: the client's session.
        """
        visitor = visitor_key(visitor, request)
        return push_run(self.runs, self._run(run_id, visitor), visitor, repo_id, oauth_token)


class RetrievalApi:
    """The client API's retrieval endpoints, bound to the retrieval service (demo.retrieve.service.RetrievalService)."""

    def __init__(self, retrieval: RetrievalService):
        self.retrieval = retrieval

    def _searched(self, checkpoint: str, gallery_files: list | None) -> tuple[LoadedCheckpoint, Gallery]:
        """The checkpoint and the gallery it searches: the uploaded files when there are any, else its test split."""
        loaded = self.retrieval.load_checkpoint(checkpoint)
        if gallery_files:
            return loaded, self.retrieval.uploaded_gallery([_path(file) for file in gallery_files])
        return loaded, self.retrieval.test_split_gallery(loaded)

    def _query(self, query_image, item: int | None, gallery: Gallery) -> Image.Image:
        """The query image: the file sent, or gallery item `item` (exactly one of them)."""
        if (query_image is None) == (item is None):
            raise RetrievalError("send either a query image (query_image) or a gallery item's number (item)")
        if item is not None:
            item = whole_number(item, "the gallery item", 0)
            if item >= gallery.size:
                raise RetrievalError(f"{gallery.description} holds items 0 to {gallery.size - 1:,}, got {item:,}")
            return gallery.image(item)
        settings = self.retrieval.settings
        return load_image(_path(query_image), settings.max_image_bytes, settings.max_image_pixels)

    @staticmethod
    def _hits(gallery: Gallery, items, scores, query_class: str | None, cutoff: float | None) -> list[dict]:
        kept = matches(list(scores), cutoff) if cutoff is not None and len(scores) else [True] * len(scores)
        hits = []
        for rank, (item, score, keep) in enumerate(zip(items, scores, kept, strict=True), 1):
            name = gallery.class_of(int(item))
            same = None if query_class is None or name is None else name == query_class
            hits.append({"rank": rank, "item": int(item), "score": float(score), "class_name": name,
                         "same_class": same, "below_cutoff": not bool(keep)})
        return hits

    def _answer(self, checkpoint: LoadedCheckpoint, gallery: Gallery, image: Image.Image, k: int, drawn: bool,
                exclude: int | None, query_class: str | None, cutoff: float | None) -> dict:
        """One checkpoint's answer: its hits, and with the query's class its AP@R, first correct rank and the
        nearest same-class items it missed."""
        if query_class is None:
            found = self.retrieval.search(checkpoint, gallery, image, k, drawn=drawn, exclude=exclude)
            return {"checkpoint": checkpoint.name, "hits": self._hits(gallery, [hit.index for hit in found.hits],
                                                                      [hit.score for hit in found.hits], None, cutoff)}
        rankings, _ = self.retrieval.query_ranking(checkpoint, gallery, image, k, query_class, drawn=drawn,
                                                   exclude=exclude)
        row = rankings.row(0)
        return {"checkpoint": checkpoint.name,
                "hits": self._hits(gallery, row["neighbours"], row["scores"], query_class, cutoff),
                "average_precision": row["average_precision"], "first_correct_rank": row["first_correct_rank"],
                "same_class_items": row["same_class"],
                "missed": [{"item": item, "score": score, "rank": rank} for item, score, rank in
                           zip(row["missed"], row["missed_scores"], row["missed_ranks"], strict=True)]}

    @answering
    def checkpoints(self) -> dict:
        """The checkpoints to search with: {"checkpoints": [{"name", "checkpoint"}], "default", "comparison"}; pass
        a "checkpoint" value (or a Hub repo id, OWNER/NAME) to the retrieval endpoints."""
        default = self.retrieval.default_checkpoint()
        return {"checkpoints": [{"name": name, "checkpoint": value}
                                for name, value in self.retrieval.checkpoint_choices()],
                "default": default, "comparison": self.retrieval.comparison_checkpoint(default)}

    @answering
    def gallery(self, checkpoint: str, gallery_files: list[FileData] | None = None) -> dict:
        """Load a checkpoint and index its gallery: the checkpoint (backbone, embedding size, dataset), the gallery
        (description, size, class names) and the checkpoint's Recall@1, R-Precision and MAP@R on it when labelled.

        Args:
            checkpoint: a checkpoint of /checkpoints, or a Hub repo id.
            gallery_files: images, or one zip of class folders, to search instead of the checkpoint's test split.
        """
        loaded, gallery = self._searched(checkpoint, gallery_files)
        indexed = self.retrieval.index(loaded, gallery)
        config = loaded.config
        return {"checkpoint": loaded.name, "backbone": config["backbone"], "embedding_dim": config["embedding_dim"],
                "trained_on": config["dataset"], "gallery": gallery.description, "size": gallery.size,
                "class_names": list(gallery.class_names or []), "metrics": dict(indexed.metrics or {})}

    @answering
    def search(self, checkpoint: str, query_image: FileData | None = None, item: int | None = None, k: int = 8,
               query_class: str = "", drawn: bool = False, gallery_files: list[FileData] | None = None,
               cutoff: float | None = None) -> dict:
        """The k gallery images nearest a query: {"checkpoint", "gallery", "size", "query_class", "hits": [{"rank",
        "item", "score" (cosine), "class_name", "same_class", "below_cutoff"}]}; with the query's class known, also
        its AP@R, first correct rank and the same-class items it missed.

        Args:
            checkpoint: a checkpoint of /checkpoints, or a Hub repo id.
            query_image: the query, an image file (or send `item`).
            item: a gallery item as the query (left out of its own answer; its class is the query's).
            k: how many hits.
            query_class: the query's class, as the gallery names it (empty: unknown).
            drawn: the query is a drawing (its ink is fitted to the frame for a glyph model).
            gallery_files: images, or one zip of class folders, to search instead of the checkpoint's test split.
            cutoff: a cosine below which hits are marked below_cutoff (empty: none).
        """
        cutoff = threshold_view.parse_cutoff(cutoff)
        k = whole_number(k, "results (k)", 1)
        loaded, gallery = self._searched(checkpoint, gallery_files)
        image = self._query(query_image, item, gallery)
        named = gallery.class_of(item) if item is not None else self.retrieval.match_class(gallery, query_class)
        answer = self._answer(loaded, gallery, image, k, drawn, item, named, cutoff)
        return {**answer, "gallery": gallery.description, "size": gallery.size, "query_class": named}

    @answering
    def compare(self, checkpoint: str, second_checkpoint: str, query_image: FileData | None = None,
                item: int | None = None, k: int = 8, query_class: str = "", drawn: bool = False,
                gallery_files: list[FileData] | None = None, cutoff: float | None = None) -> dict:
        """One query searched by two checkpoints, side by side: {"query_class", "answers": [the first's, the
        second's]}, each as /search gives it (with the query's class known: AP@R, first correct rank, missed).

        Args:
            checkpoint: the first checkpoint.
            second_checkpoint: the checkpoint to compare with.
            query_image: the query, an image file (or send `item`).
            item: an item of the first checkpoint's gallery as the query (its class is the query's).
            k: how many hits each.
            query_class: the query's class, as the gallery names it (empty: unknown).
            drawn: the query is a drawing.
            gallery_files: images, or one zip of class folders, for both to search instead of their test splits.
            cutoff: a cosine below which hits are marked below_cutoff (empty: none).
        """
        cutoff = threshold_view.parse_cutoff(cutoff)
        k = whole_number(k, "results (k)", 1)
        first, first_gallery = self._searched(checkpoint, gallery_files)
        if not (second_checkpoint or "").strip():
            raise RetrievalError("choose a second checkpoint to compare with (/checkpoints)")
        second, second_gallery = self._searched(second_checkpoint, gallery_files)
        if second.key == first.key:
            raise RetrievalError("the two checkpoints are the same: choose another one to compare with")
        image = self._query(query_image, item, first_gallery)
        text = first_gallery.class_of(item) if item is not None else query_class
        answers = []
        for loaded, gallery in ((first, first_gallery), (second, second_gallery)):
            exclude = item if gallery.key == first_gallery.key else None
            answers.append(self._answer(loaded, gallery, image, k, drawn, exclude,
                                        self.retrieval.match_class(gallery, text), cutoff))
        return {"query_class": text or None, "answers": answers}

    def _ranked(self, checkpoint: str, second_checkpoint: str, gallery_files) -> list:
        """[(checkpoint, gallery, rankings)] for the checkpoint and, when named, the second; both rank one gallery."""
        pairs = [self._searched(checkpoint, gallery_files)]
        if (second_checkpoint or "").strip():
            second, gallery = self._searched(second_checkpoint, gallery_files)
            if second.key == pairs[0][0].key:
                raise RetrievalError("the two checkpoints are the same: choose another one to compare with")
            if gallery.key != pairs[0][1].key:
                raise RetrievalError(f"the two checkpoints search different galleries ({pairs[0][1].description} and "
                                     f"{gallery.description}): compare checkpoints of the same dataset")
            pairs.append((second, gallery))
        return [(loaded, gallery, self.retrieval.rankings(loaded, gallery)) for loaded, gallery in pairs]

    @staticmethod
    def _rows(gallery: Gallery, rankings: QueryRankings, positions) -> list[dict]:
        rows = []
        for position in positions:
            row = rankings.row(int(position))
            rows.append({**row, "class_name": gallery.class_of(row["query"]),
                         "neighbour_classes": [gallery.class_of(item) for item in row["neighbours"]]})
        return rows

    @answering
    def hardest(self, checkpoint: str, order: str = "map@r", count: int = 8, second_checkpoint: str = "",
                        gallery_files: list[FileData] | None = None) -> dict:
        """The gallery's own images as queries, the worst first: {"checkpoint", "gallery", "queries": [{"query"
        (its item), "class_name", "neighbours", "scores", "correct", "neighbour_classes", "first_correct_rank",
        "average_precision", "r_precision", "missed", ...}]}; with a second checkpoint, where the two differ most:
        {"first_better": [...], "second_better": [...]} (rows of the first's rankings).

        Args:
            checkpoint: a checkpoint of /checkpoints, or a Hub repo id.
            order: map@r (lowest AP@R first) or first_correct_rank (latest first).
            count: how many queries (each way, with a second checkpoint).
            second_checkpoint: a checkpoint to compare with (empty: none).
            gallery_files: images, or one zip of class folders, to rank instead of the test split.
        """
        count = whole_number(count, "count", 1, MAX_ROWS)
        ranked = self._ranked(checkpoint, second_checkpoint, gallery_files)
        loaded, gallery, rankings = ranked[0]
        answer = {"checkpoint": loaded.name, "gallery": gallery.description}
        if len(ranked) == 1:
            return {**answer, "order": order, "queries": self._rows(gallery, rankings,
                                                                    hardest_queries(rankings, by=order, count=count))}
        first_better, second_better = largest_differences(rankings, ranked[1][2], count=count)
        return {**answer, "second_checkpoint": ranked[1][0].name,
                "first_better": self._rows(gallery, rankings, first_better),
                "second_better": self._rows(gallery, rankings, second_better)}

    @answering
    def class_metrics(self, checkpoint: str, second_checkpoint: str = "",
                          gallery_files: list[FileData] | None = None, confused_pairs: int = 10) -> dict:
        """Recall@1, R-Precision and MAP@R of every class of the gallery: {"checkpoints", "overall": [one dict per
        checkpoint], "classes": [{"class_name", "queries", "recall@1", "r_precision", "map@r"; with a second
        checkpoint "second" (its three) and "difference" (second minus first)}], "confused_pairs": [per checkpoint,
        [{"first", "second", "count", "rate"}]]}.

        Args:
            checkpoint: a checkpoint of /checkpoints, or a Hub repo id.
            second_checkpoint: a checkpoint to compare with (empty: none).
            gallery_files: one zip of class folders to measure instead of the test split.
            confused_pairs: how many of the most-confused pairs of classes.
        """
        confused_pairs = whole_number(confused_pairs, "confused pairs", 1, MAX_ROWS)
        ranked = self._ranked(checkpoint, second_checkpoint, gallery_files)
        gallery = ranked[0][1]
        if gallery.labels is None:
            raise RetrievalError(f"{gallery.description} has no classes: upload one zip of class folders")
        tables = [per_class_metrics(rankings) for _, _, rankings in ranked]
        difference = per_class_difference(*tables) if len(tables) == 2 else None

        def name(label):
            return gallery.class_names[int(label)] if gallery.class_names else label.item()

        classes = []
        for row, label in enumerate(tables[0].classes):
            entry = {"class_name": name(label), "queries": int(tables[0].queries[row]),
                     **{metric: float(column[row]) for metric, column in tables[0].values.items()}}
            if difference is not None:
                entry["second"] = {metric: float(column[row]) for metric, column in tables[1].values.items()}
                entry["difference"] = {metric: float(column[row]) for metric, column in difference.items()}
            classes.append(entry)
        confusions = [[{"first": name(pair.first), "second": name(pair.second), "count": int(pair.count),
                        "rate": float(pair.rate)}
                       for pair in confused_class_pairs(rankings, gallery.labels, confused_pairs)]
                      for _, _, rankings in ranked]
        return {"checkpoints": [loaded.name for loaded, _, _ in ranked], "gallery": gallery.description,
                "overall": [table.overall() for table in tables], "classes": classes, "confused_pairs": confusions}

    @answering
    def threshold(self, checkpoint: str, fmr: float = threshold_view.DEFAULT_FMR, cutoff: float | None = None,
                  gallery_files: list[FileData] | None = None) -> dict:
        """The gallery's pairs by class sameness: {"same_pairs", "other_pairs", "max_fmr", "at_fmr": the lowest
        threshold whose false match rate is at most fmr, with its FNMR; "at_cutoff": the FMR and FNMR at cutoff}
        (each point: threshold, fmr, fnmr, false_matches, false_non_matches).

        Args:
            checkpoint: a checkpoint of /checkpoints, or a Hub repo id.
            fmr: the false match rate, above 0 and at most max_fmr.
            cutoff: a cosine to measure too (empty: none).
            gallery_files: one zip of class folders to measure instead of the test split.
        """
        cutoff = threshold_view.parse_cutoff(cutoff)
        loaded, gallery = self._searched(checkpoint, gallery_files)
        pairs = self.retrieval.pair_similarities(loaded, gallery)
        return {"checkpoint": loaded.name, "gallery": gallery.description, "same_pairs": int(pairs.same_pairs),
                "other_pairs": int(pairs.other_pairs), "max_fmr": float(pairs.max_fmr),
                "at_fmr": _point(pairs.threshold_at_fmr(fmr)),
                "at_cutoff": _point(None if cutoff is None else pairs.at_threshold(cutoff))}

    @answering
    def checkpoint_zip(self, checkpoint: str) -> FileData:
        """A checkpoint's config.json, model.safetensors and model card in one zip (unzip it, then load the folder
        with memvir.EmbeddingModel.from_pretrained).

        Args:
            checkpoint: a checkpoint of /checkpoints, or a Hub repo id.
        """
        return FileData(path=str(self.retrieval.download_zip(checkpoint)))

    @answering
    def gallery_embeddings(self, checkpoint: str, gallery_files: list[FileData] | None = None) -> dict:
        """The gallery's embeddings by the checkpoint: {"projector": a TensorBoard projector bundle (zip; unzip and
        run tensorboard --logdir on it), "npz": embeddings, labels and class_names for numpy.load, "size"}.

        Args:
            checkpoint: a checkpoint of /checkpoints, or a Hub repo id.
            gallery_files: images, or one zip of class folders, to embed instead of the test split.
        """
        loaded, gallery = self._searched(checkpoint, gallery_files)
        zip_path, npz_path = self.retrieval.export(loaded, gallery)
        return {"projector": FileData(path=str(Path(zip_path))), "npz": FileData(path=str(Path(npz_path))),
                "size": gallery.size}


def register(runs: RunManager, retrieval: RetrievalService) -> None:
    """Each of ENDPOINTS, a method of the client API of `runs` or of `retrieval`, as a public `gr.api` endpoint of the
    Blocks being built, named after the method."""
    parts = (RunApi(runs), RetrievalApi(retrieval))
    for name in ENDPOINTS:
        (method,) = [getattr(part, name) for part in parts if hasattr(part, name)]
        gr.api(method, api_name=name)
