"""The client of the dmhnsw search service (``computenode serve``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Tuple, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from . import _convert
from .errors import DmhnswError, InvalidArgument, Unavailable, from_rpc_error

try:
    from ._proto import dmhnsw_pb2, dmhnsw_pb2_grpc
except ImportError as _exc:  # a source tree that was never built
    raise ImportError(
        "dmhnsw: the gRPC stubs (dmhnsw._proto.dmhnsw_pb2) are missing; they are generated "
        "when the package is built: `pip install ./python` (or `pip install -e ./python`) "
        "from the repository root. If this is a source checkout shadowing an installed copy, "
        f"run from another directory. ({_exc})"
    ) from _exc

__all__ = ["Client", "Info"]

_T = TypeVar("_T")

_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_DEFAULT_OPTIONS: Tuple[Tuple[str, Any], ...] = (
    # a batch of results or vectors can exceed gRPC's default 4 MiB receive limit
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
)


@dataclasses.dataclass(frozen=True)
class Info:
    """What the service serves (``InfoResponse``)."""

    mode: str
    """``"shine"`` or ``"dhnsw"``."""
    dim: int
    """The index's dimension: every query and vector must have it."""
    metric: str
    """``"l2"`` (distances are squared L2) or ``"ip"`` (distances are negated inner products)."""
    count: int
    """Vectors in the index."""
    memnodes: int
    """Memory nodes the index lives on."""
    epoch: int
    """dhnsw: the index's epoch (online rebuilds); shine: 0."""
    provider: str
    """The transport provider (``shm``, ``tcp``, ``verbs``, ``cxl``)."""
    max_k: int
    """Largest k a search accepts."""
    max_batch: int
    """Most queries (search) or vectors (insert) per request."""
    computenode: int
    """Id of the computenode answering."""
    deleted: int = 0
    """Deleted vectors that still guide searches (not in ``count``): shine records not reused
    yet, dhnsw tombstones until the next rebuild."""
    ids: bool = False
    """The index has an id index (any ids, :meth:`Client.delete`, upserts)."""
    codes: str = "none"
    """The index's compressed vectors: ``"none"``, ``"sq8"`` or ``"pq:M"`` (M bytes per vector).
    With codes, :meth:`Client.search` takes a ``rerank``."""
    rerank: int = 0
    """The server's ``--rerank``: what a search without ``rerank`` uses (0: full vectors)."""

    @classmethod
    def from_proto(cls, message: Any) -> "Info":
        """An :class:`Info` from a ``dmhnsw.v1.InfoResponse``."""
        return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class SnapshotImage:
    """One memnode's image written by :meth:`Client.snapshot` (``SnapshotImage``)."""

    memnode: int
    path: str
    """Absolute path of the image on the memnode's host (``memnode --load PATH`` serves it)."""
    file_bytes: int
    checksum: int


class Client:
    """A connection to one ``computenode serve`` endpoint.

    Args:
        target: ``"host:port"`` of the service (any gRPC target string). The channel is
            plaintext (no TLS).
        token: the cluster token, sent with every call as metadata ``dmhnsw-token``. When None,
            ``$DMHNSW_TOKEN`` is used if set; an empty string sends no token.
        timeout: default deadline of each call in seconds (None: no deadline). Every method
            takes a ``timeout`` of its own that overrides it.
        options: extra gRPC channel options, appended to the client's (which lift the 4 MiB
            message size limits).

    The channel connects lazily: constructing a client never fails on an unreachable
    server; the first call raises :class:`dmhnsw.Unavailable` instead. A client is safe to
    share between threads. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        target: str,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
        *,
        options: Optional[Sequence[Tuple[str, Any]]] = None,
    ) -> None:
        self.target: str = target
        self.timeout: Optional[float] = timeout
        self._metadata = _convert.metadata(_convert.resolve_token(token))
        self._channel: grpc.Channel = grpc.insecure_channel(
            target, options=list(_DEFAULT_OPTIONS) + list(options or ())
        )
        self._stub = dmhnsw_pb2_grpc.SearchStub(self._channel)
        self._health = self._channel.unary_unary(_HEALTH_CHECK)  # bytes in, bytes out
        self._closed = False

    # --- calls -------------------------------------------------------------------------------

    def search(
        self,
        queries: npt.ArrayLike,
        k: int,
        ef: Optional[int] = None,
        probe: Optional[int] = None,
        rerank: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """The k nearest neighbours of each query.

        Args:
            queries: an n x dim array (a 1-D array is one query), converted to contiguous
                little-endian float32. NaN and infinities are sent as they are.
            k: neighbours per query, 1 .. ``info().max_k``.
            ef: the search's candidate list size (ef_search); None or 0: the server's
                ``--ef-search``.
            probe: dhnsw: partitions searched per query; None or 0: the server's ``--probe``.
            rerank: an index with codes (:attr:`Info.codes`): traverse on the codes and re-read
                the best ``rerank`` candidates exactly (at most 1024); None or 0: the server's
                ``--rerank`` (:attr:`Info.rerank`; 0 there: full vectors throughout). The server
                refuses it on an index without codes, and a dhnsw server any but its own.
            timeout: deadline of this call in seconds (default: the client's).

        Returns:
            ``(ids, distances)``: an int64 n x k array (-1 where fewer than k neighbours were
            found) and a float32 n x k array (squared L2, or negated inner product with metric
            ``ip``), both ordered nearest first as the server returns them. With n == 0 no call
            is made and both are empty n x k arrays.

        Raises:
            InvalidArgument: a malformed request (checked here or by the server).
            Unauthenticated, Unavailable, DmhnswError: see :mod:`dmhnsw.errors`.
        """
        request, n, k = self._search_request(queries, k, ef, probe, rerank)
        if n == 0:
            return np.empty((0, k), dtype=np.int64), np.empty((0, k), dtype=np.float32)
        response = self._call(self._stub.Search, request, timeout)
        return self._search_result(response, n, k)

    def insert(
        self,
        vectors: npt.ArrayLike,
        ids: Any,
        *,
        timeout: Optional[float] = None,
    ) -> int:
        """Adds vectors to the index under the given ids.

        Args:
            vectors: an n x dim array (a 1-D array is one vector), sent as float32.
            ids: n distinct integer ids 0 .. 2**63 - 1, none already in the index (a plain int
                for one vector). If one is, the request is refused naming it and nothing is
                inserted.
            timeout: deadline of this call in seconds (default: the client's).

        Returns:
            The number of vectors the server inserted. With n == 0 no call is made and 0 is
            returned.

        Raises:
            InvalidArgument: a malformed request (checked here or by the server).
            Unauthenticated, Unavailable, DmhnswError: see :mod:`dmhnsw.errors`.
        """
        request, n = self._insert_request(vectors, ids)
        if n == 0:
            return 0
        response = self._call(self._stub.Insert, request, timeout)
        return int(response.inserted)

    def upsert(
        self,
        vectors: npt.ArrayLike,
        ids: Any,
        *,
        timeout: Optional[float] = None,
    ) -> int:
        """Inserts vectors under the given ids, replacing the vector of an id the index holds.

        Once this returns, a search never sees an id's old vector (the index needs an id index,
        :attr:`Info.ids`; a dhnsw upsert waits for a running rebuild).

        Args:
            vectors: an n x dim array (a 1-D array is one vector), sent as float32.
            ids: n distinct integer ids 0 .. 2**63 - 1 (a plain int for one vector).
            timeout: deadline of this call in seconds (default: the client's).

        Returns:
            How many of the ids were in the index (their vectors replaced); the others were
            inserted. With n == 0 no call is made and 0 is returned.

        Raises:
            InvalidArgument: a malformed request, or an index without deletes.
            Unauthenticated, Unavailable, DmhnswError: see :mod:`dmhnsw.errors`.
        """
        request, n = self._insert_request(vectors, ids)
        if n == 0:
            return 0
        request.upsert = True
        response = self._call(self._stub.Insert, request, timeout)
        return int(response.replaced)

    def delete(self, ids: Any, *, timeout: Optional[float] = None) -> np.ndarray:
        """Deletes the vectors of the given ids; a search never returns them once this returns.

        Args:
            ids: distinct integer ids (a plain int for one).
            timeout: deadline of this call in seconds (default: the client's).

        Returns:
            The ids that were not in the index (int64 array, in the order given; empty when
            every id was deleted). An unknown id is not an error.

        Raises:
            InvalidArgument: a malformed request, or an index without deletes.
            Unauthenticated, Unavailable, DmhnswError: see :mod:`dmhnsw.errors`.
        """
        try:
            count = int(np.asarray(ids).size)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"ids: not an integer array: {exc}") from None
        id_array = _convert.as_ids(ids, count)
        if id_array.size == 0:
            return np.zeros(0, dtype=np.int64)
        request = dmhnsw_pb2.DeleteRequest()
        request.ids.extend(id_array.tolist())
        response = self._call(self._stub.Delete, request, timeout)
        return np.asarray(response.not_found, dtype=np.int64)

    def snapshot(
        self, dir: str, *, wait_seconds: int = 0, timeout: Optional[float] = None
    ) -> list:
        """Stores the live index: every memnode writes its region to ``dir/memnode-<id>.img``.

        Writes pause cluster-wide while the images are written (searches go on); the images
        hold every insert, upsert and delete acknowledged before this call. ``dir`` is on each
        memnode's host, inside its ``--store-dir``; ``memnode --load`` serves an image.

        Args:
            dir: the memnodes' directory for the images.
            wait_seconds: how long the service waits for every writer to pause (0: 60).
            timeout: deadline of this call in seconds (default: the client's).

        Returns:
            A list of :class:`SnapshotImage`, one per memnode.
        """
        if not dir:
            raise InvalidArgument("dir: empty")
        request = dmhnsw_pb2.SnapshotRequest(dir=dir, wait_seconds=int(wait_seconds))
        response = self._call(self._stub.Snapshot, request, timeout)
        return [
            SnapshotImage(i.memnode, i.path, i.file_bytes, i.checksum) for i in response.images
        ]

    def info(self, *, timeout: Optional[float] = None) -> Info:
        """What the service serves: mode, dim, metric, count, limits (see :class:`Info`)."""
        response = self._call(self._stub.Info, dmhnsw_pb2.InfoRequest(), timeout)
        return Info.from_proto(response)

    def health(self, *, timeout: Optional[float] = None) -> bool:
        """Whether the server reports SERVING on the standard ``grpc.health.v1`` service.

        Returns False when the server answers NOT_SERVING (or any status but SERVING), cannot
        be reached (UNAVAILABLE) or does not answer in time (DEADLINE_EXCEEDED). Other failures
        (UNAUTHENTICATED, UNIMPLEMENTED when the server has no health service, ...) raise.
        """
        try:
            raw = self._call(self._health, _convert.encode_health_request(""), timeout)
        except DmhnswError as exc:
            if exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False
            raise
        return _convert.decode_health_response(raw) == _convert.HEALTH_SERVING

    # --- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; later calls raise ``ValueError``. Closing twice is harmless."""
        if not self._closed:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Client({self.target!r}, {state})"

    # --- helpers (no I/O) --------------------------------------------------------------------

    @staticmethod
    def _search_request(
        queries: npt.ArrayLike,
        k: int,
        ef: Optional[int],
        probe: Optional[int],
        rerank: Optional[int] = None,
    ) -> Tuple[Any, int, int]:
        """``(SearchRequest, n, k)`` for the arguments of :meth:`search`, checked."""
        k = _convert.uint32_arg(k, "k", 1)
        ef_search = 0 if ef is None else _convert.uint32_arg(ef, "ef", 0)
        probe_n = 0 if probe is None else _convert.uint32_arg(probe, "probe", 0)
        rerank_n = 0 if rerank is None else _convert.uint32_arg(rerank, "rerank", 0)
        matrix, n, dim = _convert.as_matrix(queries, "queries")
        request = dmhnsw_pb2.SearchRequest(
            vectors=matrix.tobytes(),
            dim=dim,
            k=k,
            ef_search=ef_search,
            probe=probe_n,
            rerank=rerank_n,
        )
        return request, n, k

    @staticmethod
    def _insert_request(vectors: npt.ArrayLike, ids: Any) -> Tuple[Any, int]:
        """``(InsertRequest, n)`` for the arguments of :meth:`insert`, checked."""
        matrix, n, dim = _convert.as_matrix(vectors, "vectors")
        id_array = _convert.as_ids(ids, n)
        request = dmhnsw_pb2.InsertRequest(vectors=matrix.tobytes(), dim=dim)
        request.ids.extend(id_array.tolist())
        return request, n

    @staticmethod
    def _search_result(response: Any, n: int, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The (ids, distances) arrays of a SearchResponse, checked against the request."""
        if response.n != n or response.k != k:
            raise DmhnswError(
                f"malformed SearchResponse: n={response.n} k={response.k} for a request of "
                f"{n} queries with k={k}",
                grpc.StatusCode.INTERNAL,
            )
        ids = np.array(response.ids, dtype=np.int64)
        distances = np.array(response.distances, dtype=np.float32)
        if ids.size != n * k or distances.size != n * k:
            raise DmhnswError(
                f"malformed SearchResponse: {ids.size} ids and {distances.size} distances "
                f"for n={n} x k={k}",
                grpc.StatusCode.INTERNAL,
            )
        return ids.reshape(n, k), distances.reshape(n, k)

    def _call(self, method: Callable[..., _T], request: Any, timeout: Optional[float]) -> _T:
        if self._closed:
            raise ValueError("dmhnsw: the client is closed")
        try:
            return method(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata or None,
            )
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            if error.code == grpc.StatusCode.UNAVAILABLE and "HTTP/2" in error.details:
                # What answers there is no gRPC server: a memnode's control port, most often.
                error = Unavailable(
                    f"{self.target} does not answer gRPC ({error.details}): is it a memnode's port? "
                    "The client talks to `computenode serve`, at its --listen address "
                    "(default 127.0.0.1:7700)",
                    error.code,
                )
            raise error from exc
