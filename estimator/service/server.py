"""The `tessera.v1.Estimator` gRPC servicer: a thin asyncio shell over tessera.estimator.service.handlers.Estimator.

Every call but Health runs the library in a worker thread (asyncio.to_thread), so a traced-mode
estimate or a cold Cell computation never blocks the event loop: Health, the watchdog and other calls
keep being answered. Errors are raised, and the server's ErrorInterceptor (tessera.common.rpc)
answers them: an input error of the library is INVALID_ARGUMENT "field: reason"; traced mode
without torch is FAILED_PRECONDITION; anything else is INTERNAL (and logged, never sent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram

from tessera.common.errors import Code, TesseraError
from tessera.estimator.service.handlers import Estimator
from tessera.v1 import estimator_pb2 as pb
from tessera.v1 import estimator_pb2_grpc

REQUESTS = Counter("tessera_estimator_requests_total", "Estimator calls by method and status code",
                   ["method", "code"])
SECONDS = Histogram("tessera_estimator_request_seconds", "Wall time of estimator calls", ["method"],
                    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120))

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class EstimatorService(estimator_pb2_grpc.EstimatorServicer):  # type: ignore[misc]
    """The servicer; `estimator` holds the caches and fitted models (one per process)."""

    def __init__(self, estimator: Estimator | None = None) -> None:
        self.estimator = estimator or Estimator()

    async def EstimateMemory(self, request: pb.EstimateMemoryRequest, context: Any) -> pb.EstimateMemoryResponse:
        return await self._run("EstimateMemory", self.estimator.estimate_memory, request, context)

    async def GetCells(self, request: pb.GetCellsRequest, context: Any) -> pb.GetCellsResponse:
        return await self._run("GetCells", self.estimator.get_cells, request, context)

    async def PlaceStages(self, request: pb.PlaceStagesRequest, context: Any) -> pb.PlaceStagesResponse:
        return await self._run("PlaceStages", self.estimator.place_stages, request, context)

    async def FitPerformance(self, request: pb.FitPerformanceRequest, context: Any) -> pb.FitPerformanceResponse:
        return await self._run("FitPerformance", self.estimator.fit_performance, request, context)

    async def ReportStepTimes(self, request: pb.ReportStepTimesRequest, context: Any) -> pb.ReportStepTimesResponse:
        return await self._run("ReportStepTimes", self.estimator.report_step_times, request, context)

    async def EstimateTime(self, request: pb.EstimateTimeRequest, context: Any) -> pb.EstimateTimeResponse:
        return await self._run("EstimateTime", self.estimator.estimate_time, request, context)

    async def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
        REQUESTS.labels("Health", "OK").inc()
        return self.estimator.health()

    async def _run(self, method: str, fn: Callable[[Req], Resp], request: Req, context: Any) -> Resp:
        start = time.perf_counter()
        try:
            result = await asyncio.to_thread(fn, request)
        except Exception as exc:  # counted here, answered by the interceptor
            code = exc.code if isinstance(exc, TesseraError) else Code.INTERNAL
            REQUESTS.labels(method, code.value).inc()
            SECONDS.labels(method).observe(time.perf_counter() - start)
            raise
        REQUESTS.labels(method, "OK").inc()
        SECONDS.labels(method).observe(time.perf_counter() - start)
        return result
