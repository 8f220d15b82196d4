"""Loaders for the three DML benchmarks in their published layouts: CUB-200-2011, CARS196 and Stanford Online Products.

Each follows the conventional zero-shot protocol: classes, not images, are split. CUB200: classes 1-100 train,
101-200 test. CARS196: classes 1-98 train, 99-196 test (the file's own train/test flag splits images, not classes,
and is ignored). SOP: the classes of Ebay_train.txt train, those of Ebay_test.txt test. Nothing is downloaded.
"""

from pathlib import Path

from memvir.data.errors import DatasetError
from memvir.data.image_files import check_files_exist, photo_splits
from memvir.data.splits import DatasetSplits

CUB_LAYOUT = (
    "the CUB_200_2011 layout: images.txt ('<image_id> <path>'), image_class_labels.txt ('<image_id> <class_id>'), "
    "classes.txt ('<class_id> <name>') and the images under images/<path>"
)
CARS_LAYOUT = (
    "the CARS196 layout: cars_annos.mat (a struct array 'annotations' with fields relative_im_path, class (1-based) "
    "and test, and a cell array 'class_names') beside the car_ims/ folder it refers to"
)
SOP_LAYOUT = (
    "the Stanford_Online_Products layout: Ebay_train.txt and Ebay_test.txt, each with the header "
    "'image_id class_id super_class_id path' and one image per line, paths relative to that folder"
)
CUB_TRAIN_CLASSES = 100  # classes 1-100
CARS_TRAIN_CLASSES = 98  # classes 1-98


def _find_root(data_root: str | Path | None, name: str, marker: str, layout: str, archive_folder: str = "") -> Path:
    """The folder holding `marker`: data_root itself or, when given, its `archive_folder` (as the archive unpacks)."""
    if data_root is None:
        raise DatasetError(f"dataset {name!r} needs data_root: the folder that holds {layout}")
    root = Path(data_root).expanduser()
    candidates = [root, root / archive_folder] if archive_folder else [root]
    for candidate in candidates:
        if (candidate / marker).is_file():
            return candidate
    searched = " or ".join(str(candidate) for candidate in candidates)
    raise DatasetError(f"{name}: no {marker} in {searched}; expected {layout}")


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _read_rows(path: Path, columns: tuple[str, ...], int_columns: int, layout: str, header: bool = False) -> list:
    """The rows of a whitespace-separated text file; the first `int_columns` columns are parsed as integers.

    The last column takes the rest of the line (file paths). Blank lines are skipped; any other line that does not
    fit raises a DatasetError naming the file, the line number and the expected format.
    """
    if not path.is_file():
        raise DatasetError(f"missing file {path}; expected {layout}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DatasetError(f"cannot read {path}: {error}") from error
    expected = " ".join(f"<{column}>" for column in columns)
    first_line = 1
    if header:
        if not lines or lines[0].split() != list(columns):
            found = lines[0] if lines else "an empty file"
            raise DatasetError(f"{path}: the first line must be the header '{' '.join(columns)}', found {found!r}")
        first_line = 2
    rows = []
    for line_number, line in enumerate(lines[first_line - 1 :], start=first_line):
        if not line.strip():
            continue
        fields = line.split(maxsplit=len(columns) - 1)
        integers = [_as_int(field) for field in fields[:int_columns]]
        if len(fields) != len(columns) or None in integers:
            raise DatasetError(f"{path}, line {line_number}: expected '{expected}', found {line!r}")
        rows.append(integers + fields[int_columns:])
    return rows


def _id_table(path: Path, columns: tuple[str, str], value_is_int: bool, layout: str) -> dict[int, int | str]:
    """A two-column file '<id> <value>' as a dict; a repeated id raises a DatasetError."""
    table: dict[int, int | str] = {}
    for key, value in _read_rows(path, columns, 2 if value_is_int else 1, layout):
        if key in table:
            raise DatasetError(f"{path}: id {key} appears twice; each {columns[0]} must be listed once")
        table[key] = value
    return table


def load_cub200(data_root, image_size: int, normalization: str, seed: int) -> DatasetSplits:
    """CUB-200-2011 from data_root (the CUB_200_2011 folder or its parent): classes 1-100 train, 101-200 test."""
    root = _find_root(data_root, "cub200", "images.txt", CUB_LAYOUT, archive_folder="CUB_200_2011")
    image_paths = _id_table(root / "images.txt", ("image_id", "path"), False, CUB_LAYOUT)
    image_classes = _id_table(root / "image_class_labels.txt", ("image_id", "class_id"), True, CUB_LAYOUT)
    class_names = _id_table(root / "classes.txt", ("class_id", "name"), False, CUB_LAYOUT)
    paths, class_ids = [], []
    for image_id, relative_path in image_paths.items():
        if image_id not in image_classes:
            raise DatasetError(f"{root / 'image_class_labels.txt'}: no class for image_id {image_id} of images.txt")
        class_id = image_classes[image_id]
        if class_id not in class_names:
            raise DatasetError(f"{root / 'classes.txt'}: class_id {class_id} (of image_id {image_id}) is not listed")
        paths.append(root / "images" / relative_path)
        class_ids.append(class_id)
    check_files_exist(paths, str(root / "images.txt"))
    return photo_splits(
        "cub200",
        paths,
        class_ids,
        class_names,
        lambda class_id: class_id <= CUB_TRAIN_CLASSES,
        split_rule="classes 1-100 train, 101-200 test",
        image_size=image_size,
        normalization=normalization,
        seed=seed,
    )


def _read_cars_annotations(mat_path: Path) -> tuple[list[str], list[int], list[str]]:
    """(relative image paths, class ids, class names) from cars_annos.mat."""
    try:
        from scipy.io import loadmat  # imported here: scipy is needed for CARS196 only
        from scipy.io.matlab import MatReadError
    except ImportError as error:
        raise DatasetError("reading cars196's cars_annos.mat needs scipy: pip install scipy") from error
    try:
        contents = loadmat(mat_path, simplify_cells=True)
    except (MatReadError, OSError, ValueError, TypeError, NotImplementedError) as error:
        raise DatasetError(f"cannot read {mat_path} as a MATLAB file: {error}; expected {CARS_LAYOUT}") from error
    missing = [key for key in ("annotations", "class_names") if key not in contents]
    if missing:
        raise DatasetError(f"{mat_path} lacks the variable(s) {', '.join(missing)}; expected {CARS_LAYOUT}")
    annotations, class_names = contents["annotations"], contents["class_names"]
    # simplify_cells returns a lone struct as a dict and a lone string as a str, not as one-element lists.
    annotations = [annotations] if isinstance(annotations, dict) else list(annotations)
    class_names = [class_names] if isinstance(class_names, str) else [str(name) for name in class_names]
    relative_paths, class_ids = [], []
    for index, annotation in enumerate(annotations):
        try:
            relative_paths.append(str(annotation["relative_im_path"]))
            class_ids.append(int(annotation["class"]))
        except (KeyError, TypeError, ValueError):
            raise DatasetError(
                f"{mat_path}: annotation {index + 1} lacks a relative_im_path string or an integer class; "
                f"expected {CARS_LAYOUT}"
            ) from None
        if not 1 <= class_ids[-1] <= len(class_names):
            raise DatasetError(
                f"{mat_path}: annotation {index + 1} has class {class_ids[-1]}, outside 1-{len(class_names)} "
                "(the number of class_names)"
            )
    return relative_paths, class_ids, class_names


def load_cars196(data_root, image_size: int, normalization: str, seed: int) -> DatasetSplits:
    """CARS196 from data_root (the folder with cars_annos.mat): classes 1-98 train, 99-196 test."""
    root = _find_root(data_root, "cars196", "cars_annos.mat", CARS_LAYOUT)
    mat_path = root / "cars_annos.mat"
    relative_paths, class_ids, class_names = _read_cars_annotations(mat_path)
    paths = [root / relative_path for relative_path in relative_paths]
    check_files_exist(paths, str(mat_path))
    return photo_splits(
        "cars196",
        paths,
        class_ids,
        {class_id: name for class_id, name in enumerate(class_names, start=1)},
        lambda class_id: class_id <= CARS_TRAIN_CLASSES,
        split_rule="classes 1-98 train, 99-196 test",
        image_size=image_size,
        normalization=normalization,
        seed=seed,
    )


def load_sop(data_root, image_size: int, normalization: str, seed: int) -> DatasetSplits:
    """Stanford Online Products from data_root (the Stanford_Online_Products folder or its parent).

    The classes of Ebay_train.txt train and those of Ebay_test.txt test. SOP has no class names: a class is named
    by its super-class folder and id, e.g. "bicycle/1".
    """
    root = _find_root(data_root, "sop", "Ebay_train.txt", SOP_LAYOUT, archive_folder="Stanford_Online_Products")
    columns = ("image_id", "class_id", "super_class_id", "path")
    paths, class_ids, class_names = [], [], {}
    class_ids_by_file = {}
    for file_name in ("Ebay_train.txt", "Ebay_test.txt"):
        rows = _read_rows(root / file_name, columns, 3, SOP_LAYOUT, header=True)
        for _, class_id, _, relative_path in rows:
            paths.append(root / relative_path)
            class_ids.append(class_id)
            class_names[class_id] = f"{relative_path.split('/')[0].removesuffix('_final')}/{class_id}"
        class_ids_by_file[file_name] = {row[1] for row in rows}
    shared = class_ids_by_file["Ebay_train.txt"] & class_ids_by_file["Ebay_test.txt"]
    if shared:
        raise DatasetError(
            f"{root}: Ebay_train.txt and Ebay_test.txt share class_id(s) {sorted(shared)[:5]}; their classes must "
            "be disjoint"
        )
    check_files_exist(paths, f"{root / 'Ebay_train.txt'} or Ebay_test.txt")
    train_ids = class_ids_by_file["Ebay_train.txt"]
    return photo_splits(
        "sop",
        paths,
        class_ids,
        class_names,
        lambda class_id: class_id in train_ids,
        split_rule="the classes of Ebay_train.txt train, those of Ebay_test.txt test",
        image_size=image_size,
        normalization=normalization,
        seed=seed,
    )
