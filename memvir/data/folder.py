"""A dataset from a folder of class folders (`folder:PATH`): each sub-folder is a class, its images the samples."""

from pathlib import Path

from memvir.data.errors import DatasetError
from memvir.data.image_files import MIN_CLASSES_PER_SPLIT, photo_splits
from memvir.data.splits import DatasetSplits

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})
FOLDER_LAYOUT = (
    "one sub-folder per class holding its images (" + ", ".join(sorted(IMAGE_EXTENSIONS)) + ", any letter case)"
)


def _is_hidden(name: str) -> bool:
    # Dot files and the __MACOSX folder macOS adds to zips are neither classes nor images.
    return name.startswith(".") or name == "__MACOSX"


def class_folders(root: Path) -> list[tuple[str, list[Path]]]:
    """(class name, its image files) for each sub-folder of `root` that holds images, sorted by name.

    Images are found at any depth inside a class folder; sub-folders without images are not classes.
    """
    classes = []
    for folder in sorted(path for path in root.iterdir() if path.is_dir() and not _is_hidden(path.name)):
        images = sorted(
            path
            for path in folder.rglob("*")
            if path.suffix.lower() in IMAGE_EXTENSIONS
            and not any(_is_hidden(part) for part in path.relative_to(folder).parts)
            and path.is_file()
        )
        if images:
            classes.append((folder.name, images))
    return classes


def load_folder(path: str | Path, image_size: int, normalization: str, seed: int) -> DatasetSplits:
    """The classes of `path` split in halves by sorted name: the first half (rounded up) trains, the rest tests."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist or is not a folder; expected {FOLDER_LAYOUT}")
    classes = class_folders(root)
    needed = 2 * MIN_CLASSES_PER_SPLIT
    if len(classes) < needed:
        found = ", ".join(name for name, _ in classes) or "none"
        raise DatasetError(
            f"dataset folder {root} has {len(classes)} class sub-folder(s) with images (found: {found}); at least "
            f"{needed} are needed, as the first half of the classes trains and the second half tests, each with "
            f"at least {MIN_CLASSES_PER_SPLIT}. Expected {FOLDER_LAYOUT}"
        )
    num_train_classes = (len(classes) + 1) // 2
    paths = [image for _, images in classes for image in images]
    class_ids = [class_id for class_id, (_, images) in enumerate(classes) for _ in images]
    return photo_splits(
        f"folder:{path}",
        paths,
        class_ids,
        {class_id: name for class_id, (name, _) in enumerate(classes)},
        lambda class_id: class_id < num_train_classes,
        split_rule="the first half of the class folders by sorted name train, the rest test",
        image_size=image_size,
        normalization=normalization,
        seed=seed,
    )
