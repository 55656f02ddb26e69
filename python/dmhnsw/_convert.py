"""Client-side conversions: numpy arrays to wire bytes, ids, call metadata, health messages.

Everything here works without a server; the client calls it before each RPC.

What the client checks itself (raising :class:`dmhnsw.InvalidArgument` before any call) is
only what it can know alone: shapes, dtypes, integer ranges of the wire fields, the number of
ids against the number of vectors. What depends on the index (dim, k against max_k, the batch
size against max_batch, ids already present) and the values themselves are the server's to
check: NaN and infinities are sent as they are (float64 values beyond float32's range become
infinities in the conversion), and the server refuses what it does not accept.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Optional, Tuple

import numpy as np
import numpy.typing as npt

from .errors import DmhnswError, InvalidArgument

__all__ = [
    "TOKEN_ENV",
    "TOKEN_METADATA_KEY",
    "as_matrix",
    "as_ids",
    "uint32_arg",
    "resolve_token",
    "metadata",
    "encode_health_request",
    "decode_health_response",
    "HEALTH_SERVING",
]

#: the metadata key of the cluster token on every call
TOKEN_METADATA_KEY = "dmhnsw-token"
#: the environment variable read when ``Client(token=None)``
TOKEN_ENV = "DMHNSW_TOKEN"

_UINT32_MAX = 2**32 - 1
_INT64_MAX = 2**63 - 1
_WIRE_FLOAT = np.dtype("<f4")


def as_matrix(values: npt.ArrayLike, name: str) -> Tuple[np.ndarray, int, int]:
    """``(matrix, n, dim)``: ``values`` as a C-contiguous little-endian float32 n x dim array.

    A 1-D array is one row. Integer and floating arrays (or nested sequences of numbers) are
    accepted and converted; bool, complex, object and string arrays, arrays of other ranks and
    rows of length 0 raise :class:`InvalidArgument`. n may be 0. The values are not inspected:
    NaN and infinities are sent as they are.
    """
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError) as exc:  # ragged nested lists and the like
        raise InvalidArgument(f"{name}: not a numeric array: {exc}") from None
    if arr.dtype.kind not in "iuf":
        raise InvalidArgument(
            f"{name}: expected an integer or floating array, got dtype {arr.dtype}"
        )
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    elif arr.ndim != 2:
        raise InvalidArgument(
            f"{name}: expected a 1-D (one vector) or 2-D (n x dim) array, got shape {arr.shape}"
        )
    n, dim = (int(s) for s in arr.shape)
    if dim == 0:
        raise InvalidArgument(f"{name}: vectors of dimension 0 (shape {arr.shape})")
    if dim > _UINT32_MAX:
        raise InvalidArgument(f"{name}: dimension {dim} does not fit the wire's uint32 dim")
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf: sent as is
        matrix = np.ascontiguousarray(arr, dtype=_WIRE_FLOAT)
    return matrix, n, dim


def as_ids(ids: Any, n: int) -> np.ndarray:
    """``ids`` as a 1-D int64 array of length n.

    A scalar is accepted for n == 1. Integer dtypes only (no floats, no bools); uint64 values
    beyond int64 raise. Distinctness and presence in the index are the server's to check.
    """
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"ids: not an integer array: {exc}") from None
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidArgument(f"ids: expected a 1-D sequence of integers, got shape {arr.shape}")
    if arr.size == 0 and arr.dtype.kind == "f":  # [] becomes float64
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidArgument(f"ids: expected integers, got dtype {arr.dtype}")
    if arr.shape[0] != n:
        raise InvalidArgument(f"ids: {arr.shape[0]} ids for {n} vectors")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
        raise InvalidArgument("ids: a value does not fit int64")
    return arr.astype(np.int64, copy=False)


def uint32_arg(value: Any, name: str, minimum: int) -> int:
    """An integer argument checked against ``minimum .. 2**32 - 1`` (the wire's uint32)."""
    if isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{name}: expected an integer, got a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise InvalidArgument(
            f"{name}: expected an integer, got {type(value).__name__}"
        ) from None
    if not minimum <= number <= _UINT32_MAX:
        raise InvalidArgument(f"{name}: {number} is outside {minimum} .. {_UINT32_MAX}")
    return number


def resolve_token(token: Optional[str]) -> Optional[str]:
    """The token to send: ``token`` when not None, else ``$DMHNSW_TOKEN``; "" means none.

    Trimmed as the dmhnsw processes trim theirs (its first line, without trailing blanks), so
    the same token given to ``serve`` in a file and to the client in the variable matches."""
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    if token:
        token = token.split("\n", 1)[0].rstrip(" \t\r")
    return token or None


def metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """Call metadata carrying ``token`` (already resolved) under ``dmhnsw-token``."""
    if not token:
        return ()
    return ((TOKEN_METADATA_KEY, token),)


# --- grpc.health.v1 without generated code --------------------------------------------------
# HealthCheckRequest { string service = 1; }
# HealthCheckResponse { ServingStatus status = 1; }  UNKNOWN 0, SERVING 1, NOT_SERVING 2,
#                                                    SERVICE_UNKNOWN 3


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DmhnswError("health: malformed HealthCheckResponse")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def encode_health_request(service: str = "") -> bytes:
    """A serialized grpc.health.v1.HealthCheckRequest ("" asks about the whole server)."""
    raw = service.encode("utf-8")
    if not raw:
        return b""
    return b"\x0a" + _varint(len(raw)) + raw


def decode_health_response(data: bytes) -> int:
    """The ``status`` of a serialized grpc.health.v1.HealthCheckResponse (0 when absent)."""
    status = 0
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            if field == 1:
                status = value
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise DmhnswError("health: malformed HealthCheckResponse")
        if pos > len(data):
            raise DmhnswError("health: malformed HealthCheckResponse")
    return status


#: HealthCheckResponse.ServingStatus.SERVING
HEALTH_SERVING = 1
