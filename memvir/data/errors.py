"""The one error type of the data package: bad names, missing or malformed datasets, unreadable images, bad zips."""


class DatasetError(ValueError):
    """A dataset cannot be loaded as asked; the message names the file or folder and what was expected there.

    A subclass of `ValueError`, so callers that catch bad input generally (the CLI, the app) need not know it.
    """
