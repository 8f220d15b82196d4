"""`python -m memvir train --config FILE`: a TrainConfig file (a run's train_config.json, or YAML) as the defaults,
the flags typed with it on top; bad files end in one `error:` line and exit status 2. Through `memvir.cli.train_config`
and `memvir.cli.main` in this process: nothing here trains (tests/test_cli.py runs a real run's file back)."""

import dataclasses

import pytest

from memvir.cli import main, train_config
from memvir.config import TrainConfig

STORED = TrainConfig(
    dataset="glyphs-mini", backbone="convnet-gn", embedding_dim=64, loss="proxy-anchor",
    loss_params={"alpha": 16.0, "margin": 0.2}, memvir_n=3, memvir_m=7, warmup_epochs=0.5, memvir_store_dtype="float16",
    memvir_schedule="all-at-once", memvir_reduction="balanced", epochs=3, batch_size=48, sampler="balanced",
    samples_per_class=8, lr=0.002, class_lr=0.05, weight_decay=0.0, adam_eps=1e-8, freeze_bn=True, lr_decay="step",
    lr_decay_epochs=[2, 3], lr_decay_rate=0.5, seed=11, device="cpu", eval_every=2, log_every=3, snapshot_every=0,
    checkpoint_every=17, probe_classes=4, focus_classes=[5, 1], val_classes=4, val_fold=1, augment=False,
    max_steps=40, eval_at_start=False)
"""A run's settings, most of them off their defaults (those without a flag too), so a default taken for a request
would show."""


def command(config_file, *flags, out="unused"):
    return ["train", "--config", str(config_file), *map(str, flags), "--out", str(out)]


@pytest.fixture
def stored_file(tmp_path):
    path = tmp_path / "train_config.json"
    path.write_text(STORED.to_json())  # what Trainer writes into a run folder
    return path


def test_a_runs_train_config_fed_back_is_its_config_exactly(stored_file):
    changed = {f.name for f in dataclasses.fields(TrainConfig) if getattr(STORED, f.name) != getattr(TrainConfig(),
                                                                                                     f.name)}
    assert len(changed) >= 35  # the comparison below would catch an option's default replacing the file's value
    assert train_config(command(stored_file)) == STORED


def test_typed_flags_override_the_file_and_nothing_else(stored_file):
    config = train_config(command(stored_file, "--memvir-n", "0", "--lr", "0.5", "--no-augment", "--batch-size",
                                  "128", "--lr-decay-epochs", "1", "--init", "checkpoints/x", "--data-root", "/d"))
    # --batch-size 128 is the option's default, typed: a request like any other.
    assert config == dataclasses.replace(STORED, memvir_n=0, lr=0.5, augment=False, batch_size=128,
                                         lr_decay_epochs=[1], init_from="checkpoints/x", data_root="/d")


def test_loss_flags_join_the_files_hyper_parameters_and_another_loss_leaves_them(stored_file):
    assert train_config(command(stored_file, "--alpha", "8")).loss_params == {"alpha": 8.0, "margin": 0.2}
    assert train_config(command(stored_file, "--loss", "proxy-anchor")).loss_params == STORED.loss_params
    other = train_config(command(stored_file, "--loss", "arcface", "--scale", "30"))
    assert (other.loss, other.loss_params) == ("arcface", {"scale": 30.0})


def test_a_yaml_file_and_a_partial_file(tmp_path):
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(STORED.to_dict()))
    assert train_config(command(path)) == STORED
    # A file names what it changes; the rest keeps TrainConfig's defaults. YAML 1.1 reads 1e-3 as a string.
    path.write_text("memvir_n: 4\nlr: 1e-3\nlr_decay_epochs: [3]\n")
    assert train_config(command(path)) == TrainConfig(memvir_n=4, lr=0.001, lr_decay_epochs=[3])
    partial = tmp_path / "partial.json"
    partial.write_text('{"dataset": "glyphs-mini", "seed": 5}')
    assert train_config(command(partial, "--seed", "6")) == TrainConfig(dataset="glyphs-mini", seed=6)


def one_error_line(argv, capsys, monkeypatch):
    """main(argv)'s exit status 2 and its one `error:` line (no traceback escapes: it would fail the test)."""
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")  # main sets it otherwise, for the rest of this process
    assert main([str(a) for a in argv]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), errors
    return errors[0]


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("missing.json", None, "missing.json: no such file; pass a run's train_config.json"),
        ("folder", "folder", "is a folder; pass a file, e.g."),
        ("bad.json", '{"memvir_n": 2,}', "is not valid JSON (Expecting property name enclosed in double quotes at "
                                         "line 1 column 16)"),
        ("bad.yaml", "memvir_n: [2\n", "is not valid YAML (expected ',' or ']', but got '<stream end>' at line 2"),
        ("list.json", "[1, 2]", 'holds list, not a mapping of TrainConfig settings such as {"memvir_n": 2}'),
        ("empty.yaml", "", "holds nothing, not a mapping of TrainConfig settings"),
        ("unknown.json", '{"memvir-n": 2, "colour": 1}',
         "unknown setting(s) colour, memvir-n (did you mean memvir_n?); settings are TrainConfig's field names"),
        ("range.json", '{"memvir_n": -1}', "TrainConfig: memvir_n must be an integer >= 0, got -1"),
        ("type.json", '{"focus_classes": [[1]]}', "a setting has a value of the wrong type"),
        ("loss.json", '{"loss": "hinge"}', "TrainConfig: unknown loss 'hinge'"),
    ],
)
def test_a_bad_file_is_one_error_line_that_names_it(tmp_path, capsys, monkeypatch, name, text, message):
    path = tmp_path / name
    if text == "folder":
        path.mkdir()
    elif text is not None:
        path.write_text(text)
    line = one_error_line(command(path, out=tmp_path / "run"), capsys, monkeypatch)
    assert f"--config {path}" in line and message in line, line
    assert not (tmp_path / "run").exists()


def test_a_flag_out_of_range_on_top_of_a_good_file_is_refused_in_config_words(stored_file, capsys, monkeypatch):
    line = one_error_line(command(stored_file, "--memvir-m", "-2", out=stored_file.parent / "run"), capsys,
                          monkeypatch)
    assert "TrainConfig: memvir_m must be an integer >= 0, got -2" in line


def test_config_with_resume_is_refused(stored_file, capsys, monkeypatch):
    line = one_error_line([*command(stored_file, out=stored_file.parent / "run"), "--resume"], capsys, monkeypatch)
    assert "--config starts a new run, but --resume continues" in line


def test_the_help_offers_config(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--config FILE" in capsys.readouterr().out


def test_without_config_the_flags_and_defaults_make_the_config():
    assert train_config(["train", "--out", "x"]) == TrainConfig()
    assert train_config(["train", "--memvir-n", "0", "--scale", "16", "--out", "x"]) == TrainConfig(
        memvir_n=0, loss_params={"scale": 16.0})
