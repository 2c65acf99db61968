"""The `tessera.v1.Estimator` gRPC servicer: a thin asyncio shell over tessera.estimator.service.handlers.Estimator.

Every call but Health runs the library in a worker thread, so a traced-mode estimate or a cold Cell
computation does not block the event loop: Health, the watchdog and other calls keep being
answered. Errors are raised, and the server's ErrorInterceptor (tessera.common.rpc) answers them:
an input error of the library is INVALID_ARGUMENT "field: reason"; traced mode without torch is
FAILED_PRECONDITION; anything else is INTERNAL (and logged, never sent).

Threads by lane. The heavy calls (GetCells, PlaceStages, a traced EstimateMemory) run on threads of
their own: HEAVY_THREADS for the controller, whose calls queue for them, and HEAVY_THREADS for every
other caller (any certificate of the CA may query), whose calls beyond HEAVY_QUEUE waiting are
answered RESOURCE_EXHAUSTED at once. The light calls keep the default executor. A thread cannot be
stopped: a heavy call whose client gave up runs to its end, but on its lane's threads only. Before,
one executor of six threads served every call, and six abandoned heavy calls left the service
answering nothing but Health. A traced estimate is the exception: it runs in a child process
(estimator/service/traced_child.py), killed past its budget or as soon as its caller gives up (a
cancel, its deadline, the server stopping), which frees its thread too.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram

from tessera.common import tls
from tessera.common.errors import Code, ResourceExhausted, TesseraError
from tessera.common.identity import CONTROLLER
from tessera.estimator.service.handlers import MODES, Estimator
from tessera.v1 import estimator_pb2 as pb
from tessera.v1 import estimator_pb2_grpc

REQUESTS = Counter("tessera_estimator_requests_total", "Estimator calls by method and status code",
                   ["method", "code"])
SECONDS = Histogram("tessera_estimator_request_seconds", "Wall time of estimator calls", ["method"],
                    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120))

Req = TypeVar("Req")
Resp = TypeVar("Resp")


HEAVY_THREADS = 2
HEAVY_QUEUE = 8


class _Lane:
    """Threads for one kind of heavy caller; `queue` > 0: calls past that many waiting are refused."""

    def __init__(self, name: str, queue: int) -> None:
        self.name = name
        self.pool = ThreadPoolExecutor(HEAVY_THREADS, thread_name_prefix=f"estimator-{name}")
        self.queue = queue
        self.inside = 0
        self._lock = threading.Lock()

    async def run(self, method: str, fn: Callable[[Req], Resp], request: Req) -> Resp:
        """fn(request) on the lane's threads. A call counts until its work ends, not until its
        caller stops waiting: a call whose client gave up runs on in its thread, and counted out
        at the cancel it let the same client queue more work behind it than `queue` allows."""
        with self._lock:
            if self.queue and self.inside >= HEAVY_THREADS + self.queue:
                raise ResourceExhausted(f"{method}: the estimator is busy with {self.inside} heavy calls of "
                                        f"{self.name}; retry later")
            self.inside += 1
        work = self.pool.submit(fn, request)
        work.add_done_callback(self._leave)  # also when cancelled before it started
        return await asyncio.wrap_future(work)

    def _leave(self, _: object) -> None:
        with self._lock:
            self.inside -= 1


class EstimatorService(estimator_pb2_grpc.EstimatorServicer):  # type: ignore[misc]
    """The servicer; `estimator` holds the caches and fitted models (one per process)."""

    def __init__(self, estimator: Estimator | None = None) -> None:
        self.estimator = estimator or Estimator()
        self._lanes = {True: _Lane("the controller", 0), False: _Lane("other callers", HEAVY_QUEUE)}

    async def EstimateMemory(self, request: pb.EstimateMemoryRequest, context: Any) -> pb.EstimateMemoryResponse:
        if not MODES.get(request.mode, "").startswith("traced"):
            return await self._run("EstimateMemory", self.estimator.estimate_memory, request, context)
        cancel = threading.Event()  # set when the caller gives up: the trace's child is killed
        return await self._run("EstimateMemory", functools.partial(self.estimator.estimate_memory, cancel=cancel),
                               request, context, heavy=True, cancel=cancel)

    async def GetCells(self, request: pb.GetCellsRequest, context: Any) -> pb.GetCellsResponse:
        controller = tls.peer_identity(context) == CONTROLLER
        return await self._run("GetCells", functools.partial(self.estimator.get_cells, controller=controller),
                               request, context, heavy=True)

    async def PlaceStages(self, request: pb.PlaceStagesRequest, context: Any) -> pb.PlaceStagesResponse:
        return await self._run("PlaceStages", self.estimator.place_stages, request, context, heavy=True)

    async def FitPerformance(self, request: pb.FitPerformanceRequest, context: Any) -> pb.FitPerformanceResponse:
        return await self._run("FitPerformance", self.estimator.fit_performance, request, context)

    async def ReportStepTimes(self, request: pb.ReportStepTimesRequest, context: Any) -> pb.ReportStepTimesResponse:
        return await self._run("ReportStepTimes", self.estimator.report_step_times, request, context)

    async def EstimateTime(self, request: pb.EstimateTimeRequest, context: Any) -> pb.EstimateTimeResponse:
        return await self._run("EstimateTime", self.estimator.estimate_time, request, context)

    async def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
        REQUESTS.labels("Health", "OK").inc()
        return self.estimator.health()

    async def _run(self, method: str, fn: Callable[[Req], Resp], request: Req, context: Any,
                   heavy: bool = False, cancel: threading.Event | None = None) -> Resp:
        start = time.perf_counter()
        lane = self._lanes[tls.peer_identity(context) == CONTROLLER] if heavy else None
        try:
            result = await (asyncio.to_thread(fn, request) if lane is None else lane.run(method, fn, request))
        except Exception as exc:  # counted here, answered by the interceptor
            code = exc.code if isinstance(exc, TesseraError) else Code.INTERNAL
            REQUESTS.labels(method, code.value).inc()
            SECONDS.labels(method).observe(time.perf_counter() - start)
            raise
        except asyncio.CancelledError:  # the client gave up (its deadline, a cancel): counted too
            if cancel is not None:
                cancel.set()
            REQUESTS.labels(method, "CANCELLED").inc()
            SECONDS.labels(method).observe(time.perf_counter() - start)
            raise
        REQUESTS.labels(method, "OK").inc()
        SECONDS.labels(method).observe(time.perf_counter() - start)
        return result
