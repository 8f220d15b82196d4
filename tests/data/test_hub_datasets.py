"""`hf:OWNER/NAME[@REVISION]`: image-classification datasets written to the loopback Hub (tests/hub_server.py) with
🤗 datasets' own `DatasetDict.push_to_hub`, read back through `memvir.data.load_dataset` in a process pointed at that
Hub (🤗 datasets reads the endpoint when it is imported). Both shapes of repo: splits that share classes (pooled,
then the classes halved in label order) and class-disjoint splits (kept), and the refusals before any training."""

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hub_server import READ_TOKEN, TOKENS, USER, WRITE_TOKEN, LoopbackHub, client_environment, point_client_at
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# Label order differs from the names' sorted order, so that "the first half in label order" is told apart.
CLASS_NAMES = ["wren", "auk", "tern", "finch", "owl", "crane", "heron", "ibis"]
POOLED, DISJOINT, SPECKS, SINGLES = (f"{USER}/{name}" for name in ("birds-pooled", "birds-disjoint", "specks",
                                                                     "birds-singles"))


def picture(class_id: int, index: int, side: int = 24) -> np.ndarray:
    """The RGB pixels of image `index` of class `class_id`: a colour of the class, a stripe that moves with index."""
    pixels = np.empty((side, side + 4, 3), dtype=np.uint8)
    pixels[:] = ((37 * class_id) % 256, (91 * class_id + 50) % 256, (151 * class_id + 100) % 256)
    pixels[:, index % (side + 4)] = 255 - pixels[0, 0]
    return pixels


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


# The repos, as (split -> [(class id, index)]) per repo; each is pushed with 🤗 datasets in `hub_datasets`.
SHAPES = {
    # every class in both splits, as the CUB and CARS mirrors split images: pooled, classes 0-3 train, 4-7 test
    POOLED: {"train": [(c, i) for c in range(8) for i in range(2)],
             "test": [(c, i) for c in range(8) for i in range(2, 4)]},
    # classes 0-4 in train, 5-7 in test (SOP's shape): kept as they are, 5 train and 3 test (halving gives 4 and 4)
    DISJOINT: {"train": [(c, i) for c in range(5) for i in range(3)],
               "test": [(c, i) for c in range(5, 8) for i in range(3)]},
    SPECKS: {"train": [(c, i) for c in range(8) for i in range(2)]},
    # the test half (classes 4-7) holds one image per class: nothing to retrieve
    SINGLES: {"train": [(c, i) for c in range(8) for i in range(2 if c < 4 else 1)]},
}

PUSH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value
    from test_hub_datasets import CLASS_NAMES, DISJOINT, POOLED, SHAPES, SPECKS, picture, png

    def labelled(items, side=24):  # an Image and a ClassLabel column
        features = Features({"image": Image(), "label": ClassLabel(names=CLASS_NAMES)})
        rows = {"image": [{"bytes": png(picture(c, i, side)), "path": None} for c, i in items],
                "label": [c for c, _ in items]}
        return Dataset.from_dict(rows, features=features)

    def named(items):  # an image column of another name, a string label column beside another string column
        features = Features({"picture": Image(), "species": Value("string"), "note": Value("string")})
        rows = {"picture": [{"bytes": png(picture(c, i)), "path": None} for c, i in items],
                "species": [CLASS_NAMES[c] for c, _ in items], "note": ["x" for _ in items]}
        return Dataset.from_dict(rows, features=features)

    for repo, splits in SHAPES.items():
        DatasetDict({split: named(items) if repo == DISJOINT else labelled(items, 8 if repo == SPECKS else 24)
                     for split, items in splits.items()}).push_to_hub(repo)
    # the pooled repo again on a branch, without its test split: read as hf:OWNER/NAME@v1, a one-split repo
    DatasetDict({"train": labelled(SHAPES[POOLED]["train"])}).push_to_hub(POOLED, revision="v1")
""")

LOAD = textwrap.dedent("""
    import json, sys
    from memvir.data import DatasetError, load_dataset

    def facts(split, with_pixels):
        first_rows = [[list(split.image(i).getpixel((x, 0))) for x in range(split.image(i).width)]
                      for i in range(len(split))] if with_pixels else None
        return {"classes": split.class_names, "labels": split.labels.tolist(), "size": list(split[0][0].shape),
                "first_rows": first_rows}

    results = {}
    for key, name, columns in json.loads(sys.argv[2]):
        try:
            data = load_dataset(name, image_size=32, **columns)
            results[key] = {"rule": data.info.split_rule, "name": data.info.name,
                            "train": facts(data.train, True), "test": facts(data.test, False)}
            if key == "disjoint":  # --val-classes 2, as for every dataset
                from memvir.data.validation import hold_out_validation
                kept, validation = hold_out_validation(data, 2)
                results[key] |= {"kept": facts(kept.train, False), "validation": facts(validation, True)}
        except DatasetError as error:
            results[key] = {"refused": str(error)}
    print(json.dumps(results))
""")


def _python(code: str, *args, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                            env={**env, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


CASES = [
    ("pooled", f"hf:{POOLED}", {}),
    ("pooled_at_branch", f"hf:{POOLED}@v1", {}),
    ("disjoint", f"hf:{DISJOINT}", {"label_column": "species"}),
    ("disjoint_no_label", f"hf:{DISJOINT}", {}),
    ("disjoint_bad_column", f"hf:{DISJOINT}", {"label_column": "colour"}),
    ("disjoint_wrong_type", f"hf:{DISJOINT}", {"image_column": "species", "label_column": "species"}),
    ("specks", f"hf:{SPECKS}", {}),
    ("singles", f"hf:{SINGLES}", {}),
    ("missing", f"hf:{USER}/no-such-dataset", {}),
]
"""(key, name, columns) of each `load_dataset` call of the `loaded` fixture."""


@pytest.fixture(scope="module")
def hub_datasets(tmp_path_factory):
    """(a loopback Hub holding the repos of SHAPES, pushed by someone with 🤗 datasets; their HF_HOME, whose 🤗 datasets
    cache holds those repos; what `load_dataset` made of each of CASES, read back through the Hub there). One process
    pushes and loads: importing 🤗 datasets is most of its time. The Hub also lets timm's publisher in
    (`timm_weights`)."""
    # imported here, not at the top: the pushing process imports this module for SHAPES, and this one imports torch
    from test_hub_timm import TIMM_TOKEN

    home = tmp_path_factory.mktemp("hub-datasets")
    with LoopbackHub({**TOKENS, TIMM_TOKEN: "timm"}, read_only=(READ_TOKEN,)) as hub:
        result = _python(PUSH + LOAD, HERE, json.dumps(CASES),
                         env=client_environment(hub.url, home, token=WRITE_TOKEN))
        yield hub, home, json.loads(result.stdout.strip().splitlines()[-1])
    assert hub.server_errors == []


@pytest.fixture(scope="module")
def loaded(hub_datasets):
    return hub_datasets[2]


def _expected_items(repo: str, classes: list[int]) -> list[tuple[int, int]]:
    """The (class id, index) of each item of a split holding `classes`: all splits pooled in their order, then the
    rows of those classes in that order (the label of each is its class's rank in `classes`)."""
    pooled = [item for items in SHAPES[repo].values() for item in items]
    return [(c, i) for c, i in pooled if c in classes]


def _first_row(class_id: int, index: int) -> list:
    return picture(class_id, index)[0].tolist()


def test_splits_sharing_classes_are_pooled_and_the_classes_halved_in_label_order(loaded):
    pooled = loaded["pooled"]
    assert pooled["rule"].startswith("all splits pooled ('train', 'test')"), pooled["rule"]
    assert pooled["train"]["classes"] == CLASS_NAMES[:4] and pooled["test"]["classes"] == CLASS_NAMES[4:]
    train_items = _expected_items(POOLED, [0, 1, 2, 3])
    assert pooled["train"]["labels"] == [c for c, _ in train_items]
    assert pooled["test"]["labels"] == [c - 4 for c, _ in _expected_items(POOLED, [4, 5, 6, 7])]
    assert pooled["train"]["first_rows"] == [_first_row(c, i) for c, i in train_items]  # each row's own image
    assert pooled["train"]["size"] == [3, 32, 32] and pooled["name"] == f"hf:{POOLED}"
    at_branch = loaded["pooled_at_branch"]  # the train split alone: classes 0-3 train, 4-7 test, 2 images each
    assert at_branch["name"] == f"hf:{POOLED}@v1" and at_branch["rule"].startswith("all splits pooled ('train')")
    assert at_branch["train"]["labels"] == [c for c, _ in SHAPES[POOLED]["train"] if c < 4]


def test_class_disjoint_splits_are_kept_and_a_string_column_gives_the_classes(loaded):
    disjoint = loaded["disjoint"]
    assert disjoint["rule"].startswith("the repo's splits hold disjoint classes, so they are kept"), disjoint["rule"]
    train_classes = sorted(CLASS_NAMES[c] for c in range(5))  # a string column's classes: its values, sorted
    assert disjoint["train"]["classes"] == train_classes
    assert disjoint["test"]["classes"] == sorted(CLASS_NAMES[c] for c in range(5, 8))
    items = SHAPES[DISJOINT]["train"]
    assert disjoint["train"]["labels"] == [train_classes.index(CLASS_NAMES[c]) for c, _ in items]
    assert disjoint["train"]["first_rows"] == [_first_row(c, i) for c, i in items]


def test_validation_classes_are_held_out_of_a_hub_datasets_training_classes(loaded):
    from memvir.data.validation import validation_classes

    disjoint = loaded["disjoint"]
    train_classes = disjoint["train"]["classes"]
    held = [train_classes[c] for c in validation_classes(len(train_classes), 2)]
    assert disjoint["validation"]["classes"] == held
    assert disjoint["kept"]["classes"] == [name for name in train_classes if name not in held]
    items = [(c, i) for c, i in SHAPES[DISJOINT]["train"] if CLASS_NAMES[c] in held]
    assert disjoint["validation"]["labels"] == [held.index(CLASS_NAMES[c]) for c, _ in items]
    assert disjoint["validation"]["first_rows"] == [_first_row(c, i) for c, i in items]  # the clean images


def test_datasets_that_cannot_be_trained_on_are_refused_in_words(loaded):
    assert "has no ClassLabel column; name the one to use with --label-column" in loaded["disjoint_no_label"][
        "refused"]
    assert "picture (Image), species (Value(string)), note (Value(string))" in loaded["disjoint_no_label"]["refused"]
    assert "has no column 'colour' (--label-column)" in loaded["disjoint_bad_column"]["refused"]
    assert "column 'species' is Value(string), not an Image (--image-column)" in loaded["disjoint_wrong_type"][
        "refused"]
    assert "is 12x8 pixels; images need at least 16 pixels a side" in loaded["specks"]["refused"]
    assert "the test split" in loaded["singles"]["refused"] and "no class with two or more images" in loaded[
        "singles"]["refused"]
    assert f"could not load the Hub dataset {USER}/no-such-dataset" in loaded["missing"]["refused"]


def test_a_hub_name_is_checked_before_anything_is_fetched():
    from memvir.data import DatasetError, load_dataset

    for name in ("hf:", "hf:no-owner", "hf:a/b/c", "hf:someone/birds@", "hf:../x"):
        with pytest.raises(DatasetError, match="Hub dataset name|no usable revision"):
            load_dataset(name)
    with pytest.raises(DatasetError, match="name the columns of a Hub dataset"):
        load_dataset("glyphs-mini", label_column="label")


@pytest.fixture(scope="module")
def timm_weights(hub_datasets, tmp_path_factory) -> str:
    """timm's weights of test_hub_timm.NAME on the module's Hub, as timm publishes its own; their URL path there."""
    from test_hub_timm import HUB_ID, publish_timm_weights

    publish_timm_weights(hub_datasets[0].url, tmp_path_factory)
    return f"/{HUB_ID}/resolve/main/model.safetensors"


@pytest.mark.slow
def test_the_cli_trains_a_pretrained_timm_backbone_on_a_hub_dataset_pushes_it_and_evaluates_it_from_the_cache(
        hub_datasets, timm_weights, tmp_path, monkeypatch):
    """The issue's whole command, `--dataset hf:OWNER/NAME --backbone timm:NAME --pretrained`, in a process pointed
    at the loopback Hub (🤗 datasets reads the endpoint when it is imported), which holds the dataset and timm's
    weights; the run's own evaluation scores it; it is pushed (in this process: the push needs no 🤗 datasets, and
    tests/test_hub_round_trip.py pushes with `python -m memvir push` itself) and evaluated offline from the cache."""
    from cli_process import run_memvir
    from test_hub_timm import HUB_ID, NAME

    from memvir.cli import main

    hub, home, _ = hub_datasets
    run, repo, downloads = tmp_path / "run", f"{USER}/memvir-timm-birds", hub.paths_requested().count(timm_weights)
    online = client_environment(hub.url, home, token=WRITE_TOKEN) | {"PYTHONPATH": str(ROOT)}
    trained = subprocess.run(
        [sys.executable, "-m", "memvir", "train", "--dataset", f"hf:{POOLED}", "--backbone", f"timm:{NAME}",
         "--pretrained", "--image-size", "32", "--embedding-dim", "16", "--epochs", "1", "--batch-size", "8",
         "--memvir-n", "1", "--memvir-m", "0", "--warmup-epochs", "0", "--num-workers", "1", "--seed", "0",
         "--out", run], capture_output=True, text=True, cwd=ROOT, env=online, timeout=600)
    assert trained.returncode == 0, trained.stderr[-4000:]
    assert f"hf:{POOLED}: all splits pooled ('train', 'test'), classes split in label order" in trained.stderr
    assert hub.paths_requested().count(timm_weights) > downloads  # timm read the weights from the Hub
    metrics = json.loads(trained.stdout.strip().splitlines()[-1])
    assert metrics["step"] == 2 and 0 <= metrics["recall@1"] <= 1  # 16 training images, batches of 8
    config = json.loads((run / "config.json").read_text())
    assert (config["in_channels"], config["mean"], config["std"]) == (3, [0.5] * 3, [0.5] * 3)
    assert config["image_kind"] == "photo" and config["interpolation"] == "bicubic"

    point_client_at(monkeypatch, hub.url, tmp_path / "pusher")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")  # the CLI would set it in this process's environment
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    assert main(["push", str(run), "--repo-id", repo]) == 0
    card = hub.files_at(repo)["README.md"].decode()
    front_matter = card.split("---")[1]
    assert f"datasets:\n- {POOLED}\n" in front_matter  # the Hub links the model to its dataset
    assert f"base_model: {HUB_ID}\n" in front_matter  # and to the weights it was fine-tuned from
    assert f"| Dataset | `hf:{POOLED}` |" in card

    # evaluated offline (the tests' HF_HUB_OFFLINE=1): 🤗 datasets reads the repo from its cache
    evaluated = run_memvir("eval", run, env={"HF_HOME": str(home), "PYTHONPATH": str(ROOT)})
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    scored = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert scored["dataset"] == f"hf:{POOLED}"
    assert abs(scored["recall@1"] - metrics["recall@1"]) < 1e-6


@pytest.fixture
def app_on_the_hub(hub_datasets, tmp_path):
    """`python app.py` serving the page with the loopback Hub as its HF_ENDPOINT (its HF_HOME the one whose 🤗
    datasets cache the module's reads filled), no bundled checkpoints; its URL."""
    from served_app import app_py, free_port

    hub, home, _ = hub_datasets
    port = free_port()
    (tmp_path / "no-checkpoints").mkdir()
    env = client_environment(hub.url, home) | {
        "PYTHONPATH": str(ROOT), "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
        "MEMVIR_APP_DATA": str(tmp_path / "app-data"), "MEMVIR_CHECKPOINTS": str(tmp_path / "no-checkpoints"),
        "MEMVIR_UMAP": "0", "GRADIO_ANALYTICS_ENABLED": "False"}
    with app_py(env, tmp_path / "app.log", start_s=180) as url:
        yield url


@pytest.mark.slow
def test_the_page_trains_on_a_hub_dataset_and_its_retrieve_tab_searches_the_checkpoint(app_on_the_hub, tmp_path):
    from gradio_client import Client, handle_file
    from served_app import poll_status_until

    client = Client(app_on_the_hub, verbose=False)
    started = client.predict(dataset="hub", hub_dataset=POOLED, backbone="convnet", batch_size=8, epochs=1,
                             memvir_n=1, memvir_m=0, warmup_epochs=0, snapshot_every=0, eval_every=1,
                             api_name="/start_run")
    assert started["yours"] is True, started
    run_id = started["run_id"]
    poll_status_until(client, lambda status: status.startswith(("**Finished**", "**Failed**")), "the run's end",
                      300)
    status = poll_status_until(client, lambda status: True, "a status", 5)
    assert status.startswith("**Finished**"), status

    listed = client.predict(api_name="/checkpoints")["checkpoints"]
    checkpoint = next(entry["checkpoint"] for entry in listed if run_id in entry["checkpoint"])
    gallery = client.predict(checkpoint=checkpoint, api_name="/gallery")
    assert gallery["size"] == 16, gallery  # classes 4-7 of the pooled repo, four images each
    query = tmp_path / "query.png"
    query.write_bytes(png(picture(5, 3)))  # an image of the test split: its own copy comes first
    found = client.predict(checkpoint=checkpoint, k=4, query_class=CLASS_NAMES[5], query_image=handle_file(query),
                           api_name="/search")
    hits = found["hits"]
    assert len(hits) == 4 and round(hits[0]["score"], 3) == 1.0, hits
    assert hits[0]["same_class"] is True, hits
