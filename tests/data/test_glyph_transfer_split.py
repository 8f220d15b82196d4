"""glyphs-pretrain and glyphs-few, the pretraining and fine-tuning class sets: pairwise disjoint by code point, of the
scripts they are said to hold, and cut without changing the classes of glyphs and glyphs-mini.

The references are written out by hand: the code points and counts of glyphs and glyphs-mini were read from the code
before the two variants were added, the scripts' ranges are the Unicode blocks' own, and the scripts' names come from
unicodedata, not from the package.
"""

import unicodedata

import numpy as np
import pytest

from memvir.data import DATASET_NAMES, load_dataset
from memvir.data.validation import hold_out_validation

# The Unicode blocks of glyphs-few's alphabets: Cyrillic (+ Supplement), Armenian, Georgian.
FEW_RANGES = ((0x0400, 0x052F), (0x0530, 0x058F), (0x10A0, 0x10FF))

# glyphs-mini's 48 classes as they were before glyphs-pretrain and glyphs-few existed; the first 24 by the split
# are these train ones, the rest test.
MINI_TRAIN_FIRST = [0x10E, 0x18D, 0x1A9, 0x235, 0x239, 0x23D]
MINI_TEST_FIRST = [0x27, 0x7A, 0xAE, 0x141, 0x1E9, 0x1F6]
MINI_ALL = [0x27, 0x7A, 0xAE, 0x10E, 0x141, 0x18D, 0x1A9, 0x1E9, 0x1F6, 0x235, 0x238, 0x239, 0x23D, 0x25F, 0x2A6,
            0x3F6, 0x3FD, 0x4AD, 0x4F9, 0x53F, 0x54E, 0x55F, 0x1D4D, 0x1D57, 0x1DB0, 0x1DB7, 0x1E18, 0x1E3F, 0x1E8C,
            0x1E93, 0x1F76, 0x1F9B, 0x1FC2, 0x21A4, 0x21BB, 0x21BD, 0x220B, 0x2211, 0x2229, 0x230A, 0x2505, 0x2508,
            0x253C, 0x256E, 0x2583, 0x259B, 0x25AC, 0x25B3]


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The four glyph variants' splits, rendered once into a fresh cache (so no stale file is read)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("MEMVIR_CACHE", str(tmp_path_factory.mktemp("cache")))
    try:
        yield {name: load_dataset(name) for name in ("glyphs", "glyphs-mini", "glyphs-pretrain", "glyphs-few")}
    finally:
        monkeypatch.undo()


def code_points(split) -> list[int]:
    return [int(name.rsplit("U+", 1)[1], 16) for name in split.class_names]


def in_few_ranges(code_point: int) -> bool:
    return any(first <= code_point <= last for first, last in FEW_RANGES)


def test_both_variants_are_registered():
    assert {"glyphs-pretrain", "glyphs-few"} <= set(DATASET_NAMES)


@pytest.mark.slow
def test_glyphs_and_glyphs_mini_keep_their_classes(variants):
    glyphs, mini = variants["glyphs"], variants["glyphs-mini"]
    train, test = code_points(glyphs.train), code_points(glyphs.test)
    assert (len(train), len(test)) == (1021, 1021)
    assert train[:6] == [0x22, 0x24, 0x25, 0x26, 0x27, 0x28]
    assert test[:6] == [0x21, 0x23, 0x2A, 0x2B, 0x2D, 0x2F]
    assert sorted(train + test)[-3:] == [0xA7AA, 0xA7F8, 0xA7F9]
    assert (sum(train), sum(test)) == (5349564, 5271966)
    mini_train, mini_test = code_points(mini.train), code_points(mini.test)
    assert mini_train[:6] == MINI_TRAIN_FIRST and mini_test[:6] == MINI_TEST_FIRST
    assert sorted(mini_train + mini_test) == MINI_ALL
    assert (sum(mini_train), sum(mini_test)) == (133377, 104722)


def test_pretraining_fine_tuning_and_test_classes_are_pairwise_disjoint(variants):
    pretrain = variants["glyphs-pretrain"]
    few = variants["glyphs-few"]
    sets = {
        "pretrain": set(code_points(pretrain.train)),
        "pretrain-test": set(code_points(pretrain.test)),
        "few-train": set(code_points(few.train)),
        "few-test": set(code_points(few.test)),
    }
    names = list(sets)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            assert not sets[first] & sets[second], (first, second)
    # about a hundred classes to fine-tune on and as many to test on; a large pretraining set
    assert 100 <= len(sets["few-train"]) <= 130 and len(sets["few-test"]) >= 100
    assert len(sets["pretrain"]) >= 800
    # nothing of glyphs is lost or added: the four sets are glyphs' classes
    glyphs = variants["glyphs"]
    assert set().union(*sets.values()) == set(code_points(glyphs.train)) | set(code_points(glyphs.test))
    # glyphs-pretrain keeps glyphs' split: a backbone pretrained on it never saw glyphs' test classes
    assert sets["pretrain"] <= set(code_points(glyphs.train))
    assert sets["pretrain-test"] <= set(code_points(glyphs.test))


def test_the_fine_tuning_classes_are_other_scripts_than_the_pretraining_ones(variants):
    few = variants["glyphs-few"]
    for split in (few.train, few.test):
        # each character's Unicode name names its script ("MODIFIER LETTER GEORGIAN NAR" included)
        alphabets = [{"CYRILLIC", "ARMENIAN", "GEORGIAN"} & set(unicodedata.name(chr(cp)).split())
                     for cp in code_points(split)]
        assert all(len(alphabet) == 1 for alphabet in alphabets)
        assert set().union(*alphabets) == {"CYRILLIC", "ARMENIAN", "GEORGIAN"}  # each half mixes the three
        assert all(in_few_ranges(cp) for cp in code_points(split))
    pretrain = variants["glyphs-pretrain"]
    for split in (pretrain.train, pretrain.test):
        assert not any(in_few_ranges(cp) for cp in code_points(split))
    glyphs = variants["glyphs"]
    in_glyphs = [cp for cp in code_points(glyphs.train) + code_points(glyphs.test) if in_few_ranges(cp)]
    assert len(code_points(few.train)) + len(code_points(few.test)) == len(in_glyphs)  # the whole alphabets


def test_renders_and_normalisation_are_glyphs_own(variants):
    glyphs, few, pretrain = variants["glyphs"], variants["glyphs-few"], variants["glyphs-pretrain"]
    row_of = {cp: i for i, cp in enumerate(code_points(glyphs.train))}
    for split in (pretrain.train,):
        for label in (0, split.num_classes // 2, split.num_classes - 1):
            original = row_of[code_points(split)[label]]
            np.testing.assert_array_equal(split.renders[label], glyphs.train.renders[original])
    row_of_test = {cp: i for i, cp in enumerate(code_points(glyphs.test))}
    for label, cp in enumerate(code_points(few.test)):
        if cp in row_of_test:
            np.testing.assert_array_equal(few.test.renders[label], glyphs.test.renders[row_of_test[cp]])
            break
    else:
        pytest.fail("no glyphs-few test class is a glyphs test class: the cut is not of glyphs' classes")
    for variant in (few, pretrain):
        assert (variant.info.mean, variant.info.std) == (glyphs.info.mean, glyphs.info.std)
    assert (few.info.name, pretrain.info.name) == ("glyphs-few", "glyphs-pretrain")
    assert few.info.num_train_classes == few.train.num_classes == len(few.train) // 12


def test_validation_folds_are_cut_from_the_fine_tuning_classes(variants):
    few = variants["glyphs-few"]
    total = few.info.num_train_classes
    size = total // 4
    held_per_fold = []
    for fold in range(4):
        splits, validation = hold_out_validation(few, size, fold)
        held = set(validation.class_names)
        kept = set(splits.train.class_names)
        assert len(held) == size and len(kept) == total - size
        assert held.isdisjoint(kept) and held | kept == set(few.train.class_names)
        assert held.isdisjoint(few.test.class_names)
        held_per_fold.append(held)
    for i in range(4):
        for j in range(i + 1, 4):
            assert held_per_fold[i].isdisjoint(held_per_fold[j])
