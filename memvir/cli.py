"""`python -m memvir train | eval | index | push`: the library from a terminal.

Bad input (an unknown dataset, N < 0, a missing checkpoint, no Hub token...) ends with one line that says what
was wrong and what to do, and exit status 2; a diverged run exits with 1 and keeps its last good checkpoint.

`train --resume` takes only the flags typed on its command line as requests (defaults are none): those that a
resumed run may change (train.RESUMABLE) are applied and reported, a changed data, model, loss or batch setting is
refused.

`torchrun --nproc-per-node G -m memvir train ...` trains on G processes (docs/distributed.md); rank 0 alone shows
progress and prints the result.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

_UNTYPED = object()
"""The default of every train option in `build_parser(mark_untyped=True)`: what the user did not type."""

_SETTING_OF_FLAG = {"store_dtype": "memvir_store_dtype"}
"""Train options (dests) whose TrainConfig setting has another name."""

_LOSS_FLAGS = ("scale", "margin", "alpha")
"""Train options that together make the setting loss_params."""

_NOT_SETTINGS = {"command", "out", "resume", "overwrite"}


def _train_defaults():
    from memvir.train import TrainConfig

    return TrainConfig()


def build_parser(mark_untyped: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser. `mark_untyped`: every train option defaults to _UNTYPED, to tell typed options apart."""
    defaults = _train_defaults()
    parser = argparse.ArgumentParser(prog="python -m memvir", description="MemVir Studio: deep metric learning with "
                                     "memory-based virtual classes (Ko, Gu, Kim; ICCV 2021).")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model; writes a run folder (Hub files, metrics.jsonl, state)")
    train.add_argument("--dataset", default=defaults.dataset,
                       help="glyphs | glyphs-mini | cub200 | cars196 | sop | folder:PATH (default %(default)s)")
    train.add_argument("--data-root", default=None, help="folder of cub200 / cars196 / sop")
    train.add_argument("--image-size", type=int, default=None, help="input size (default: the dataset's own)")
    train.add_argument("--backbone", default=defaults.backbone,
                       help="convnet | convnet-gn | resnet18 | resnet50 | googlenet")
    train.add_argument("--pretrained", action="store_true", help="start from ImageNet weights (cached or online)")
    train.add_argument("--embedding-dim", type=int, default=defaults.embedding_dim)
    train.add_argument("--loss", default=defaults.loss, help="one of memvir.LOSSES (default %(default)s)")
    train.add_argument("--scale", type=float, default=None, help="loss scale s (default: the loss's own)")
    train.add_argument("--margin", type=float, default=None, help="loss margin (default: the loss's own)")
    train.add_argument("--alpha", type=float, default=None, help="Proxy-Anchor alpha")
    train.add_argument("--memvir-n", type=int, default=defaults.memvir_n, help="N past steps used; 0 = baseline")
    train.add_argument("--memvir-m", type=int, default=defaults.memvir_m, help="M, the gap between used steps")
    train.add_argument("--warmup-epochs", type=float, default=defaults.warmup_epochs, help="U, in epochs")
    train.add_argument("--store-dtype", default=defaults.memvir_store_dtype, help="float32 | float16 | bfloat16")
    train.add_argument("--memvir-schedule", default=defaults.memvir_schedule,
                       help="curriculum (the paper's staircase) | all-at-once (all N sets when the warm-up ends)")
    train.add_argument("--memvir-reduction", default=defaults.memvir_reduction, choices=("official", "balanced"),
                       help="official: the loss is the mean over all (k+1)B rows, as the reference code (the live "
                       "batch weighs 1/(k+1)); balanced: each set averaged on its own and the means summed "
                       "(default %(default)s)")
    train.add_argument("--loss-scale-after-warmup", type=float, default=defaults.loss_scale_after_warmup,
                       help="ablation: multiply the loss by this once the warm-up is over (0.5 in a baseline imitates "
                       "MemVir(1, M)'s official dilution without virtual classes; default %(default)g)")
    train.add_argument("--no-augment", dest="augment", action="store_false",
                       help="train on the clean images, without random augmentation")
    train.add_argument("--val-classes", type=int, default=defaults.val_classes,
                       help="training classes held out as validation, scored as val_* metrics (default none)")
    train.add_argument("--epochs", type=int, default=None, help=f"default {defaults.epochs}")
    train.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    train.add_argument("--batch-size", type=int, default=defaults.batch_size)
    train.add_argument("--sampler", default=defaults.sampler, help="random | balanced")
    train.add_argument("--samples-per-class", type=int, default=defaults.samples_per_class)
    train.add_argument("--lr", type=float, default=defaults.lr, help="network learning rate")
    train.add_argument("--class-lr", type=float, default=defaults.class_lr, help="class-weight learning rate")
    train.add_argument("--lr-decay", default=defaults.lr_decay, help="none | cosine | step (default %(default)s)")
    train.add_argument("--lr-decay-epochs", type=int, nargs="+", default=defaults.lr_decay_epochs,
                       help="with --lr-decay step: the (1-based) epochs at whose start the learning rates drop")
    train.add_argument("--lr-decay-rate", type=float, default=defaults.lr_decay_rate,
                       help="with --lr-decay step: the factor of each drop (default %(default)g)")
    train.add_argument("--adam-eps", type=float, default=defaults.adam_eps,
                       help="Adam's epsilon (default %(default)g, the reference's; with it many parameters take steps "
                       "that scale with their gradient)")
    train.add_argument("--freeze-bn", action="store_true",
                       help="keep BatchNorm layers in eval mode (fixed running statistics) while training, as the "
                       "reference's --freeze_BN (for pretrained backbones; off for the from-scratch CPU ones)")
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--device", default=None, help="auto | cpu | cuda (default auto)")
    train.add_argument("--num-workers", type=int, default=None, help="data loader processes (default 0)")
    train.add_argument("--compile", action="store_true", default=None, help="torch.compile the network (GPU runs)")
    train.add_argument("--eval-every", type=int, default=None, help="epochs between evaluations")
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

    index = commands.add_parser("index", help="embed a dataset split into a saved faiss index")
    index.add_argument("model", help="run folder, checkpoint folder or Hub repo id")
    index.add_argument("--dataset", default=None, help="default: the dataset the model was trained on")
    index.add_argument("--data-root", default=None)
    index.add_argument("--split", default="test", choices=("train", "test"))
    index.add_argument("--out", required=True, help="folder for the index")
    index.add_argument("--batch-size", type=int, default=256)

    push = commands.add_parser("push", help="upload a run folder to the Hugging Face Hub with its model card")
    push.add_argument("run", help="run folder")
    push.add_argument("--repo-id", required=True, help="e.g. your-name/memvir-glyphs")
    push.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or your saved login)")
    push.add_argument("--private", action="store_true")
    return parser


def _train(args) -> int:
    from memvir import distributed

    try:
        return _train_run(args)
    finally:
        distributed.shutdown()  # under torchrun the Trainer joined a process group; leave it on every way out


def _train_run(args) -> int:
    from tqdm.auto import tqdm

    from memvir.events import EvalEvent, StatusEvent, StepEvent
    from memvir.train import TrainConfig, Trainer, TrainingDiverged

    if args.resume:
        trainer = _resume(args)
    else:
        loss_params = {k: v for k, v in (("scale", args.scale), ("margin", args.margin), ("alpha", args.alpha))
                       if v is not None}
        defaults = TrainConfig()
        config = TrainConfig(
            dataset=args.dataset, data_root=args.data_root, image_size=args.image_size, backbone=args.backbone,
            pretrained=args.pretrained, embedding_dim=args.embedding_dim, loss=args.loss, loss_params=loss_params,
            memvir_n=args.memvir_n, memvir_m=args.memvir_m, warmup_epochs=args.warmup_epochs,
            memvir_store_dtype=args.store_dtype, memvir_schedule=args.memvir_schedule, val_classes=args.val_classes,
            memvir_reduction=args.memvir_reduction, loss_scale_after_warmup=args.loss_scale_after_warmup,
            adam_eps=args.adam_eps, freeze_bn=args.freeze_bn, augment=args.augment,
            epochs=defaults.epochs if args.epochs is None else args.epochs,
            batch_size=args.batch_size, sampler=args.sampler, samples_per_class=args.samples_per_class, lr=args.lr,
            class_lr=args.class_lr, lr_decay=args.lr_decay, lr_decay_epochs=list(args.lr_decay_epochs),
            lr_decay_rate=args.lr_decay_rate, seed=args.seed, device=args.device or "auto",
            num_workers=args.num_workers or 0, eval_every=defaults.eval_every if args.eval_every is None
            else args.eval_every, max_steps=args.max_steps, compile=bool(args.compile),
        )
        _check_new_run_folder(Path(args.out), args.overwrite)
        trainer = Trainer(config, args.out)
        trainer.command = command_line(args.argv, launcher=trainer.world.launch_command())

    speaks = trainer.world.is_main  # under torchrun one rank reports; the others train silently
    bar = tqdm(total=trainer.total_steps, initial=trainer.step, unit="step", dynamic_ncols=True, disable=not speaks,
               desc=f"{trainer.config.loss} N={trainer.config.memvir_n} M={trainer.config.memvir_m}")
    recall = {"value": trainer.last_metrics.get("recall@1")}

    def show(event):
        if isinstance(event, StepEvent):
            bar.update(event.step - bar.n)
            postfix = {"loss": f"{event.loss:.3f}", "classes": event.num_classes, "img/s": f"{event.images_per_s:.0f}"}
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


def _resume(args):
    """Trainer.resume with the settings typed on the command line; says which changed, or which may not."""
    from memvir.train import RESUMABLE, ResumeConflict, Trainer

    typed = _typed_options(args.argv) - _NOT_SETTINGS
    settings = {_SETTING_OF_FLAG.get(dest, dest): getattr(args, dest) for dest in sorted(typed - set(_LOSS_FLAGS))}
    loss_params = {dest: getattr(args, dest) for dest in sorted(typed & set(_LOSS_FLAGS))}
    if loss_params:
        settings["loss_params"] = loss_params
    try:
        trainer = Trainer.resume(args.out, **settings)
    except ResumeConflict as conflict:
        flags = ", ".join(_flags_of(name) for name in conflict.changes)
        values = ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in conflict.changes.items())
        options = set(vars(args))
        may = ", ".join(_flags_of(name) for name in sorted(RESUMABLE) if _dest_of(name) in options)
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


def _dest_of(setting: str) -> str:
    return {value: key for key, value in _SETTING_OF_FLAG.items()}.get(setting, setting)


def _flags_of(setting: str) -> str:
    """The train flag(s) that set a TrainConfig setting, e.g. --batch-size for batch_size."""
    dests = _LOSS_FLAGS if setting == "loss_params" else (_dest_of(setting),)
    return "/".join("--" + dest.replace("_", "-") for dest in dests)


def _check_new_run_folder(out: Path, overwrite: bool) -> None:
    """A new run writes config.json, README.md and more into `out`: refuse a folder holding another run, a file,
    or a non-empty folder that is not a run (unless --overwrite), so that nothing of the user's is replaced."""
    from memvir.checkpoint import RUN_MARKERS, TRAINER_STATE

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; choose another --out")
    if (out / TRAINER_STATE).exists():
        raise ValueError(f"{out} already holds a run; add --resume to continue it or choose another --out")
    if overwrite or not out.is_dir() or any((out / marker).exists() for marker in RUN_MARKERS):
        return
    names = sorted(entry.name for entry in out.iterdir())
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ValueError(
            f"{out} is not empty ({shown}) and is not a run folder: a run writes config.json, model.safetensors, "
            "README.md, metrics.jsonl and its state there, replacing files of those names. Choose a new or empty "
            "--out, or add --overwrite to write into this folder anyway"
        )


def _load_model_and_split(args, split: str):
    from memvir.data import load_dataset
    from memvir.hub import load_model

    model = load_model(args.model)
    config = model.config if isinstance(model.config, dict) else dict(model.config)
    dataset = args.dataset or config.get("dataset")
    if not dataset:
        raise ValueError(f"{args.model} does not say which dataset it was trained on; pass --dataset")
    data = load_dataset(dataset, data_root=args.data_root, image_size=config.get("image_size"))
    return model, dataset, getattr(data, split)


def _embed_split(model, split, batch_size: int):
    import torch
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    model.eval()
    chunks, labels = [], []
    with torch.no_grad():
        for images, batch_labels in tqdm(DataLoader(split, batch_size=batch_size), desc="embedding", unit="batch"):
            chunks.append(model(images))
            labels.append(batch_labels)
    return torch.cat(chunks), torch.cat(labels)


def _eval(args) -> int:
    from memvir.metrics import retrieval_metrics

    model, dataset, split = _load_model_and_split(args, "test")
    embeddings, labels = _embed_split(model, split, args.batch_size)
    ks = (1, 10, 100, 1000) if dataset == "sop" else (1, 2, 4, 8)
    metrics = retrieval_metrics(embeddings, labels, ks=tuple(k for k in ks if k < len(labels)))
    print(json.dumps({"dataset": dataset, "items": len(labels), **metrics}))
    return 0


def _index(args) -> int:
    from memvir.index import GalleryIndex

    model, dataset, split = _load_model_and_split(args, args.split)
    embeddings, labels = _embed_split(model, split, args.batch_size)
    items = [f"{dataset}/{args.split}/{i}" for i in range(len(labels))]
    index = GalleryIndex.build(embeddings, labels=labels, items=items)
    index.save(args.out)
    print(json.dumps({"index": str(args.out), "items": len(index), "dataset": dataset, "split": args.split}))
    return 0


def _push(args) -> int:
    from memvir.hub import push

    url = push(args.run, args.repo_id, token=args.token, private=args.private)
    print(url)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    handlers = {"train": _train, "eval": _eval, "index": _index, "push": _push}
    try:
        return handlers[args.command](args)
    except (ValueError, OSError) as error:
        print("error: " + " ".join(str(error).split()), file=sys.stderr)  # one line, however the message was built
        return 2


def command_line(argv: list[str], launcher: str = "python") -> str:
    """The shell command that reproduces a CLI call (for model cards); `launcher` is e.g. `torchrun
    --nproc-per-node 2` for a multi-process run."""
    return f"{launcher} -m memvir " + " ".join(shlex.quote(a) for a in argv)
