"""ListJobs pages: at most `limit` jobs and PAGE_BYTES per answer, whatever the jobs hold, so a list
never reaches the gRPC message limit (issue 13, finding 5). docs/cli.md, "Pages", is the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tessera.common.errors import InvalidArgument
from tessera.common.jobspec import MAX_SPEC_BYTES
from tessera.controller.convert import job_pb
from tessera.controller.core import pagetoken
from tessera.controller.redact import Hide
from tessera.controller.store import JobRecord
from tessera.v1 import common_pb2, controller_pb2

DEFAULT_PAGE = 500
MAX_PAGE = 1000
# Well under common.rpc's 16 MiB message limit: a page of MAX_PAGE jobs at the spec limit (64 KiB)
# would not be, so a page also ends once it holds this many bytes.
PAGE_BYTES = 4 * 1024 * 1024

Fetch = Callable[[tuple[float, str] | None, int], list[JobRecord]]


def page_limit(limit: int) -> int:
    if limit < 0:
        raise InvalidArgument("limit", "must be >= 0 (0: the server's default)")
    return min(limit or DEFAULT_PAGE, MAX_PAGE)


def list_page(fetch: Fetch, progress: Callable[[str], common_pb2.Progress | None], key: bytes,
              states: Sequence[int], tenant: str, limit: int, token: str,
              forecast: Callable[[str], controller_pb2.Forecast | None] | None = None,
              hide: Hide | None = None) -> controller_pb2.ListJobsResponse:
    """One page: the jobs after the token's key (`fetch(after, n)` reads the store), and a token
    when more follow. A token is checked before anything is read."""
    n = page_limit(limit)
    after = pagetoken.decode(key, token, states, tenant) if token else None
    recs = fetch(after, n + 1)
    resp = controller_pb2.ListJobsResponse()
    size = 0
    for rec in recs[:n]:
        job = _listed(job_pb(rec, progress(rec.id), forecast=forecast(rec.id) if forecast else None,
                             hide=hide))
        grown = size + job.ByteSize() + 8  # 8: the repeated field's tag and length, generously
        if resp.jobs and grown > PAGE_BYTES:
            break
        resp.jobs.append(job)
        size = grown
    if len(resp.jobs) < len(recs):
        last = resp.jobs[-1]
        resp.continue_token = pagetoken.encode(key, states, tenant, (last.submit_time, last.id))
    return resp


def _listed(job: controller_pb2.Job) -> controller_pb2.Job:
    """A job as a page shows it: a spec stored before specs were bounded (over MAX_SPEC_BYTES) is
    listed without its env, entrypoint and launcher (`spec_elided`); GetJob returns it whole."""
    if job.spec.ByteSize() > MAX_SPEC_BYTES:
        job.spec.ClearField("env")
        job.spec.ClearField("entrypoint")
        job.spec.ClearField("launcher")
        job.spec_elided = True
    if job.spec.ByteSize() > MAX_SPEC_BYTES:  # large elsewhere still: the identity and the size only
        s = job.spec
        job.spec.CopyFrom(common_pb2.JobSpec(name=s.name[:63], tenant=s.tenant[:63], iterations=s.iterations,
                                             global_batch_size=s.global_batch_size))
    return job
