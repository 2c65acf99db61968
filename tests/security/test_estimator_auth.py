"""Who may call the estimator: queries from any certificate of the CA, the calls that change its
fitted models from the controller only, nothing without a certificate (a real server on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from tessera.common import identity, rpc
from tessera.common.localcluster import ca_only, tls_config
from tessera.common.tls import TlsConfig
from tessera.estimator.service.handlers import Estimator
from tessera.estimator.service.main import authorize
from tessera.estimator.service.server import EstimatorService
from tessera.v1 import estimator_pb2 as pb
from tessera.v1 import estimator_pb2_grpc


@pytest.fixture
async def address() -> AsyncIterator[str]:
    server, port = rpc.aio_server(
        "127.0.0.1:0", [(estimator_pb2_grpc.add_EstimatorServicer_to_server, EstimatorService(Estimator()))],
        [rpc.Authorize(authorize)], name="estimator", tls=tls_config(identity.ESTIMATOR))
    await server.start()
    yield f"127.0.0.1:{port}"
    await rpc.stop_server(server, grace=0)


async def code_of(address: str, tls: TlsConfig, method: str, request: object) -> grpc.StatusCode:
    async with rpc.aio_channel(address, tls=tls, peer=identity.ESTIMATOR) as ch:
        try:
            await getattr(estimator_pb2_grpc.EstimatorStub(ch), method)(request, timeout=5)
        except grpc.aio.AioRpcError as err:
            return err.code()
    return grpc.StatusCode.OK


async def test_queries_from_any_identity_changes_from_the_controller_only(address: str) -> None:
    node = tls_config(identity.node("gpu-a1"))
    controller = tls_config(identity.CONTROLLER)
    assert await code_of(address, node, "Health", pb.HealthRequest()) == grpc.StatusCode.OK
    report = pb.ReportStepTimesRequest(job_id="j")  # refused before it is even validated
    assert await code_of(address, node, "ReportStepTimes", report) == grpc.StatusCode.PERMISSION_DENIED
    assert await code_of(address, node, "FitPerformance", pb.FitPerformanceRequest()) == \
        grpc.StatusCode.PERMISSION_DENIED
    # The controller passes the check and meets the request's own validation.
    assert await code_of(address, controller, "ReportStepTimes", report) == grpc.StatusCode.INVALID_ARGUMENT
    no_cert = ca_only()
    assert await code_of(address, no_cert, "Health", pb.HealthRequest()) == grpc.StatusCode.UNAVAILABLE
    # A server that is not the estimator (the controller's certificate) is not trusted as one.
    async with rpc.aio_channel(address, tls=controller, peer=identity.CONTROLLER) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await estimator_pb2_grpc.EstimatorStub(ch).Health(pb.HealthRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_refused_caller_is_answered_before_its_request_is_read(address: str) -> None:
    """The check runs before gRPC takes the request in (rpc.Authorize over handlerwrap.read_after):
    a corrupt body from a certificate that may not call the method is PERMISSION_DENIED, not the
    parser's INVALID_ARGUMENT (before: the whole request was received and parsed first, and 32
    refused 15 MiB calls held 670 MB of the estimator; a live audit)."""
    async with rpc.aio_channel(address, tls=tls_config(identity.node("gpu-a1")), peer=identity.ESTIMATOR) as ch:
        raw = ch.unary_unary("/tessera.v1.Estimator/FitPerformance", request_serializer=None,
                             response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw(b"\xff\xff\xff", timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with rpc.aio_channel(address, tls=tls_config(identity.CONTROLLER), peer=identity.ESTIMATOR) as ch:
        raw = ch.unary_unary("/tessera.v1.Estimator/FitPerformance", request_serializer=None,
                             response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as err:  # allowed: then read, and refused as corrupt
            await raw(b"\xff\xff\xff", timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
