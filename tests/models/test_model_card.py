"""The model card's front matter as the Hub reads it: library_name, tags, datasets, metrics and a model-index of the
run's retrieval metrics, accepted by the Hub's validate-yaml (as tests/hub_server.py checks it) and parsed by
huggingface_hub's ModelCard / ModelCardData, without ignoring errors."""

import pytest
import yaml
from hub_server import validate_card_yaml
from huggingface_hub import ModelCard, ModelCardData

from memvir.models.card import CARD_TAGS, dataset_id, metric_display_name
from memvir.models.embedding_model import EmbeddingModel

METRICS = {"recall@1": 0.8125, "recall@2": 0.875, "precision@1": 0.8125, "r_precision": 0.5, "map@r": 0.40625,
           "epoch": 3, "val_recall@1": 0.75, "val_map@r": 0.25}


def _card(tmp_path, metrics=METRICS, dataset="glyphs-mini") -> str:
    EmbeddingModel(embedding_dim=8, dataset=dataset).save_pretrained(tmp_path, metrics=metrics)
    return (tmp_path / "README.md").read_text()


def _front_matter(card: str) -> dict:
    return yaml.safe_load(card.split("---\n")[1])


def test_the_front_matter_names_library_tags_dataset_and_metrics(tmp_path):
    metadata = _front_matter(_card(tmp_path))
    assert metadata["library_name"] == "memvir"
    assert metadata["pipeline_tag"] == "image-feature-extraction"
    assert {"metric-learning", "memvir", "image-retrieval"} <= set(metadata["tags"]) and set(CARD_TAGS) == {
        "metric-learning", "memvir", "image-retrieval"}
    assert metadata["datasets"] == ["glyphs-mini"]
    assert metadata["metrics"] == ["recall@1", "recall@2", "precision@1", "r_precision", "map@r"]  # not the epoch


def test_the_model_index_holds_the_run_metrics(tmp_path):
    [entry] = _front_matter(_card(tmp_path))["model-index"]
    assert entry["name"] == "memvir-convnet-glyphs-mini"
    test, validation = entry["results"]
    task = {"type": "image-feature-extraction", "name": "Image retrieval"}
    assert test["task"] == task and validation["task"] == task
    assert test["dataset"] == {"name": "glyphs-mini", "type": "glyphs-mini", "split": "test"}
    assert validation["dataset"] == {"name": "glyphs-mini", "type": "glyphs-mini", "split": "validation"}
    assert test["metrics"] == [
        {"type": "recall@1", "value": 0.8125, "name": "Recall@1"},
        {"type": "recall@2", "value": 0.875, "name": "Recall@2"},
        {"type": "precision@1", "value": 0.8125, "name": "Precision@1"},
        {"type": "r_precision", "value": 0.5, "name": "R-Precision"},
        {"type": "map@r", "value": 0.40625, "name": "MAP@R"},
    ]
    assert validation["metrics"] == [{"type": "recall@1", "value": 0.75, "name": "Recall@1"},
                                     {"type": "map@r", "value": 0.25, "name": "MAP@R"}]


def test_huggingface_hub_parses_the_card_strictly(tmp_path):
    _card(tmp_path)
    card = ModelCard.load(tmp_path / "README.md", ignore_metadata_errors=False)
    assert isinstance(card.data, ModelCardData)
    assert card.data.library_name == "memvir" and card.data.datasets == ["glyphs-mini"]
    assert card.data.model_name == "memvir-convnet-glyphs-mini"
    results = {(result.dataset_split, result.metric_type): result.metric_value for result in card.data.eval_results}
    assert results == {("test", "recall@1"): 0.8125, ("test", "recall@2"): 0.875, ("test", "precision@1"): 0.8125,
                       ("test", "r_precision"): 0.5, ("test", "map@r"): 0.40625, ("validation", "recall@1"): 0.75,
                       ("validation", "map@r"): 0.25}
    assert "## Metrics" in card.text and "| epoch | 3 |" in card.text  # the body keeps every number


def test_the_hubs_validate_yaml_accepts_the_card(tmp_path):
    assert validate_card_yaml(_card(tmp_path)) == {"errors": [], "warnings": []}


def test_validate_yaml_refuses_a_model_index_the_hub_would(tmp_path):
    """The check the card passes is a real one: the same card with a result lacking its dataset's name fails."""
    card = _card(tmp_path)
    broken = card.replace("  results:\n  - task:",
                          "  results:\n  - dataset: {type: glyphs}\n    metrics: []\n  - task:", 1)
    assert validate_card_yaml(broken)["errors"] == [
        {"message": '"model-index[0].results[0].task.type" is required'},
        {"message": '"model-index[0].results[0].dataset.name" is required'},
        {"message": '"model-index[0].results[0].metrics" is required and must be a non-empty array'},
    ]
    assert validate_card_yaml(card.replace("pipeline_tag: image-feature-extraction", "pipeline_tag: retrieving"))[
        "errors"] == [{"message": "\"pipeline_tag\" 'retrieving' is not a task the Hub knows"}]


def test_a_card_without_metrics_has_no_model_index(tmp_path):
    metadata = _front_matter(_card(tmp_path, metrics=None))
    assert "model-index" not in metadata and "metrics" not in metadata
    assert metadata["datasets"] == ["glyphs-mini"] and metadata["library_name"] == "memvir"
    assert validate_card_yaml(_card(tmp_path, metrics=None))["errors"] == []


def test_a_class_folder_is_named_by_its_folder_not_this_machines_path(tmp_path):
    card = _card(tmp_path, metrics={"recall@1": 0.5}, dataset="folder:/home/someone/data/birds")
    metadata = _front_matter(card)
    assert metadata["datasets"] == ["birds"]
    assert metadata["model-index"][0]["results"][0]["dataset"]["type"] == "birds"
    assert "/home/someone" not in card.split("---\n")[1]


@pytest.mark.parametrize(("key", "name"), [("recall@1", "Recall@1"), ("recall@16", "Recall@16"),
                                          ("map@r", "MAP@R"), ("r_precision", "R-Precision"), ("nmi", "NMI"),
                                          ("epoch", None), ("recall@0", None), ("step", None)])
def test_metric_display_names(key, name):
    assert metric_display_name(key) == name


def test_dataset_ids():
    assert [dataset_id(name) for name in ("glyphs", "cub200", "folder:birds", "folder:/data/cars/", "folder:")] == [
        "glyphs", "cub200", "birds", "cars", "folder"]
