"""The one registry shape (memvir._registry) the losses, backbones and datasets share: registration order, a taken
name refused, and an unknown name refused with the known names, the other forms and the nearest name, word for word."""

import pytest

from memvir._registry import Registry
from memvir.data import DATASET_NAMES, DatasetError, load_dataset
from memvir.data.registry import DATASET_REGISTRY
from memvir.losses import LOSS_REGISTRY, LOSSES
from memvir.models.backbones import BACKBONE_REGISTRY


class ColourError(ValueError):
    pass


@pytest.fixture
def colours():
    registry = Registry("colour", other_forms=("#RRGGBB",), error=ColourError)
    for name in ("red", "green", "blue"):
        registry.register(name)(lambda name=name: name)
    return registry


def test_entries_keep_registration_order_and_the_decorator_returns_what_it_decorates(colours):
    def cyan():
        return "cyan"

    assert colours.register("cyan")(cyan) is cyan
    assert colours.names() == ("red", "green", "blue", "cyan") and list(colours) == list(colours.names())
    assert len(colours) == 4 and "cyan" in colours and "black" not in colours
    assert colours.get("green")() == "green"


def test_a_taken_name_is_refused(colours):
    with pytest.raises(ValueError, match=r"^colour 'red' is already registered; pick another name$"):
        colours.register("red")(lambda: None)
    with pytest.raises(ValueError, match="non-empty string name"):
        colours.register("")


def test_an_unknown_name_is_refused_with_the_choices_and_the_nearest_name(colours):
    with pytest.raises(ColourError) as error:
        colours.get("gren")
    assert str(error.value) == "unknown colour 'gren' (did you mean 'green'?): use one of red, green, blue or #RRGGBB"
    with pytest.raises(ColourError) as error:
        colours.get("purple")  # nothing close: no guess
    assert str(error.value) == "unknown colour 'purple': use one of red, green, blue or #RRGGBB"


def test_a_copy_takes_new_entries_without_changing_the_original(colours):
    copy = colours.copy()
    copy.register("black")(lambda: "black")
    assert "black" in copy and "black" not in colours and copy.kind == "colour" and copy.error is ColourError


def test_the_three_registries_are_the_public_names():
    assert LOSS_REGISTRY.names() == LOSSES
    assert DATASET_REGISTRY.names() == DATASET_NAMES
    assert set(BACKBONE_REGISTRY.names()) == {"convnet", "convnet-gn", "resnet18", "resnet50", "googlenet"}


def test_an_unknown_dataset_is_a_dataset_error_naming_the_nearest():
    with pytest.raises(DatasetError, match=r"^unknown dataset 'glyph' \(did you mean 'glyphs'\?\): use one of glyphs,"):
        load_dataset("glyph")
