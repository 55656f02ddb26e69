"""Python client of the dmhnsw search service (``computenode serve``).

>>> import numpy as np, dmhnsw
>>> with dmhnsw.Client("127.0.0.1:7700") as client:          # doctest: +SKIP
...     info = client.info()
...     ids, distances = client.search(np.random.rand(4, info.dim), k=10)

See README.md beside this package for the API and the errors.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._convert import TOKEN_ENV, TOKEN_METADATA_KEY
from .client import Client, Info, SnapshotImage
from .errors import DmhnswError, InvalidArgument, Unauthenticated, Unavailable

__all__ = [
    "Client",
    "Info",
    "SnapshotImage",
    "DmhnswError",
    "InvalidArgument",
    "Unauthenticated",
    "Unavailable",
    "TOKEN_ENV",
    "TOKEN_METADATA_KEY",
    "__version__",
]
