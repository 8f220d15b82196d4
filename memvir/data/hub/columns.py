"""Which column holds the images and which the classes: the dataset's one `Image` feature and its one `ClassLabel`
feature, unless the user names them (`--image-column`, `--label-column`). A label column of strings or integers is
fine too: its distinct values, sorted, are the classes."""

import numpy as np

from memvir.data.errors import DatasetError

_LABEL_DTYPES = ("string", "large_string", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _kind(feature) -> str:
    """A feature's type as the user reads it in the refusal (`Image`, `ClassLabel`, `Value(string)`...)."""
    dtype = getattr(feature, "dtype", None)
    name = type(feature).__name__
    return f"{name}({dtype})" if name == "Value" else name


def _listing(features) -> str:
    return ", ".join(f"{column} ({_kind(feature)})" for column, feature in features.items()) or "none"


def _is_image(feature) -> bool:
    return type(feature).__name__ == "Image"


def _is_class_label(feature) -> bool:
    return type(feature).__name__ == "ClassLabel"


def _is_label_values(feature) -> bool:
    return type(feature).__name__ == "Value" and feature.dtype in _LABEL_DTYPES


def pick_columns(features, image_column: str | None, label_column: str | None, where: str) -> tuple[str, str]:
    """(image column, label column) of a dataset with `features` (a 🤗 datasets Features mapping); DatasetError
    naming the columns there are, and the flag to pass, when a named column is missing or of the wrong type, or when
    none or several columns could be the one."""
    columns = f"its columns: {_listing(features)}"

    def named(column, fits, wanted, flag):
        if column not in features:
            raise DatasetError(f"{where} has no column {column!r} ({flag}); {columns}")
        if not fits(features[column]):
            raise DatasetError(f"{where}: column {column!r} is {_kind(features[column])}, not {wanted} ({flag}); "
                               f"{columns}")
        return column

    def found(fits, wanted, flag):
        candidates = [column for column, feature in features.items() if fits(feature)]
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            raise DatasetError(f"{where} has no {wanted} column; name the one to use with {flag}. {columns}")
        raise DatasetError(f"{where} has {len(candidates)} {wanted} columns ({', '.join(candidates)}); name the one "
                           f"to use with {flag}")

    image = (named(image_column, _is_image, "an Image", "--image-column") if image_column
             else found(_is_image, "Image", "--image-column"))
    label = (named(label_column, lambda f: _is_class_label(f) or _is_label_values(f),
                   "a ClassLabel or a column of strings or integers", "--label-column") if label_column
             else found(_is_class_label, "ClassLabel", "--label-column (a ClassLabel, or strings or integers)"))
    if image == label:
        raise DatasetError(f"{where}: the image and the label column are both {image!r}; name two columns")
    return image, label


def class_ids(values: list, feature) -> tuple[np.ndarray, dict[int, str]]:
    """(class id per row, -1 where a row has no label; the class names by id) of a label column's `values`.

    A ClassLabel's ids are its own (its names in its order: "label order"); a column of strings or integers gets ids
    in the sorted order of its distinct values. A ClassLabel's -1 and a missing value mean no label.
    """
    if _is_class_label(feature):
        ids = np.array([-1 if value is None else value for value in values], dtype=np.int64)
        return ids, dict(enumerate(feature.names))
    distinct = sorted({value for value in values if value is not None})
    id_of = {value: class_id for class_id, value in enumerate(distinct)}
    ids = np.array([id_of.get(value, -1) if value is not None else -1 for value in values], dtype=np.int64)
    return ids, {class_id: str(value) for value, class_id in id_of.items()}
