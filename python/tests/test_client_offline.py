"""Tests of the dmhnsw client that need no server.

They cover what the client does alone: array conversion and checks, the request messages it
builds, the token metadata, the health message codec and the mapping of gRPC errors to the
dmhnsw exceptions. Tests against a real ``computenode serve`` live elsewhere.

Run from the repository root (so that the installed package, which carries the generated
stubs, is imported rather than the source tree)::

    python3 -m unittest discover -s python/tests -v
"""

from __future__ import annotations

import os
import struct
import unittest
from typing import Optional
from unittest import mock

import grpc
import numpy as np

import dmhnsw
from dmhnsw import _convert
from dmhnsw._proto import dmhnsw_pb2
from dmhnsw.client import Client
from dmhnsw.errors import from_rpc_error


class FakeRpcError(grpc.RpcError, grpc.Call):
    """What a failed unary call raises: an RpcError that is also a Call (code, details)."""

    def __init__(self, code: grpc.StatusCode, details: Optional[str]) -> None:
        super().__init__()
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> Optional[str]:
        return self._details

    # the rest of grpc.Call / grpc.RpcContext, unused by the client
    def initial_metadata(self):  # type: ignore[no-untyped-def]
        return None

    def trailing_metadata(self):  # type: ignore[no-untyped-def]
        return None

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> Optional[float]:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:  # type: ignore[no-untyped-def]
        return False


class ArrayConversionTest(unittest.TestCase):
    def test_2d_float64_becomes_le_float32_rows(self) -> None:
        queries = np.arange(6, dtype=np.float64).reshape(2, 3) / 4
        matrix, n, dim = _convert.as_matrix(queries, "queries")
        self.assertEqual((n, dim), (2, 3))
        self.assertEqual(matrix.dtype, np.dtype("<f4"))
        self.assertTrue(matrix.flags.c_contiguous)
        self.assertEqual(matrix.tobytes(), struct.pack("<6f", 0, 0.25, 0.5, 0.75, 1.0, 1.25))

    def test_1d_is_one_row(self) -> None:
        matrix, n, dim = _convert.as_matrix([1, 2, 3, 4], "queries")
        self.assertEqual((n, dim), (1, 4))
        self.assertEqual(matrix.shape, (1, 4))

    def test_big_endian_and_non_contiguous_inputs(self) -> None:
        base = np.arange(12, dtype=">f8").reshape(3, 4)
        view = base[:, ::2]  # strided, big-endian
        matrix, n, dim = _convert.as_matrix(view, "queries")
        self.assertEqual((n, dim), (3, 2))
        self.assertEqual(matrix.tobytes(), struct.pack("<6f", 0, 2, 4, 6, 8, 10))

    def test_float32_input_is_not_copied(self) -> None:
        queries = np.ones((5, 8), dtype="<f4")
        matrix, _, _ = _convert.as_matrix(queries, "queries")
        self.assertTrue(np.shares_memory(matrix, queries))

    def test_integer_input_accepted(self) -> None:
        matrix, n, dim = _convert.as_matrix(np.array([[1, 2], [3, 4]], dtype=np.uint8), "q")
        self.assertEqual(matrix.tobytes(), struct.pack("<4f", 1, 2, 3, 4))

    def test_rank_other_than_1_or_2_refused(self) -> None:
        for bad in (np.zeros((2, 2, 2)), np.float32(1.0), 3.0):
            with self.subTest(shape=np.shape(bad)):
                with self.assertRaises(dmhnsw.InvalidArgument) as ctx:
                    _convert.as_matrix(bad, "queries")
                self.assertIn("queries", str(ctx.exception))
                self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_dimension_zero_refused(self) -> None:
        for bad in (np.zeros((3, 0)), []):
            with self.assertRaises(dmhnsw.InvalidArgument):
                _convert.as_matrix(bad, "queries")

    def test_non_numeric_dtypes_refused(self) -> None:
        bads = (
            np.array([[True, False]]),
            np.array([[1 + 2j]]),
            np.array([["a", "b"]]),
            np.array([[object()]], dtype=object),
        )
        for bad in bads:
            with self.subTest(dtype=bad.dtype):
                with self.assertRaises(dmhnsw.InvalidArgument):
                    _convert.as_matrix(bad, "queries")

    def test_ragged_refused(self) -> None:
        with self.assertRaises(dmhnsw.InvalidArgument):
            _convert.as_matrix([[1.0, 2.0], [3.0]], "queries")

    def test_invalid_argument_is_a_value_error(self) -> None:
        with self.assertRaises(ValueError):
            _convert.as_matrix(np.zeros((1, 1, 1)), "queries")

    def test_non_finite_values_are_sent_as_is(self) -> None:
        queries = np.array([[np.nan, np.inf, -np.inf, 1e300]])
        matrix, _, _ = _convert.as_matrix(queries, "queries")
        back = np.frombuffer(matrix.tobytes(), dtype="<f4")
        self.assertTrue(np.isnan(back[0]))
        self.assertEqual(back[1], np.inf)
        self.assertEqual(back[2], -np.inf)
        self.assertEqual(back[3], np.inf)  # beyond float32's range

    def test_empty_batch(self) -> None:
        matrix, n, dim = _convert.as_matrix(np.zeros((0, 16)), "queries")
        self.assertEqual((n, dim), (0, 16))


class IdsTest(unittest.TestCase):
    def test_ids_become_int64(self) -> None:
        ids = _convert.as_ids(np.array([1, 2, 3], dtype=np.uint32), 3)
        self.assertEqual(ids.dtype, np.int64)
        self.assertEqual(ids.tolist(), [1, 2, 3])

    def test_scalar_for_one_vector(self) -> None:
        self.assertEqual(_convert.as_ids(7, 1).tolist(), [7])

    def test_empty_list(self) -> None:
        self.assertEqual(_convert.as_ids([], 0).size, 0)

    def test_count_mismatch_refused(self) -> None:
        with self.assertRaises(dmhnsw.InvalidArgument) as ctx:
            _convert.as_ids([1, 2], 3)
        self.assertIn("2 ids for 3 vectors", str(ctx.exception))

    def test_non_integer_ids_refused(self) -> None:
        for bad in ([1.0, 2.0], [True, False], ["a", "b"], [[1], [2]]):
            with self.subTest(ids=bad):
                with self.assertRaises(dmhnsw.InvalidArgument):
                    _convert.as_ids(bad, 2)

    def test_uint64_beyond_int64_refused(self) -> None:
        with self.assertRaises(dmhnsw.InvalidArgument):
            _convert.as_ids(np.array([2**63], dtype=np.uint64), 1)


class RequestTest(unittest.TestCase):
    def test_search_request_fields(self) -> None:
        queries = np.arange(8, dtype=np.float32).reshape(2, 4)
        request, n, k = Client._search_request(queries, 5, None, None)
        self.assertEqual((n, k), (2, 5))
        self.assertIsInstance(request, dmhnsw_pb2.SearchRequest)
        self.assertEqual(request.dim, 4)
        self.assertEqual(request.k, 5)
        self.assertEqual(request.ef_search, 0)
        self.assertEqual(request.probe, 0)
        self.assertEqual(request.rerank, 0)
        self.assertEqual(len(request.vectors), 2 * 4 * 4)
        self.assertEqual(request.vectors, struct.pack("<8f", *range(8)))
        request, _, _ = Client._search_request(queries[0], np.int64(3), 64, 2)
        self.assertEqual((request.dim, request.k, request.ef_search, request.probe), (4, 3, 64, 2))
        self.assertEqual(len(request.vectors), 16)
        request, _, _ = Client._search_request(queries, 3, None, None, 40)
        self.assertEqual((request.ef_search, request.probe, request.rerank), (0, 0, 40))

    def test_search_request_round_trips_through_the_wire_format(self) -> None:
        request, _, _ = Client._search_request(np.ones((3, 2)), 1, 10, None)
        parsed = dmhnsw_pb2.SearchRequest.FromString(request.SerializeToString())
        self.assertEqual(parsed, request)

    def test_search_argument_checks(self) -> None:
        queries = np.zeros((1, 4))
        for k, ef, probe in ((0, None, None), (-1, None, None), (2**32, None, None),
                             (1.5, None, None), (True, None, None), (1, -1, None),
                             (1, None, 2**32), (1, "8", None)):
            with self.subTest(k=k, ef=ef, probe=probe):
                with self.assertRaises(dmhnsw.InvalidArgument):
                    Client._search_request(queries, k, ef, probe)
        for rerank in (-1, 2**32, 2.5, True, "20"):
            with self.subTest(rerank=rerank):
                with self.assertRaisesRegex(dmhnsw.InvalidArgument, "^rerank"):
                    Client._search_request(queries, 1, None, None, rerank)

    def test_insert_request_fields(self) -> None:
        vectors = np.arange(6, dtype=np.float64).reshape(3, 2)
        request, n = Client._insert_request(vectors, [10, 11, 12])
        self.assertEqual(n, 3)
        self.assertEqual(request.dim, 2)
        self.assertEqual(list(request.ids), [10, 11, 12])
        self.assertEqual(request.vectors, struct.pack("<6f", *range(6)))

    def test_search_result_shapes_and_dtypes(self) -> None:
        response = dmhnsw_pb2.SearchResponse(
            n=2, k=3, ids=[1, 2, 3, 4, 5, -1], distances=[0.5, 1, 2, 0, 3, float("inf")]
        )
        ids, distances = Client._search_result(response, 2, 3)
        self.assertEqual(ids.dtype, np.int64)
        self.assertEqual(distances.dtype, np.float32)
        self.assertEqual(ids.shape, (2, 3))
        self.assertEqual(ids.tolist(), [[1, 2, 3], [4, 5, -1]])
        self.assertEqual(distances[0].tolist(), [0.5, 1.0, 2.0])

    def test_malformed_search_result_raises(self) -> None:
        bad = (
            dmhnsw_pb2.SearchResponse(n=1, k=1, ids=[1], distances=[0.0]),  # n mismatch
            dmhnsw_pb2.SearchResponse(n=2, k=1, ids=[1], distances=[0.0, 1.0]),  # short ids
        )
        for response in bad:
            with self.assertRaises(dmhnsw.DmhnswError) as ctx:
                Client._search_result(response, 2, 1)
            self.assertEqual(ctx.exception.code, grpc.StatusCode.INTERNAL)


class ClientWithoutCallsTest(unittest.TestCase):
    """What the client does before (or instead of) any RPC; the channel is never used."""

    def test_empty_batches_make_no_call(self) -> None:
        # port 9 (discard) on loopback: any call would fail; these make none
        with Client("127.0.0.1:9", timeout=0.5) as client:
            ids, distances = client.search(np.zeros((0, 8)), k=4)
            self.assertEqual(ids.shape, (0, 4))
            self.assertEqual(ids.dtype, np.int64)
            self.assertEqual(distances.dtype, np.float32)
            self.assertEqual(client.insert(np.zeros((0, 8)), []), 0)

    def test_argument_errors_before_connecting(self) -> None:
        with Client("127.0.0.1:9") as client:
            with self.assertRaises(dmhnsw.InvalidArgument):
                client.search(np.zeros((2, 2, 2)), k=1)
            with self.assertRaises(dmhnsw.InvalidArgument):
                client.insert(np.zeros((2, 2)), [1])

    def test_closed_client_refuses_calls(self) -> None:
        client = Client("127.0.0.1:9")
        client.close()
        client.close()  # twice is harmless
        with self.assertRaises(ValueError):
            client.info()


class TokenTest(unittest.TestCase):
    def test_explicit_token(self) -> None:
        with mock.patch.dict(os.environ, {"DMHNSW_TOKEN": "from-env"}):
            token = _convert.resolve_token("explicit")
        self.assertEqual(_convert.metadata(token), (("dmhnsw-token", "explicit"),))

    def test_token_from_environment(self) -> None:
        with mock.patch.dict(os.environ, {"DMHNSW_TOKEN": "from-env"}):
            self.assertEqual(_convert.resolve_token(None), "from-env")

    def test_no_token(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DMHNSW_TOKEN"}
        with mock.patch.dict(os.environ, env, clear=True):
            self.assertIsNone(_convert.resolve_token(None))
        self.assertEqual(_convert.metadata(None), ())

    def test_token_trimmed_as_the_processes_trim_theirs(self) -> None:
        with mock.patch.dict(os.environ, {"DMHNSW_TOKEN": "sesame \t\r\nsecond line"}):
            self.assertEqual(_convert.resolve_token(None), "sesame")
        self.assertEqual(_convert.resolve_token("sesame  "), "sesame")

    def test_empty_token_sends_none(self) -> None:
        with mock.patch.dict(os.environ, {"DMHNSW_TOKEN": "from-env"}):
            self.assertIsNone(_convert.resolve_token(""))

    def test_client_keeps_metadata(self) -> None:
        with Client("127.0.0.1:9", token="s3cret") as client:
            self.assertEqual(client._metadata, (("dmhnsw-token", "s3cret"),))
        self.assertEqual(dmhnsw.TOKEN_METADATA_KEY, "dmhnsw-token")


class ErrorMappingTest(unittest.TestCase):
    def test_codes_map_to_classes(self) -> None:
        cases = {
            grpc.StatusCode.INVALID_ARGUMENT: dmhnsw.InvalidArgument,
            grpc.StatusCode.UNAUTHENTICATED: dmhnsw.Unauthenticated,
            grpc.StatusCode.UNAVAILABLE: dmhnsw.Unavailable,
            grpc.StatusCode.DEADLINE_EXCEEDED: dmhnsw.DmhnswError,
            grpc.StatusCode.INTERNAL: dmhnsw.DmhnswError,
        }
        for code, cls in cases.items():
            with self.subTest(code=code):
                error = from_rpc_error(FakeRpcError(code, f"server says {code.name}"))
                self.assertIs(type(error), cls)
                self.assertIsInstance(error, dmhnsw.DmhnswError)
                self.assertEqual(error.code, code)
                self.assertEqual(str(error), f"server says {code.name}")

    def test_message_is_the_servers_details(self) -> None:
        error = from_rpc_error(
            FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "dim: 12 != index dim 128")
        )
        self.assertEqual(str(error), "dim: 12 != index dim 128")
        self.assertEqual(error.details, "dim: 12 != index dim 128")

    def test_empty_details_fall_back_to_the_code_name(self) -> None:
        error = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, None))
        self.assertEqual(str(error), "UNAVAILABLE")

    def test_not_an_rpc_call(self) -> None:
        error = from_rpc_error(RuntimeError("boom"))
        self.assertIs(type(error), dmhnsw.DmhnswError)
        self.assertEqual(error.code, grpc.StatusCode.UNKNOWN)
        self.assertEqual(str(error), "boom")

    def test_client_raises_mapped_error_not_rpc_error(self) -> None:
        def failing(request, timeout=None, metadata=None):  # type: ignore[no-untyped-def]
            raise FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "missing dmhnsw-token")

        with Client("127.0.0.1:9") as client:
            with self.assertRaises(dmhnsw.Unauthenticated) as ctx:
                client._call(failing, dmhnsw_pb2.InfoRequest(), None)
        self.assertNotIsInstance(ctx.exception, grpc.RpcError)
        self.assertEqual(str(ctx.exception), "missing dmhnsw-token")

    def test_client_passes_timeout_and_metadata(self) -> None:
        seen = {}

        def recording(request, timeout=None, metadata=None):  # type: ignore[no-untyped-def]
            seen.update(timeout=timeout, metadata=metadata)
            return "ok"

        with Client("127.0.0.1:9", token="t", timeout=2.5) as client:
            client._call(recording, None, None)
            self.assertEqual(seen, {"timeout": 2.5, "metadata": (("dmhnsw-token", "t"),)})
            client._call(recording, None, 0.1)
            self.assertEqual(seen["timeout"], 0.1)


class HealthCodecTest(unittest.TestCase):
    def test_request_encoding(self) -> None:
        self.assertEqual(_convert.encode_health_request(""), b"")
        self.assertEqual(_convert.encode_health_request("dmhnsw.v1.Search"),
                         b"\x0a\x10dmhnsw.v1.Search")

    def test_response_decoding(self) -> None:
        self.assertEqual(_convert.decode_health_response(b"\x08\x01"), 1)  # SERVING
        self.assertEqual(_convert.decode_health_response(b"\x08\x02"), 2)  # NOT_SERVING
        self.assertEqual(_convert.decode_health_response(b""), 0)  # UNKNOWN (default)
        # unknown fields of every wire type are skipped
        extra = b"\x12\x03abc" + b"\x19" + bytes(8) + b"\x25" + bytes(4) + b"\x08\x01"
        self.assertEqual(_convert.decode_health_response(extra), 1)

    def test_truncated_response_raises(self) -> None:
        for bad in (b"\x08", b"\x12\x05ab", b"\x08\x80"):
            with self.assertRaises(dmhnsw.DmhnswError):
                _convert.decode_health_response(bad)


class InfoTest(unittest.TestCase):
    def test_from_proto_copies_every_field(self) -> None:
        message = dmhnsw_pb2.InfoResponse(
            mode="dhnsw", dim=128, metric="l2", count=10**6, memnodes=2, epoch=3,
            provider="shm", max_k=100, max_batch=1024, computenode=0, codes="sq8", rerank=20,
        )
        info = dmhnsw.Info.from_proto(message)
        self.assertEqual((info.codes, info.rerank), ("sq8", 20))
        self.assertEqual(info.mode, "dhnsw")
        self.assertEqual(info.count, 10**6)
        self.assertEqual(info.max_batch, 1024)
        proto_fields = {f.name for f in dmhnsw_pb2.InfoResponse.DESCRIPTOR.fields}
        self.assertEqual(proto_fields, set(info.__dataclass_fields__))


if __name__ == "__main__":
    unittest.main()
