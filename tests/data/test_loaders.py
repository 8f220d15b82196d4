"""The benchmark, folder and registry loaders on tiny fixture trees built here with PIL (and scipy for CARS196).

Fixtures use the real class ids (CUB 1, 2, 101, 102; CARS 1, 2, 99, 100), so the official split rules are tested as
they apply to the real data. Transforms are checked against a reference written with PIL and numpy.
"""

import numpy as np
import pytest
import torch
from PIL import Image

from memvir.data import DatasetError, load_dataset
from memvir.data.transforms import CAFFE_MEAN, IMAGENET_MEAN, IMAGENET_STD

SIZE = 32  # model input side in these tests; the test resize is round(32 * 256 / 224) = 37


def write_image(path, seed, size=(40, 40)):
    """A small random RGB image, different for every seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def reference_test_tensor(path, mean=IMAGENET_MEAN, std=IMAGENET_STD, scale=255.0):
    """Resize the short side to 37 (bilinear), crop the central 32x32, scale to [0, 1] (or not) and normalise."""
    with Image.open(path) as image:
        image = image.convert("RGB")
    width, height = image.size
    short = round(SIZE * 256 / 224)
    new_width, new_height = (
        (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
    )
    resized = np.asarray(image.resize((new_width, new_height), Image.Resampling.BILINEAR), dtype=np.float64)
    top, left = int(round((new_height - SIZE) / 2.0)), int(round((new_width - SIZE) / 2.0))
    crop = resized[top : top + SIZE, left : left + SIZE] / scale
    return ((crop - np.array(mean)) / np.array(std)).transpose(2, 0, 1)


# ---------------------------------------------------------------------------------------------------------------
# CUB-200-2011
# ---------------------------------------------------------------------------------------------------------------

CUB_CLASSES = {
    1: "001.Black_footed_Albatross",
    2: "002.Laysan_Albatross",
    101: "101.White_Pelican",
    102: "102.Western_Wood_Pewee",
}


def make_cub(root, images_per_class=(2, 3, 2, 3)):
    root.mkdir(parents=True, exist_ok=True)
    images, labels = [], []
    image_id = 1
    for (class_id, name), count in zip(CUB_CLASSES.items(), images_per_class, strict=True):
        for index in range(count):
            relative = f"{name}/{name.split('.')[1]}_{index:04d}.jpg"
            write_image(root / "images" / relative, seed=image_id)
            images.append(f"{image_id} {relative}")
            labels.append(f"{image_id} {class_id}")
            image_id += 1
    (root / "images.txt").write_text("\n".join(images) + "\n")
    (root / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (root / "classes.txt").write_text("\n".join(f"{i} {n}" for i, n in CUB_CLASSES.items()) + "\n")
    return root


def test_cub200_splits_classes_1_100_train_and_101_200_test(tmp_path):
    root = make_cub(tmp_path / "CUB_200_2011")
    splits = load_dataset("cub200", data_root=root, image_size=SIZE)
    assert splits.train.class_names == ["001.Black_footed_Albatross", "002.Laysan_Albatross"]
    assert splits.test.class_names == ["101.White_Pelican", "102.Western_Wood_Pewee"]
    assert splits.train.labels.tolist() == [0, 0, 1, 1, 1]
    assert splits.test.labels.tolist() == [0, 0, 1, 1, 1]
    assert splits.train.labels.dtype == np.int64
    info = splits.info
    assert (info.name, info.kind, info.channels, info.image_size) == ("cub200", "photo", 3, SIZE)
    assert (info.num_train_classes, info.num_test_classes) == (2, 2)
    assert info.mean == IMAGENET_MEAN and info.std == IMAGENET_STD and info.normalization is None
    assert splits.test.paths[0] == root / "images/101.White_Pelican/White_Pelican_0000.jpg"


def test_cub200_accepts_the_parent_of_the_archive_folder(tmp_path):
    make_cub(tmp_path / "CUB_200_2011")
    assert load_dataset("cub200", data_root=tmp_path, image_size=SIZE).info.num_test_classes == 2


def test_photo_test_transform_matches_the_reference(tmp_path):
    root = make_cub(tmp_path / "cub")
    # a non-square image exercises the short-side resize
    write_image(root / "images/101.White_Pelican/White_Pelican_0000.jpg", seed=99, size=(50, 40))
    splits = load_dataset("cub200", data_root=root, image_size=SIZE)
    for index in (0, 3):
        image, label = splits.test[index]
        assert image.shape == (3, SIZE, SIZE) and image.dtype == torch.float32 and label == splits.test.labels[index]
        np.testing.assert_allclose(image.numpy(), reference_test_tensor(splits.test.paths[index]), atol=1e-4)
        assert torch.equal(image, splits.test[index][0])  # deterministic


def test_caffe_normalization_keeps_0_255_pixels(tmp_path):
    root = make_cub(tmp_path / "cub")
    splits = load_dataset("cub200", data_root=root, image_size=SIZE, normalization="caffe")
    assert splits.info.normalization == "caffe"
    assert splits.info.mean == (128.0, 117.0, 104.0) == CAFFE_MEAN and splits.info.std == (1.0, 1.0, 1.0)
    expected = reference_test_tensor(splits.test.paths[1], mean=CAFFE_MEAN, std=(1, 1, 1), scale=1.0)
    np.testing.assert_allclose(splits.test[1][0].numpy(), expected, atol=1e-3)


def test_photo_train_transform_is_random_seeded_and_sized(tmp_path):
    root = make_cub(tmp_path / "cub")

    def reads(seed):
        train = load_dataset("cub200", data_root=root, image_size=SIZE, seed=seed).train
        return torch.stack([train[0][0], train[0][0], train[4][0]])

    first, again, other = reads(1), reads(1), reads(2)
    assert first.shape == (3, 3, SIZE, SIZE)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(first[0], first[1])


def test_image_returns_the_raw_rgb_image(tmp_path):
    root = make_cub(tmp_path / "cub")
    gray = root / "images/001.Black_footed_Albatross/Black_footed_Albatross_0000.jpg"
    Image.new("L", (30, 20), color=77).save(gray)  # grayscale files are converted to RGB
    splits = load_dataset("cub200", data_root=root, image_size=SIZE)
    image = splits.train.image(0)
    assert image.mode == "RGB" and image.size == (30, 20)
    assert splits.train[0][0].shape == (3, SIZE, SIZE)


def test_cub200_needs_data_root():
    with pytest.raises(DatasetError, match="dataset 'cub200' needs data_root: the folder that holds the CUB_200_2011"):
        load_dataset("cub200")


def test_cub200_missing_folder_names_what_it_looked_for(tmp_path):
    with pytest.raises(DatasetError, match=r"cub200: no images.txt in .*nowhere or .*nowhere/CUB_200_2011; expected"):
        load_dataset("cub200", data_root=tmp_path / "nowhere")


def test_cub200_missing_label_file_is_named(tmp_path):
    root = make_cub(tmp_path / "cub")
    (root / "image_class_labels.txt").unlink()
    with pytest.raises(DatasetError, match=r"missing file .*image_class_labels.txt; expected the CUB_200_2011 layout"):
        load_dataset("cub200", data_root=root)


def test_cub200_malformed_line_is_named(tmp_path):
    root = make_cub(tmp_path / "cub")
    lines = (root / "image_class_labels.txt").read_text().splitlines()
    lines[2] = "3 three"
    (root / "image_class_labels.txt").write_text("\n".join(lines))
    with pytest.raises(
        DatasetError, match=r"image_class_labels.txt, line 3: expected '<image_id> <class_id>', found '3 three'"
    ):
        load_dataset("cub200", data_root=root)


def test_cub200_inconsistent_tables_are_named(tmp_path):
    root = make_cub(tmp_path / "cub")
    (root / "classes.txt").write_text("1 a\n2 b\n101 c\n")
    with pytest.raises(DatasetError, match=r"classes.txt: class_id 102 \(of image_id 8\) is not listed"):
        load_dataset("cub200", data_root=root)
    root = make_cub(tmp_path / "cub2")
    (root / "images.txt").write_text((root / "images.txt").read_text() + "11 extra/x.jpg\n")
    with pytest.raises(DatasetError, match="no class for image_id 11 of images.txt"):
        load_dataset("cub200", data_root=root)
    (root / "images.txt").write_text("1 a.jpg\n1 b.jpg\n")
    with pytest.raises(DatasetError, match="images.txt: id 1 appears twice"):
        load_dataset("cub200", data_root=root)


def test_cub200_missing_image_file_is_named(tmp_path):
    root = make_cub(tmp_path / "cub")
    missing = root / "images/002.Laysan_Albatross/Laysan_Albatross_0001.jpg"
    missing.unlink()
    with pytest.raises(
        DatasetError, match=r"1 image file\(s\) listed in .*images.txt are missing, e.g. .*Laysan_Albatross_0001.jpg"
    ):
        load_dataset("cub200", data_root=root)


def test_unreadable_image_is_named(tmp_path):
    root = make_cub(tmp_path / "cub")
    broken = root / "images/101.White_Pelican/White_Pelican_0001.jpg"
    broken.write_bytes(b"this is not a jpeg")
    splits = load_dataset("cub200", data_root=root, image_size=SIZE)
    with pytest.raises(DatasetError, match=r"cannot read image .*White_Pelican_0001.jpg"):
        splits.test[1]
    with pytest.raises(DatasetError, match=r"cannot read image .*White_Pelican_0001.jpg"):
        splits.test.image(1)


def test_a_split_with_one_class_is_rejected(tmp_path):
    root = make_cub(tmp_path / "cub")
    (root / "image_class_labels.txt").write_text("1 1\n2 1\n3 1\n4 1\n5 1\n6 101\n7 101\n8 102\n9 102\n10 102\n")
    with pytest.raises(
        DatasetError, match=r"cub200: the train split has 1 class\(es\) with images \(classes 1-100 train"
    ):
        load_dataset("cub200", data_root=root)


# ---------------------------------------------------------------------------------------------------------------
# CARS196
# ---------------------------------------------------------------------------------------------------------------


def make_cars(root, class_ids=(1, 1, 2, 2, 99, 99, 100, 100), annotations=True, class_names=True):
    """cars_annos.mat as published: a 1xN struct array `annotations` and a 1x196 cell array `class_names`."""
    from scipy.io import savemat

    root.mkdir(parents=True, exist_ok=True)
    fields = [("relative_im_path", "O"), ("bbox_x1", "O"), ("class", "O"), ("test", "O")]
    records = np.zeros((1, len(class_ids)), dtype=fields)
    for index, class_id in enumerate(class_ids):
        relative = f"car_ims/{index + 1:06d}.jpg"
        write_image(root / relative, seed=index)
        # the test flag is set on every other image, train and test classes alike: the loader must ignore it
        records[0, index] = (relative, np.uint8(1), np.uint8(class_id), np.uint8(index % 2))
    names = np.empty((1, 196), dtype=object)
    for index in range(196):
        names[0, index] = f"Car Model {index + 1}"
    contents = {}
    if annotations:
        contents["annotations"] = records
    if class_names:
        contents["class_names"] = names
    savemat(root / "cars_annos.mat", contents)
    return root


def test_cars196_splits_classes_1_98_train_and_99_196_test(tmp_path):
    root = make_cars(tmp_path / "cars")
    splits = load_dataset("cars196", data_root=root, image_size=SIZE)
    assert splits.train.class_names == ["Car Model 1", "Car Model 2"]
    assert splits.test.class_names == ["Car Model 99", "Car Model 100"]
    assert splits.train.labels.tolist() == [0, 0, 1, 1] and splits.test.labels.tolist() == [0, 0, 1, 1]
    assert [path.name for path in splits.train.paths] == ["000001.jpg", "000002.jpg", "000003.jpg", "000004.jpg"]
    assert splits.info.name == "cars196" and splits.info.num_test_classes == 2
    np.testing.assert_allclose(splits.test[2][0].numpy(), reference_test_tensor(splits.test.paths[2]), atol=1e-4)


def test_cars196_missing_variable_is_named(tmp_path):
    root = make_cars(tmp_path / "cars", class_names=False)
    with pytest.raises(DatasetError, match=r"cars_annos.mat lacks the variable\(s\) class_names; expected the CARS196"):
        load_dataset("cars196", data_root=root)


def test_cars196_class_out_of_range_is_named(tmp_path):
    root = make_cars(tmp_path / "cars", class_ids=(1, 2, 99, 197))
    with pytest.raises(DatasetError, match="cars_annos.mat: annotation 4 has class 197, outside 1-196"):
        load_dataset("cars196", data_root=root)


def test_cars196_annotation_without_fields_is_named(tmp_path):
    from scipy.io import savemat

    root = make_cars(tmp_path / "cars")
    records = np.zeros((1, 2), dtype=[("path", "O"), ("label", "O")])
    records[0, 0] = ("car_ims/000001.jpg", 1)
    records[0, 1] = ("car_ims/000002.jpg", 2)
    savemat(root / "cars_annos.mat", {"annotations": records, "class_names": np.array(["a", "b"], dtype=object)})
    with pytest.raises(DatasetError, match="annotation 1 lacks a relative_im_path string or an integer class"):
        load_dataset("cars196", data_root=root)


def test_cars196_unreadable_mat_file_is_named(tmp_path):
    root = tmp_path / "cars"
    root.mkdir()
    (root / "cars_annos.mat").write_bytes(b"\x00" * 200)
    with pytest.raises(DatasetError, match=r"cannot read .*cars_annos.mat as a MATLAB file"):
        load_dataset("cars196", data_root=root)


def test_cars196_missing_file_and_missing_images_are_named(tmp_path):
    with pytest.raises(DatasetError, match=r"cars196: no cars_annos.mat in .*; expected the CARS196 layout"):
        load_dataset("cars196", data_root=tmp_path)
    root = make_cars(tmp_path / "cars")
    (root / "car_ims/000007.jpg").unlink()
    with pytest.raises(DatasetError, match=r"listed in .*cars_annos.mat are missing, e.g. .*000007.jpg"):
        load_dataset("cars196", data_root=root)


# ---------------------------------------------------------------------------------------------------------------
# Stanford Online Products
# ---------------------------------------------------------------------------------------------------------------

SOP_HEADER = "image_id class_id super_class_id path"


def make_sop(root, train_rows=None, test_rows=None):
    root.mkdir(parents=True, exist_ok=True)
    train_rows = train_rows or [
        (1, 1, 1, "bicycle_final/111_0.JPG"),
        (2, 1, 1, "bicycle_final/111_1.JPG"),
        (3, 2, 1, "bicycle_final/222_0.JPG"),
        (4, 2, 1, "bicycle_final/222_1.JPG"),
    ]
    test_rows = test_rows or [
        (1, 3, 2, "chair_final/333_0.JPG"),
        (2, 3, 2, "chair_final/333_1.JPG"),
        (3, 4, 2, "chair_final/444_0.JPG"),
        (4, 4, 2, "chair_final/444_1.JPG"),
    ]
    for file_name, rows in (("Ebay_train.txt", train_rows), ("Ebay_test.txt", test_rows)):
        for row in rows:
            write_image(root / row[3], seed=row[1] * 10 + row[0], size=(24, 24))
        (root / file_name).write_text("\n".join([SOP_HEADER] + [" ".join(map(str, row)) for row in rows]) + "\n")
    return root


def test_sop_splits_by_file(tmp_path):
    make_sop(tmp_path / "Stanford_Online_Products")
    splits = load_dataset("sop", data_root=tmp_path, image_size=SIZE)
    assert splits.train.class_names == ["bicycle/1", "bicycle/2"]
    assert splits.test.class_names == ["chair/3", "chair/4"]
    assert splits.train.labels.tolist() == [0, 0, 1, 1] and splits.test.labels.tolist() == [0, 0, 1, 1]
    assert splits.test.paths[3] == tmp_path / "Stanford_Online_Products/chair_final/444_1.JPG"
    assert splits.info.name == "sop" and splits.train[3][0].shape == (3, SIZE, SIZE)


def test_sop_bad_header_is_named(tmp_path):
    root = make_sop(tmp_path / "sop")
    (root / "Ebay_test.txt").write_text("id class path\n1 3 chair_final/333_0.JPG\n")
    with pytest.raises(
        DatasetError, match="Ebay_test.txt: the first line must be the header 'image_id class_id super_class_id path'"
    ):
        load_dataset("sop", data_root=root)


def test_sop_malformed_line_is_named(tmp_path):
    root = make_sop(tmp_path / "sop")
    text = (
        (root / "Ebay_train.txt")
        .read_text()
        .replace("3 2 1 bicycle_final/222_0.JPG", "3 two 1 bicycle_final/222_0.JPG")
    )
    (root / "Ebay_train.txt").write_text(text)
    with pytest.raises(
        DatasetError, match=r"Ebay_train.txt, line 4: expected '<image_id> <class_id> <super_class_id> <path>'"
    ):
        load_dataset("sop", data_root=root)


def test_sop_missing_test_file_and_shared_classes_are_named(tmp_path):
    root = make_sop(tmp_path / "sop")
    (root / "Ebay_test.txt").unlink()
    with pytest.raises(
        DatasetError, match=r"missing file .*Ebay_test.txt; expected the Stanford_Online_Products layout"
    ):
        load_dataset("sop", data_root=root)
    root = make_sop(
        tmp_path / "sop2", test_rows=[(1, 2, 2, "chair_final/333_0.JPG"), (2, 3, 2, "chair_final/444_0.JPG")]
    )
    with pytest.raises(DatasetError, match=r"share class_id\(s\) \[2\]; their classes must be disjoint"):
        load_dataset("sop", data_root=root)


# ---------------------------------------------------------------------------------------------------------------
# folder:PATH and the registry
# ---------------------------------------------------------------------------------------------------------------


def make_folder(root, classes=("ants", "bees", "cats", "dogs")):
    for index, name in enumerate(classes):
        write_image(root / name / "a.JPG", seed=index, size=(20, 20))
        write_image(root / name / "b.png", seed=100 + index, size=(20, 20))
        write_image(root / name / "nested" / "c.WebP", seed=200 + index, size=(20, 20))
        (root / name / "notes.txt").write_text("not an image")
    write_image(root / ".hidden" / "x.png", seed=7)  # hidden folders are not classes
    write_image(root / "__MACOSX" / "y.png", seed=8)  # nor is macOS's zip residue
    (root / "empty").mkdir()  # a folder without images is not a class
    return root


def test_folder_splits_sorted_class_folders_in_halves(tmp_path):
    root = make_folder(tmp_path / "data")
    splits = load_dataset(f"folder:{root}", image_size=SIZE)
    assert splits.train.class_names == ["ants", "bees"] and splits.test.class_names == ["cats", "dogs"]
    assert [path.relative_to(root).as_posix() for path in splits.train.paths] == [
        "ants/a.JPG",
        "ants/b.png",
        "ants/nested/c.WebP",
        "bees/a.JPG",
        "bees/b.png",
        "bees/nested/c.WebP",
    ]
    assert splits.train.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert splits.info.name == f"folder:{root}" and splits.info.kind == "photo"
    np.testing.assert_allclose(splits.test[1][0].numpy(), reference_test_tensor(splits.test.paths[1]), atol=1e-4)


def test_folder_with_odd_class_count_trains_on_the_larger_half(tmp_path):
    root = make_folder(tmp_path / "data", classes=("a", "b", "c", "d", "e"))
    splits = load_dataset(f"folder:{root}", image_size=SIZE)
    assert splits.train.class_names == ["a", "b", "c"] and splits.test.class_names == ["d", "e"]


def test_relative_folder_is_taken_inside_data_root(tmp_path):
    make_folder(tmp_path / "data")
    splits = load_dataset("folder:data", data_root=tmp_path, image_size=SIZE)
    assert splits.test.class_names == ["cats", "dogs"]


def test_folder_with_too_few_classes_is_rejected(tmp_path):
    root = make_folder(tmp_path / "data", classes=("only", "two"))
    with pytest.raises(DatasetError, match=r"has 2 class sub-folder\(s\) with images \(found: only, two\); at least 4"):
        load_dataset(f"folder:{root}")
    with pytest.raises(DatasetError, match=r"has 0 class sub-folder\(s\) with images \(found: none\)"):
        load_dataset(f"folder:{tmp_path / 'data' / 'empty'}")


def test_a_folder_whose_test_classes_have_one_image_each_is_refused_at_load(tmp_path):
    """Knowable before training: no test query would have another image of its class, so the run would train to
    its end and fail there (retrieval_metrics finds nothing to score)."""
    root = tmp_path / "singles"
    for index, name in enumerate(("a", "b", "c", "d")):
        write_image(root / name / "only.png", seed=index, size=(20, 20))
    with pytest.raises(DatasetError, match=r"the test split \(the first half of the class folders by sorted name "
                                           r"train, the rest test\) has no class with two or more images \(its 2 "
                                           r"classes have one each\)"):
        load_dataset(f"folder:{root}", image_size=SIZE)
    write_image(root / "d" / "second.png", seed=9, size=(20, 20))  # one test class of two is enough to score
    assert load_dataset(f"folder:{root}", image_size=SIZE).test.labels.tolist() == [0, 1, 1]


def test_missing_folder_and_empty_folder_name_are_rejected(tmp_path):
    with pytest.raises(
        DatasetError, match=r"dataset folder .*absent does not exist or is not a folder; expected one sub-folder"
    ):
        load_dataset(f"folder:{tmp_path / 'absent'}")
    with pytest.raises(DatasetError, match="'folder:' names no folder"):
        load_dataset("folder:")


def test_unknown_dataset_lists_the_valid_names():
    with pytest.raises(
        DatasetError,
        match=r"unknown dataset 'mnist': use one of glyphs, glyphs-mini, glyphs-pretrain, glyphs-few, cub200, "
              r"cars196, sop, folder:PATH or hf:OWNER/NAME\[@REVISION\]",
    ):
        load_dataset("mnist")
    with pytest.raises(DatasetError, match="dataset name must be a string"):
        load_dataset(None)


def test_unknown_normalization_is_rejected(tmp_path):
    root = make_folder(tmp_path / "data")
    with pytest.raises(DatasetError, match="unknown normalization 'bgr': use one of imagenet, caffe"):
        load_dataset(f"folder:{root}", normalization="bgr")


def test_dataset_errors_are_value_errors():
    assert issubclass(DatasetError, ValueError)
