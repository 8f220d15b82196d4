"""The embedded glyph dataset: classes, splits, renders, normalisation, augmentation, the disk cache.

References are computed here from the raw renders with numpy (hashes, bounding boxes, (x/255 - mean) / std).
Every test points MEMVIR_CACHE at its own temporary folder, so a cold render is tested, not a stale cache.
"""

import hashlib
import unicodedata

import numpy as np
import pytest
import torch

from memvir.data import DATASET_NAMES, DatasetError, DatasetInfo, load_dataset
from memvir.data.glyphs import dataset as glyphs_module
from memvir.data.glyphs.render import FACE_FILES, FONT_DIR, GlyphRenderer, candidate_code_points, class_name

MINI_CLASSES = 24


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEMVIR_CACHE", str(cache))
    return cache


@pytest.fixture
def mini():
    return load_dataset("glyphs-mini")


def code_point_of(name: str) -> int:
    """Parse "Ж U+0416" back to 0x416 (the name format is checked separately)."""
    return int(name.rsplit("U+", 1)[1], 16)


def test_dataset_names_are_the_contract():
    assert DATASET_NAMES == ("glyphs", "glyphs-mini", "glyphs-pretrain", "glyphs-few", "cub200", "cars196", "sop")


def test_fonts_and_licence_ship_inside_the_package():
    assert len(FACE_FILES) == 12
    for file_name in FACE_FILES:
        assert (FONT_DIR / file_name).is_file()
        assert (FONT_DIR / file_name).read_bytes()[:4] == b"\x00\x01\x00\x00"  # a TrueType font
    licence = (FONT_DIR / "LICENSE").read_text()
    assert "Bitstream" in licence and "Permission is hereby granted" in licence


def test_mini_sizes_labels_and_info(mini):
    assert mini.info == DatasetInfo(
        name="glyphs-mini",
        kind="glyph",
        channels=1,
        image_size=32,
        mean=glyphs_module.GLYPH_MEAN,
        std=glyphs_module.GLYPH_STD,
        num_train_classes=MINI_CLASSES,
        num_test_classes=MINI_CLASSES,
        normalization=None,
    )
    for split in (mini.train, mini.test):
        assert len(split) == MINI_CLASSES * 12
        assert split.num_classes == MINI_CLASSES
        assert split.labels.dtype == np.int64
        # item i is face i % 12 of class i // 12
        assert split.labels.tolist() == [i // 12 for i in range(MINI_CLASSES * 12)]
        for index in (0, 13, len(split) - 1):
            image, label = split[index]
            assert label == split.labels[index] and isinstance(label, int)
            assert image.shape == (1, 32, 32) and image.dtype == torch.float32
            assert type(image) is torch.Tensor  # a plain tensor, not a torchvision wrapper
            assert split.image(index).size == (32, 32) and split.image(index).mode == "L"


def test_mini_train_and_test_classes_are_disjoint_and_sorted(mini):
    train_points = [code_point_of(name) for name in mini.train.class_names]
    test_points = [code_point_of(name) for name in mini.test.class_names]
    assert not set(train_points) & set(test_points)
    assert train_points == sorted(train_points) and test_points == sorted(test_points)
    assert set(train_points + test_points) <= set(candidate_code_points())


def test_class_names_are_character_and_code_point(mini):
    assert class_name(0x0416) == "Ж U+0416"
    assert class_name(0x1E9E) == "ẞ U+1E9E"
    for split in (mini.train, mini.test):
        for label, name in enumerate(split.class_names):
            code_point = int(split.code_points[label])
            assert name == chr(code_point) + " U+" + format(code_point, "04X")


def test_no_render_is_shared_between_classes_and_none_is_blank(mini):
    owner = {}
    for split in (mini.train, mini.test):
        for index in range(len(split)):
            pixels = np.asarray(split.image(index))
            assert pixels.max() > 0, f"blank render: {split.class_names[split.labels[index]]}"
            digest = hashlib.sha256(pixels.tobytes()).hexdigest()
            name = split.class_names[split.labels[index]]
            assert owner.setdefault(digest, name) == name, f"{name} repeats a render of {owner[digest]}"


def test_renders_are_centred_and_inside_the_margin(mini):
    for index in range(0, len(mini.test), 7):
        pixels = np.asarray(mini.test.image(index))
        rows = [r for r in range(32) if pixels[r].any()]
        columns = [c for c in range(32) if pixels[:, c].any()]
        assert rows[0] >= 2 and rows[-1] <= 29 and columns[0] >= 2 and columns[-1] <= 29  # 2-pixel margin at 32 px
        assert abs((rows[0] + rows[-1]) / 2 - 15.5) <= 1.0
        assert abs((columns[0] + columns[-1]) / 2 - 15.5) <= 1.0


def test_test_items_are_normalised_as_info_says(mini):
    mean, std = mini.info.mean[0], mini.info.std[0]
    for index in (0, 5, 100, len(mini.test) - 1):
        expected = (np.asarray(mini.test.image(index), dtype=np.float64) / 255.0 - mean) / std
        image, _ = mini.test[index]
        np.testing.assert_allclose(image[0].numpy(), expected, atol=1e-5)


def test_test_split_is_identical_across_loads_and_cache_folders(monkeypatch, tmp_path):
    first = load_dataset("glyphs-mini")
    monkeypatch.setenv("MEMVIR_CACHE", str(tmp_path / "other-cache"))  # a second cold render
    second = load_dataset("glyphs-mini")
    assert first.test.class_names == second.test.class_names
    for index in range(len(first.test)):
        assert torch.equal(first.test[index][0], second.test[index][0])


def test_train_augmentation_varies_between_reads_but_keeps_the_glyph(mini):
    mean, std = mini.info.mean[0], mini.info.std[0]
    index = 12 * 3 + 4
    reads = torch.stack([mini.train[index][0] for _ in range(12)])
    assert not torch.equal(reads[0], reads[1])
    assert all(mini.train[index][1] == 3 for _ in range(3))
    clean = np.asarray(mini.train.image(index), dtype=np.float64) / 255.0
    average = (reads.mean(0)[0].numpy() * std) + mean  # back to the [0, 1] scale
    correlation = np.corrcoef(average.ravel(), clean.ravel())[0, 1]
    # small affine, stroke and noise changes, not a different picture: closer to its own glyph than to any other
    assert correlation > 0.7
    for other in range(0, len(mini.train), 12):
        if other // 12 != 3:
            other_clean = np.asarray(mini.train.image(other), dtype=np.float64) / 255.0
            assert correlation > np.corrcoef(average.ravel(), other_clean.ravel())[0, 1]


def test_glyphs_are_never_flipped(mini):
    # An asymmetric glyph, augmented many times, stays closer to itself than to its mirror images.
    augment = mini.train.batch_transform
    pixels, _ = mini.train.raw(12 * 3)
    clean = pixels.float()[0] / 255.0
    torch.manual_seed(0)
    batch = augment(pixels.unsqueeze(0).repeat(64, 1, 1, 1))[:, 0] * mini.info.std[0] + mini.info.mean[0]

    def correlation(a, b):
        return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])

    for image in batch:
        own = correlation(image, clean)
        assert own > correlation(image, clean.flip(1)) or torch.equal(clean, clean.flip(1))
        assert own > correlation(image, clean.flip(0)) or torch.equal(clean, clean.flip(0))


def test_batch_augmentation_equals_per_item_augmentation(mini):
    # dataset[i] and the Trainer's batched path are one transform: the same draws give the same pixels.
    augment = mini.train.batch_transform
    pixels = torch.stack([mini.train.raw(i)[0] for i in (0, 13, 40)])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        batched = augment(pixels)
    assert batched.shape == (3, 1, 32, 32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        again = augment(pixels)
    assert torch.equal(batched, again)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        single = augment(pixels[0])
    assert single.shape == (1, 32, 32)


def test_test_split_has_no_batch_augmentation(mini):
    assert mini.test.batch_transform is None


def test_train_augmentation_is_reproducible_from_the_seed_and_leaves_torch_rng_alone():
    def reads(seed):
        train = load_dataset("glyphs-mini", seed=seed).train
        return torch.stack([train[index][0] for index in (0, 1, 0, 50)])

    state = torch.get_rng_state()
    first, again, other = reads(7), reads(7), reads(8)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert not torch.equal(first[0], first[2])  # the same item read twice in one run differs


def test_train_augmentation_differs_between_dataloader_workers_and_epochs():
    train = load_dataset("glyphs-mini", seed=3).train
    subset = torch.utils.data.Subset(train, [5, 5, 5, 5])
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(subset, batch_size=1, num_workers=2)
    epoch_one = [batch[0] for batch in loader]
    epoch_two = [batch[0] for batch in loader]
    # worker 0 reads items 0 and 2, worker 1 items 1 and 3: no two of the eight reads coincide
    all_reads = epoch_one + epoch_two
    for i in range(len(all_reads)):
        for j in range(i + 1, len(all_reads)):
            assert not torch.equal(all_reads[i], all_reads[j])


def test_image_size_64(mini):
    large = load_dataset("glyphs-mini", image_size=64)
    assert large.info.image_size == 64
    assert large.train[0][0].shape == (1, 64, 64)
    assert large.test.image(0).size == (64, 64)
    assert large.test.num_classes == MINI_CLASSES


@pytest.fixture
def render_calls(monkeypatch):
    """Counts the calls of the renderer behind load_dataset (each entry is one rendering of a glyph variant)."""
    calls = []
    real_render = glyphs_module.render_glyph_classes

    def counting_render(*args, **kwargs):
        calls.append(args)
        return real_render(*args, **kwargs)

    monkeypatch.setattr(glyphs_module, "render_glyph_classes", counting_render)
    return calls


def test_second_load_reads_the_cache_without_rendering(render_calls, fresh_cache):
    first = load_dataset("glyphs-mini")
    assert len(render_calls) == 1
    cached = list(fresh_cache.iterdir())
    assert [path.suffix for path in cached] == [".npz"]  # one file, no temporary left behind
    second = load_dataset("glyphs-mini")
    assert len(render_calls) == 1
    assert first.train.class_names == second.train.class_names
    np.testing.assert_array_equal(first.test.renders, second.test.renders)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped bytes"])
def test_a_corrupt_cache_file_is_rendered_again(render_calls, fresh_cache, damage):
    load_dataset("glyphs-mini")
    (cache_file,) = fresh_cache.iterdir()
    reference = np.load(cache_file)["renders"]
    data = cache_file.read_bytes()
    if damage == "garbage":
        data = b"not an npz file"
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # corrupt the middle of the compressed stream, leaving the zip directory intact
        middle = len(data) // 2
        data = data[:middle] + bytes(byte ^ 0xFF for byte in data[middle : middle + 64]) + data[middle + 64 :]
    cache_file.write_bytes(data)
    again = load_dataset("glyphs-mini")
    assert len(render_calls) == 2
    np.testing.assert_array_equal(np.load(cache_file)["renders"], reference)
    assert again.test.num_classes == MINI_CLASSES


def test_a_blank_face_is_no_item_and_the_other_faces_keep_their_order():
    # three classes of twelve hand-made renders, each face a different pixel lit; class 1 loses face 5
    renders = np.zeros((3, 12, 32, 32), dtype=np.uint8)
    for label in range(3):
        for face in range(12):
            renders[label, face, label, face] = 255
    renders[1, 5] = 0
    split = glyphs_module.GlyphDataset(np.array([0x41, 0x42, 0x43]), renders, lambda pixels: pixels)
    assert len(split) == 35 and split.num_classes == 3
    assert split.labels.tolist() == [0] * 12 + [1] * 11 + [2] * 12
    faces_of_class_1 = [int(np.argmax(np.asarray(split.image(index))[1])) for index in range(12, 23)]
    assert faces_of_class_1 == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    pixels, label = split.raw(17)  # the sixth item of class 1 is its face 6
    assert label == 1 and pixels[0, 1, 6] == 255 and split[17][1] == 1


def test_renderer_rejects_missing_and_blank_glyphs():
    renderer = GlyphRenderer(32)
    assert renderer.render(ord("A")).shape == (12, 32, 32)
    assert renderer.render(0x0020) is None  # a space: nothing drawn
    assert renderer.render(0x0378) is None  # unassigned: every face shows its .notdef box
    assert renderer.render(0x0F00) is None  # Tibetan: not in DejaVu Serif, so not in all twelve faces


def test_candidates_skip_combining_marks_and_controls():
    candidates = candidate_code_points()
    assert 0x0301 not in candidates  # combining acute accent
    assert 0x007F not in candidates and 0x00AD not in candidates  # DEL, soft hyphen
    assert all(unicodedata.category(chr(c))[0] != "M" for c in candidates)
    assert ord("A") in candidates and 0x0416 in candidates and 0x2192 in candidates


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"normalization": "caffe"}, "normalization='caffe' applies to photo datasets only"),
        ({"image_size": 8}, "image_size must be an integer from 16 to 1024"),
        ({"image_size": 32.0}, "image_size must be an integer"),
        ({"seed": -1}, "seed must be a non-negative integer"),
    ],
)
def test_bad_glyph_arguments_are_rejected(kwargs, message):
    with pytest.raises(DatasetError, match=message):
        load_dataset("glyphs-mini", **kwargs)


@pytest.mark.slow
def test_full_glyphs_classes_dedup_split_and_statistics():
    full = load_dataset("glyphs")
    total = full.info.num_train_classes + full.info.num_test_classes
    assert 2000 <= total <= 2400
    assert abs(full.info.num_train_classes - full.info.num_test_classes) <= 1
    names = full.train.class_names + full.test.class_names
    code_points = {code_point_of(name) for name in names}
    assert len(code_points) == total
    # Latin A, Greek Alpha, Cyrillic A: one class, the first code point
    assert ord("A") in code_points and 0x0391 not in code_points and 0x0410 not in code_points
    assert 0x0416 in code_points  # Ж has no Latin twin
    # scripts mix on both sides of the split
    for split in (full.train, full.test):
        points = [int(p) for p in split.code_points]
        assert any(p < 0x80 for p in points) and any(0x370 <= p < 0x400 for p in points)
        assert any(0x400 <= p < 0x530 for p in points) and any(0x2190 <= p < 0x2300 for p in points)
    # no image shared between two classes
    owners = {}
    for split_index, split in enumerate((full.train, full.test)):
        for index in range(len(split)):
            digest = hashlib.blake2b(np.asarray(split.image(index)).tobytes(), digest_size=16).digest()
            label = int(split.labels[index])
            assert owners.setdefault(digest, (split_index, label)) == (split_index, label)
    # the normalisation constants are the measured statistics of the clean 32-pixel train images
    pixels = np.stack([np.asarray(full.train.image(index)) for index in range(len(full.train))]) / 255.0
    assert abs(pixels.mean() - full.info.mean[0]) < 0.005
    assert abs(pixels.std() - full.info.std[0]) < 0.005


def test_stroke_filters_equal_max_pooling():
    from memvir.data.transforms import _filter3x3

    images = torch.rand(5, 1, 9, 7)
    dilated = torch.nn.functional.max_pool2d(images, kernel_size=3, stride=1, padding=1)
    eroded = -torch.nn.functional.max_pool2d(-images, kernel_size=3, stride=1, padding=1)
    assert torch.equal(_filter3x3(images, torch.maximum, float("-inf")), dilated)
    assert torch.equal(_filter3x3(images, torch.minimum, float("inf")), eroded)
