"""`python -m memvir train | eval | index | push`: the library from a terminal.

Bad input (an unknown dataset, N < 0, a missing checkpoint, no Hub token...) ends with one line that says what
was wrong and what to do, and exit status 2; a diverged run exits with 1 and keeps its last good checkpoint.

`train --resume` takes only the flags typed on its command line as requests (defaults are none): those that a
resumed run may change (config.RESUMABLE) are applied and reported, a changed data, model, loss or batch setting is
refused.

`train --config FILE` starts a new run from a TrainConfig in a file, JSON (a run folder's train_config.json, so that
`train --config runs/x/train_config.json --out runs/x-again` runs x again) or YAML: the file's settings replace the
defaults, and only the flags typed with it override them.

`train --init FOLDER` starts the backbone, and the embedding head where its dimension fits, from a checkpoint folder
on the disk (memvir.models.initialisation); a resumed run continues from its own weights, not from FOLDER.

`torchrun --nproc-per-node G -m memvir train ...` trains on G processes (docs/distributed.md); rank 0 alone shows
progress and prints the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from memvir._hub_shims import turn_off_side_requests
from memvir.checkpoint import RunFolder
from memvir.config import RESUMABLE, ResumeConflict, TrainConfig
from memvir.events import EvalEvent, StatusEvent, StepEvent
from memvir.memory.size import format_bytes
from memvir.retrieval.metrics import per_query_metrics
from memvir.train import distributed
from memvir.train.checks import TrainingDiverged

# The parser needs TrainConfig only; a command imports what it runs (the trainer, the evaluation path, the Hub) in its
# own function, after the command line is parsed: those bring torchvision, huggingface_hub and the data loaders,
# seconds that `python -m memvir --help` and a refused command line should not wait for.

_UNTYPED = object()
"""The default of every train option in `build_parser(mark_untyped=True)`: what the user did not type."""

_LOSS_FLAGS = {"scale": "loss scale s (default: the loss's own)",
               "margin": "loss margin (default: the loss's own)",
               "alpha": "Proxy-Anchor alpha (default: the loss's own)"}
"""Train options that together make the setting loss_params."""

_NOT_SETTINGS = {"command", "out", "resume", "overwrite", "config"}

_YAML_SUFFIXES = (".yaml", ".yml")


def _setting_fields():
    """The TrainConfig fields offered on the command line, each with its flag."""
    return [(f, f.metadata["flag"] or "--" + f.name.replace("_", "-"))
            for f in dataclasses.fields(TrainConfig) if f.metadata["cli"]]


def _add_setting_options(train: argparse.ArgumentParser) -> None:
    """One option per TrainConfig setting, from the setting's own default, type and help (memvir.config)."""
    for setting, flag in _setting_fields():
        default = setting.default_factory() if setting.default_factory is not dataclasses.MISSING else setting.default
        help_text = setting.metadata["help"]
        if isinstance(default, bool):  # a flag that flips the default
            train.add_argument(flag, dest=setting.name, action="store_false" if default else "store_true",
                               default=default, help=help_text)
            continue
        kind = setting.type.replace(" | None", "")
        options = {"type": {"int": int, "float": float, "str": str}.get(kind, setting.metadata["item_type"])}
        if kind == "list":
            options["nargs"] = "+"
        if setting.metadata["choices"]:
            options["choices"] = setting.metadata["choices"]
        shown = " (default %(default)s)" if default not in (None, []) else ""
        train.add_argument(flag, dest=setting.name, default=default, help=help_text + shown, **options)
    for name, help_text in _LOSS_FLAGS.items():
        train.add_argument(f"--{name}", type=float, default=None, help=help_text)


def build_parser(mark_untyped: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser. `mark_untyped`: every train option defaults to _UNTYPED, to tell typed options apart."""
    parser = argparse.ArgumentParser(prog="python -m memvir", description="MemVir Studio: deep metric learning with "
                                     "memory-based virtual classes (Ko, Gu, Kim; ICCV 2021).")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model; writes a run folder (Hub files, metrics.jsonl, state)")
    _add_setting_options(train)
    train.add_argument("--config", default=None, metavar="FILE",
                       help="start from the TrainConfig in FILE (JSON, as a run's train_config.json, or .yaml/.yml): "
                       "its settings replace the defaults, flags typed with it override them (a --loss other than "
                       "the file's leaves the file's loss hyper-parameters out)")
    train.add_argument("--out", required=True, help="run folder")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its checkpoint; flags typed with it may change its "
                       "length, N, M, warm-up, learning rates and where it runs, not its data, model, loss or batch")
    train.add_argument("--overwrite", action="store_true",
                       help="write into --out even if it is a non-empty folder that is not a run")
    if mark_untyped:
        train.set_defaults(**dict.fromkeys(vars(train.parse_args(["--out", "."])), _UNTYPED))

    evaluate = commands.add_parser("eval", help="retrieval metrics of a saved model on a dataset's test classes")
    evaluate.add_argument("model", help="run folder, checkpoint folder or Hub repo id")
    evaluate.add_argument("--dataset", default=None, help="default: the dataset the model was trained on")
    evaluate.add_argument("--data-root", default=None)
    evaluate.add_argument("--batch-size", type=int, default=256)
    evaluate.add_argument("--per-query", default=None, metavar="FILE.npz",
                          help="also save each query's metrics (recall@1, r_precision, map@r, its label) as .npz")

    index = commands.add_parser("index", help="embed a dataset split into a saved faiss index; without --out, build "
                                "each checkpoint folder's own gallery/ (its test split's index and the app's views' "
                                "figures) where it is missing or stale")
    index.add_argument("model", nargs="+", help="run folder, checkpoint folder or Hub repo id (without --out: one or "
                       "more checkpoint folders)")
    index.add_argument("--dataset", default=None, help="default: the dataset the model was trained on")
    index.add_argument("--data-root", default=None)
    index.add_argument("--split", default="test", choices=("train", "test"))
    index.add_argument("--out", default=None, help="folder for the index (default: gallery/ in each checkpoint "
                       "folder, kept fresh as the app reads it)")
    index.add_argument("--force", action="store_true", help="without --out: rebuild even a fresh gallery/")
    index.add_argument("--batch-size", type=int, default=256)

    search = commands.add_parser("search", help="the gallery images nearest a query image, printed as JSON")
    search.add_argument("model", help="run folder, checkpoint folder or Hub repo id")
    search.add_argument("image", help="the query image file")
    search.add_argument("--gallery", default=None, metavar="DATASET_OR_FOLDER",
                        help="a dataset name (its test split) or a folder of images or of class folders (default: the "
                        "test split of the dataset the model was trained on)")
    search.add_argument("--data-root", default=None)
    search.add_argument("-k", type=int, default=8, help="how many hits (default 8)")
    search.add_argument("--drawn", action="store_true", help="the query is a drawing: its ink is fitted to the frame "
                        "(glyph models)")

    push = commands.add_parser("push", help="upload a run folder to the Hugging Face Hub with its model card")
    push.add_argument("run", help="run folder")
    push.add_argument("--repo-id", required=True, help="e.g. your-name/memvir-glyphs")
    push.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or your saved login)")
    push.add_argument("--private", action="store_true")
    return parser


def _train(args) -> int:
    try:
        return _train_run(args)
    finally:
        distributed.shutdown()  # under torchrun the Trainer joined a process group; leave it on every way out


def _train_run(args) -> int:
    from tqdm.auto import tqdm

    from memvir.train.trainer import Trainer  # parse first, import later (see the imports above)

    if args.resume:
        if args.config is not None:
            raise ValueError(f"--config starts a new run, but --resume continues {args.out} with its own settings; "
                             "leave out --config to resume, or --resume to start a new run from the file")
        trainer = _resume(args)
    else:
        config = train_config(args.argv)
        _check_new_run_folder(Path(args.out), args.overwrite)
        trainer = Trainer(config, args.out)
        trainer.command = command_line(args.argv, launcher=trainer.world.launch_command())

    speaks = trainer.world.is_main  # under torchrun one rank reports; the others train silently
    if trainer.initialisation is not None and speaks:
        print(f"initialised the {trainer.initialisation.describe()}", file=sys.stderr)
    if trainer.data.info.split_rule and speaks:  # which classes train: chosen from the data for a Hub dataset
        print(f"{trainer.config.dataset}: {trainer.data.info.split_rule}", file=sys.stderr)
    bar = tqdm(total=trainer.total_steps, initial=trainer.step, unit="step", dynamic_ncols=True, disable=not speaks,
               desc=f"{trainer.config.loss} N={trainer.config.memvir_n} M={trainer.config.memvir_m}")
    recall = {"value": trainer.last_metrics.get("recall@1")}

    def show(event):
        if isinstance(event, StepEvent):
            bar.update(event.step - bar.n)
            postfix = {"classes": event.num_classes, "img/s": f"{event.images_per_s:.0f}"}
            if event.loss is not None:
                postfix = {"loss": f"{event.loss:.3f}", **postfix}
            if recall["value"] is not None:
                postfix["R@1"] = f"{recall['value']:.3f}"
            bar.set_postfix(postfix, refresh=False)
        elif isinstance(event, EvalEvent):
            recall["value"] = event.metrics.get("recall@1")
            bar.write(f"step {event.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in event.metrics.items()))
        elif isinstance(event, StatusEvent) and event.state in ("stopped", "finished", "failed"):
            bar.write(event.message)

    trainer.add_listener(show)
    try:
        trainer.run()
    except TrainingDiverged as error:
        bar.close()
        if speaks:
            print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        trainer.save_checkpoint()
        bar.close()
        if speaks:
            print(f"interrupted at step {trainer.step}; checkpoint saved. Continue with --resume.", file=sys.stderr)
        return 130
    except BaseException:
        bar.close()  # so that the error line which follows starts a line of its own
        raise
    bar.close()
    if speaks:
        print(json.dumps({"step": trainer.step, **trainer.last_metrics}))
    return 0


def train_config(argv: list[str]) -> TrainConfig:
    """The TrainConfig a new run of `python -m memvir *argv` trains with: the defaults, or the --config file's
    settings, with the flags typed in `argv` on top.

    Args:
        argv: the command line after `python -m memvir`, starting with `train`.

    Returns:
        The validated TrainConfig.

    Raises:
        ValueError: a setting out of range (TrainConfig's words), or a --config file that is missing, is not JSON or
            YAML, holds no mapping, or names an unknown setting (the message names the file).
    """
    args = build_parser().parse_args(argv)
    if args.command != "train":
        raise ValueError(f"a TrainConfig comes from a train command line, not {args.command!r}")
    if args.config is None:
        loss_params = {k: getattr(args, k) for k in _LOSS_FLAGS if getattr(args, k) is not None}
        return TrainConfig(loss_params=loss_params, **{s.name: getattr(args, s.name) for s, _ in _setting_fields()})
    stored = _read_config_file(Path(args.config))
    # Only what was typed is a request: an option's default would otherwise replace the file's value.
    typed = _typed_options(argv) - _NOT_SETTINGS
    settings = {dest: getattr(args, dest) for dest in sorted(typed - set(_LOSS_FLAGS))}
    # Hyper-parameters belong to their loss (Proxy-Anchor's alpha is no Norm-softmax setting): another loss starts
    # from its own defaults, the same loss keeps the file's and takes the typed ones on top.
    same_loss = settings.get("loss", stored.loss) == stored.loss
    loss_params = {**(stored.loss_params if same_loss else {}),
                   **{name: getattr(args, name) for name in sorted(typed & set(_LOSS_FLAGS))}}
    return dataclasses.replace(stored, **settings, loss_params=loss_params)


def _read_config_file(path: Path) -> TrainConfig:
    """The TrainConfig in a JSON or YAML file (settings it leaves out keep their defaults); ValueError naming the file
    for anything that keeps it from being one."""
    what = "pass a run's train_config.json, or a JSON or YAML file of TrainConfig settings"
    if path.is_dir():
        raise ValueError(f"--config {path} is a folder; pass a file, e.g. {path / 'train_config.json'}")
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file; {what}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in _YAML_SUFFIXES:
        values = _parse_yaml(text, path)
    else:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--config {path} is not valid JSON ({error.msg} at line {error.lineno} column "
                             f"{error.colno}); a YAML file must be named .yaml or .yml") from None
    if not isinstance(values, dict):
        raise ValueError(f"--config {path} holds {type(values).__name__ if values is not None else 'nothing'}, not "
                         'a mapping of TrainConfig settings such as {"memvir_n": 2}')
    known = [setting.name for setting in dataclasses.fields(TrainConfig)]
    unknown = sorted(set(values) - set(known), key=str)
    if unknown:
        guesses = {name: difflib.get_close_matches(str(name).replace("-", "_"), known, n=1) for name in unknown}
        named = ", ".join(f"{name} (did you mean {guess[0]}?)" if guess else str(name)
                          for name, guess in guesses.items())
        raise ValueError(f"--config {path}: unknown setting(s) {named}; settings are TrainConfig's field names, as "
                         "a run's train_config.json holds them")
    try:
        return TrainConfig(**values)
    except ValueError as error:
        raise ValueError(f"--config {path}: {error}") from None
    except TypeError as error:  # a value of a type no check expected (a mapping where a number goes): still the file's
        raise ValueError(f"--config {path}: a setting has a value of the wrong type ({error})") from None


def _parse_yaml(text: str, path: Path):
    try:
        import yaml
    except ImportError:
        raise ValueError(f"reading --config {path} as YAML needs the PyYAML package (pip install pyyaml); or pass "
                         "the settings as JSON") from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
        where = f"{problem} at line {mark.line + 1} column {mark.column + 1}" if mark and problem else str(error)
        raise ValueError(f"--config {path} is not valid YAML ({where})") from None
    if isinstance(values, dict):
        # YAML 1.1, which PyYAML reads, takes 1e-3 (no dot) for a string: read it as the number it is meant to be.
        floats = {setting.name for setting in dataclasses.fields(TrainConfig) if setting.type == "float"}
        for name in floats & set(values):
            if isinstance(values[name], str):
                try:
                    values[name] = float(values[name])
                except ValueError:
                    pass  # left as written, for TrainConfig to refuse in its words
    return values


def _resume(args):
    """Trainer.from_run_folder with the settings typed on the command line; says which changed, or which may not."""
    from memvir.train.trainer import Trainer  # parse first, import later (see the imports above)

    typed = _typed_options(args.argv) - _NOT_SETTINGS
    settings = {dest: getattr(args, dest) for dest in sorted(typed - set(_LOSS_FLAGS))}
    loss_params = {dest: getattr(args, dest) for dest in sorted(typed & set(_LOSS_FLAGS))}
    if loss_params:
        settings["loss_params"] = loss_params
    try:
        trainer = Trainer.from_run_folder(args.out, **settings)
    except ResumeConflict as conflict:
        flags = ", ".join(_flags_of(name) for name in conflict.changes)
        values = ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in conflict.changes.items())
        options = set(vars(args))
        may = ", ".join(_flags_of(name) for name in sorted(RESUMABLE) if name in options)
        raise ValueError(
            f"{flags} cannot change when resuming {args.out} ({values}): its checkpoint holds a model, optimizer and "
            f"memory made for the run's settings. Leave these flags out, or start a new run with a new --out to "
            f"train with them. A resume may change {may}."
        ) from None
    if trainer.world.is_main:
        applied = ", ".join(f"{_flags_of(name)} {old} -> {new}" for name, (old, new) in trainer.resume_changes.items())
        print(f"resuming {args.out} at step {trainer.step}" + (f"; applied {applied}" if applied else ""),
              file=sys.stderr)
    return trainer


def _typed_options(argv: list[str]) -> set[str]:
    """The train options (dests) typed in `argv`, whatever their values: a default is not a request."""
    typed = build_parser(mark_untyped=True).parse_args(argv)
    return {dest for dest, value in vars(typed).items() if value is not _UNTYPED}


def _flags_of(setting: str) -> str:
    """The train flag(s) that set a TrainConfig setting, e.g. --batch-size for batch_size."""
    if setting == "loss_params":
        return "/".join("--" + name for name in _LOSS_FLAGS)
    return dict((s.name, flag) for s, flag in _setting_fields()).get(setting, "--" + setting.replace("_", "-"))


def _check_new_run_folder(out: Path, overwrite: bool) -> None:
    """A new run writes config.json, README.md and more into `out`: refuse a folder holding another run, a file,
    or a non-empty folder that is not a run (unless --overwrite), so that nothing of the user's is replaced."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; choose another --out")
    run = RunFolder(out)
    if run.state_file.exists():
        raise ValueError(f"{out} already holds a run; add --resume to continue it or choose another --out")
    if overwrite or not out.is_dir() or run.is_run():
        return
    names = sorted(entry.name for entry in out.iterdir())
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ValueError(
            f"{out} is not empty ({shown}) and is not a run folder: a run writes config.json, model.safetensors, "
            "README.md, metrics.jsonl and its state there, replacing files of those names. Choose a new or empty "
            "--out, or add --overwrite to write into this folder anyway"
        )


def _eval(args) -> int:
    from memvir.retrieval import evaluation  # parse first, import later (see the imports above)

    model, dataset, split = evaluation.load_model_and_split(args.model, args.dataset, args.data_root, "test")
    embeddings, labels = evaluation.embed(model, split, batch_size=args.batch_size, progress=True)
    metrics = evaluation.score(embeddings, labels, dataset)
    if args.per_query:
        np.savez(args.per_query, **per_query_metrics(embeddings, labels))
    print(json.dumps({"dataset": dataset, "items": len(split), **metrics}))
    return 0


def _index(args) -> int:
    from memvir.retrieval import evaluation  # parse first, import later (see the imports above)

    if args.out is None:
        return _index_beside(args.model, args.force)
    if len(args.model) > 1:
        raise ValueError("--out takes one model: index the others into folders of their own")
    args.model = args.model[0]
    model, dataset, split = evaluation.load_model_and_split(args.model, args.dataset, args.data_root, args.split)
    items = [f"{dataset}/{args.split}/{i}" for i in range(len(split))]
    index = evaluation.build_index(model, split, items=items, batch_size=args.batch_size, progress=True)
    index.save(args.out)
    print(json.dumps({"index": str(args.out), "items": len(index), "dataset": dataset, "split": args.split}))
    return 0


def _index_beside(folders: list[str], force: bool) -> int:
    """Each checkpoint folder's gallery/ (memvir.retrieval.shipped_gallery), built where missing or stale, then the
    figures of the app's views of it."""
    from memvir.retrieval import evaluation, shipped_gallery  # parse first, import later (see the imports above)

    for folder in map(Path, folders):
        model, dataset, split = evaluation.load_model_and_split(str(folder))
        reason = shipped_gallery.staleness(folder, split)
        saved = folder / shipped_gallery.GALLERY_DIR
        if reason is None and not force:
            print(f"{folder}: {saved.name}/ is up to date")
        else:
            gallery = shipped_gallery.build(folder, split, dataset, model=model, progress=True)
            if shipped_gallery.staleness(folder, split) is not None:
                print(f"{folder}: its files changed while it was embedded; nothing saved, run again", file=sys.stderr)
                return 1
            size = sum(path.stat().st_size for path in saved.iterdir())
            print(f"{folder}: built {saved.name}/ ({reason or 'forced'}): {len(gallery.index):,} items, "
                  f"{format_bytes(size)}, recall@1 {gallery.metrics.get('recall@1', float('nan')):.4f}")
        reason = shipped_gallery.views_staleness(folder, split)
        if reason is None and not force:
            print(f"{folder}: the views' figures are up to date")
            continue
        try:
            shipped_gallery.build_views(folder, split)
        except ValueError as error:  # no class with two items: nothing to rank
            print(f"{folder}: the views' figures cannot be computed: {error}", file=sys.stderr)
            continue
        sizes = ", ".join(f"{name} {format_bytes((saved / name).stat().st_size)}"
                          for name in (shipped_gallery.RANKINGS_FILE, shipped_gallery.PAIRS_FILE))
        print(f"{folder}: computed the views' figures ({reason or 'forced'}): {sizes}")
    return 0


def _search(args) -> int:
    # parse first, import later (see the imports above)
    from memvir.hub import load_model
    from memvir.retrieval import evaluation, index_folder, open_image, search_image, shipped_gallery

    if args.k < 1:
        raise ValueError(f"-k must be at least 1, got {args.k}")
    query = open_image(args.image)
    if args.gallery is not None and Path(args.gallery).expanduser().is_dir():
        model = load_model(args.model)
        index, names, gallery = index_folder(model, args.gallery), None, str(args.gallery)
    else:
        model, dataset, split = evaluation.load_model_and_split(args.model, args.gallery, args.data_root, "test")
        # A checkpoint folder's own test split is indexed beside it already when fresh (python -m memvir index).
        own = args.gallery is None and Path(args.model).is_dir()
        shipped = shipped_gallery.load(args.model, split) if own else None
        index = shipped.index if shipped else evaluation.build_index(model, split, progress=True)
        names, gallery = split.class_names, f"{dataset} test split"
    found = search_image(model, index, query, args.k, drawn=args.drawn)
    hits = [{"rank": rank, "score": round(hit.score, 6), "item": hit.item if hit.item is not None else hit.index,
             "label": names[hit.label] if names is not None and hit.label is not None else hit.label}
            for rank, hit in enumerate(found.hits, 1)]
    print(json.dumps({"query": str(args.image), "gallery": gallery, "items": len(index), "hits": hits}))
    return 0


def _push(args) -> int:
    from memvir.hub import push  # parse first, import later (see the imports above)

    url = push(args.run, args.repo_id, token=args.token, private=args.private)
    print(url)
    return 0


def main(argv: list[str] | None = None) -> int:
    turn_off_side_requests()  # before the commands import huggingface_hub: no look-up the user did not ask for
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    handlers = {"train": _train, "eval": _eval, "index": _index, "search": _search, "push": _push}
    try:
        return handlers[args.command](args)
    except (ValueError, OSError) as error:
        print("error: " + " ".join(str(error).split()), file=sys.stderr)  # one line, however the message was built
        return 2


def command_line(argv: list[str], launcher: str = "python") -> str:
    """The shell command that reproduces a CLI call (for model cards); `launcher` is e.g. `torchrun
    --nproc-per-node 2` for a multi-process run."""
    return f"{launcher} -m memvir " + " ".join(shlex.quote(a) for a in argv)
