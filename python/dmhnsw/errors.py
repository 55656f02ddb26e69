"""Exceptions raised by :class:`dmhnsw.Client` in place of ``grpc.RpcError``."""

from __future__ import annotations

from typing import Any, Optional

import grpc

__all__ = [
    "DmhnswError",
    "InvalidArgument",
    "Unauthenticated",
    "Unavailable",
    "from_rpc_error",
]


class DmhnswError(Exception):
    """Base class of every error the client raises for a failed call.

    ``str(e)`` is the server's message (the gRPC status details); ``e.code`` is the
    ``grpc.StatusCode`` of the call. Codes without a subclass of their own (DEADLINE_EXCEEDED,
    INTERNAL, UNIMPLEMENTED, ...) are raised as ``DmhnswError`` itself.
    """

    #: the code a subclass stands for; the base class takes it from the call
    default_code: Optional[grpc.StatusCode] = None

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.code: grpc.StatusCode = (
            code if code is not None else (self.default_code or grpc.StatusCode.UNKNOWN)
        )
        self.details: str = message

    def __str__(self) -> str:
        return self.details

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.details!r}, code={self.code})"


class InvalidArgument(DmhnswError, ValueError):
    """INVALID_ARGUMENT: a malformed request; the message names the field.

    Also raised by the client itself, before any call, for arguments it can check alone (an
    array that is not 1-D or 2-D, a k below 1, ids that do not match the vectors, ...). It is a
    ``ValueError`` too.
    """

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class Unauthenticated(DmhnswError):
    """UNAUTHENTICATED: the call carried no cluster token, or a wrong one."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(DmhnswError):
    """UNAVAILABLE: the server cannot be reached (or is shutting down)."""

    default_code = grpc.StatusCode.UNAVAILABLE


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}


def from_rpc_error(error: Any) -> DmhnswError:
    """The :class:`DmhnswError` for a failed call.

    ``error`` is a ``grpc.RpcError`` as raised by a unary call (it is also a ``grpc.Call``,
    with ``code()`` and ``details()``); anything lacking those methods maps to a
    ``DmhnswError`` with code UNKNOWN and ``str(error)`` as message.
    """
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code = code_fn() if callable(code_fn) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details = details_fn() if callable(details_fn) else None
    if not details:
        details = str(error) if not callable(code_fn) else code.name
    cls = _BY_CODE.get(code, DmhnswError)
    return cls(str(details), code)
