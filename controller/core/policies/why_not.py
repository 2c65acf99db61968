"""Why a job cannot run at all, whatever is free now: the causes that Crius (`_no_cell`) and FCFS
(`_try`) name for a job none of whose choices the cluster ever runs. Pure: literal inputs in, a
cause out.

A cause is (nowhere, why): `nowhere` is true when the registered GPUs, READY or not, can never run
the job (PendingKind.FITS_NOWHERE); false when the registered GPUs would but the READY ones do not
(nodes drained or unhealthy: the job waits for nodes, PendingKind.NO_ROOM_NOW). The causes, first
that holds: an opaque job the cluster cannot hold, GPU types the cluster lacks, no READY node of
the allowed types (`type_cause`); more GPUs than the READY nodes have of one type (unless no count
the registered GPUs could give the job fits it in memory: then the policy's memory cause, fits
nowhere, as nodes coming back would not run it), or than a job may have (`count_cause`). None of
them holding leaves memory (or estimates that do not cover the choice), which each policy names
against its own choices. What nodes coming back would run is `if_back`: a choice only where a Cell
of the job covers it on the registered GPUs, so a job no Cell covers fits nowhere rather than
waiting for nodes forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from tessera.controller.core import opaque
from tessera.controller.core.frenzy import missing_types_reason
from tessera.controller.core.placement import quotas
from tessera.controller.core.policy import RoundContext
from tessera.controller.core.snapshot import JobView, Snapshot

Cause = tuple[bool, str]


def registered(snap: Snapshot) -> tuple[tuple[str, int, int], ...]:
    """The cluster's GPUs, READY or not: (model, memory bytes, count); counted from the nodes when
    the snapshot has no `cluster_gpus` (one built by hand)."""
    if snap.cluster_gpus:
        return snap.cluster_gpus
    seen: dict[tuple[str, int], int] = {}
    for node in snap.nodes:
        for g in node.gpus:
            seen[(g.model, g.memory_bytes)] = seen.get((g.model, g.memory_bytes), 0) + 1
    return tuple(sorted((m, b, c) for (m, b), c in seen.items()))


@dataclass(frozen=True)
class Supply:
    """The GPUs of the types a job allows: `registered` (READY or not) and `ready` (on READY nodes,
    in the round's order of types), by type, and the GPUs one job may have (`cap`, 0: no cap)."""

    registered: Mapping[str, int]
    ready: Mapping[str, int]
    cap: int = 0
    listed: str = ""  # what `text` says when not the registered GPUs (see `only`)
    opaque: bool = False  # an opaque job's: no memory to speak of (docs/opaque-jobs.md)

    def limit(self, n: int) -> int:
        return min(n, self.cap) if self.cap else n

    def text(self) -> str:
        """The registered GPUs, e.g. "8 x A100-80GB, 4 x V100-32GB"."""
        return self.listed or ", ".join(f"{c} x {m}" for m, c in sorted(self.registered.items()))

    def only(self, gpu_type: str, keep_listing: bool = False) -> Supply:
        """The same supply narrowed to one type (a job that runs on that type only); with
        `keep_listing`, `text` still lists every allowed type (Crius's reasons do)."""
        return Supply({gpu_type: self.registered.get(gpu_type, 0)}, {gpu_type: self.ready.get(gpu_type, 0)},
                      self.cap, self.text() if keep_listing else "", self.opaque)


def by_type(snap: Snapshot) -> dict[str, int]:
    """The registered GPUs (`registered`) by type, READY or not, whatever their memory."""
    have: dict[str, int] = {}
    for m, _, c in registered(snap):
        have[m] = have.get(m, 0) + c
    return have


def supply(job: JobView, snap: Snapshot, ready: Mapping[str, int], cap: int = 0) -> Supply:
    """The job's supply: `ready` is the GPUs of READY nodes by type (the round's `total_gpus`)."""
    allowed = {m: c for m, c in by_type(snap).items() if job.may_use(m)}
    return Supply(allowed, {t: c for t, c in ready.items() if job.may_use(t)}, cap, opaque=job.opaque)


def round_supply(ctx: RoundContext, job: JobView) -> Supply:
    """`supply` in a round: its READY GPUs by type and its per-job cap."""
    return supply(job, ctx.snap, {t: ctx.total_gpus(t) for t in ctx.types()}, ctx.config.max_gpus_per_job)


def type_cause(job: JobView, snap: Snapshot, s: Supply, never: Callable[[], str] | None = None) -> Cause | None:
    """An opaque job the registered GPUs cannot hold, GPU types the cluster lacks (fits nowhere), or
    no READY node of the allowed types (waits for nodes); None when the job has READY GPUs to ask.
    `never` (asked only when no READY node has its types): the caller's cause when nothing the
    registered GPUs could give the job runs it, its count (`over_registered`) or its memory
    (`memory_cause`); "" when something may. Nodes coming back would not run it then, and that
    cause, fits nowhere, replaces "waits for nodes"."""
    reg = registered(snap)
    if job.opaque and (nowhere := opaque.fits_nowhere(job, reg)):
        return True, nowhere
    if not s.registered:
        missing = missing_types_reason(job.gpu_types, replace(snap, cluster_gpus=reg))
        return True, missing.removeprefix("fits nowhere: ")
    if not s.ready:
        if never is not None and (why := never()):
            return True, why
        which = f" has {' or '.join(job.gpu_types)}" if job.gpu_types else ""
        return False, f"no READY node{which} (registered: {s.text()})"
    return None


def count_cause(s: Supply, need: int, what: str, memory: str = "") -> Cause | None:
    """Why `need` GPUs of one type do not run, `what` saying where the count comes from ("its gpus
    hint is 16: ..."): READY nodes too few (waits for nodes), the per-job cap, the cluster too small
    in all or of each type (fits nowhere); None when READY nodes hold `need` of one allowed type.
    `memory`: the caller's cause when the job fits in memory on no count the registered GPUs could
    give it ("" when one may, or memory is not known): nodes coming back would not run it, so that
    cause, fits nowhere, replaces "waits for nodes"."""
    ready = max((s.limit(c) for c in s.ready.values()), default=0)
    if need <= ready:
        return None
    most = max((s.limit(c) for c in s.registered.values()), default=0)
    if need <= most:
        if memory:
            return True, memory
        return False, f"{what} and READY nodes have at most {ready} of one type (registered: {s.text()})"
    if s.cap and need > s.cap:
        return True, f"{what} and a job may have at most {s.cap}"
    total = sum(s.registered.values())
    if need > total:
        return True, f"{what}, more than the cluster has ({total}: {s.text()})"
    return True, f"{what} and the cluster has at most {most} of one type ({s.text()})"


def fewest(ctx: RoundContext, job: JobView, types: Iterable[str], pow2: bool = False) -> dict[str, int]:
    """The fewest GPUs of each type the job fits on in memory, by the estimates (a type absent:
    none); `pow2`: of the power-of-two counts only (those a job without a GPU count gets Cells of)."""
    return {m: cs[0] for m in types if (cs := [c for c in ctx.gpu_counts(job, m) if not pow2 or c & (c - 1) == 0])}


def memory_cause(s: Supply, fewest: Mapping[str, int], most: int = 0, scope: Iterable[str] = (),
                 asks: str = "") -> str:
    """Why the job fits in memory on no count of its types that the registered GPUs could give it
    within the per-job cap, READY or not ("" when one may); `fewest` as `fewest` gives it over the
    types in `scope` (default: the supply's), `most`: the job runs on at most that many GPUs (0: any
    count), which `asks` words (default "it asks for {most} GPUs")."""
    if any(n <= s.limit(s.registered.get(m, 0)) and (not most or n <= most) for m, n in fewest.items()):
        return ""
    if not fewest:
        return f"no count of {' or '.join(scope or sorted(s.registered))} GPUs fits it (out of memory or not covered by the estimates)"
    return (f"{asks or f'it asks for {most} GPUs'}; " if most else "") + fewest_text(s, fewest)


def if_back(ctx: RoundContext, job: JobView, s: Supply, choices: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """Of `choices` (GPU type, count), those nodes coming back would run: more GPUs of the type than
    the READY nodes have, no more than the registered ones (and the per-job cap) hold, no fewer than
    the fewest the job fits on in memory by the estimates (`gpu_counts` covers the registered
    pools), and a Cell of the job on them (`covers`): a count no Cell covers (3 GPUs where the
    estimates have powers of two only) never runs, whatever nodes come back. An opaque job runs on
    exactly its count (its `gpu_counts`), never on more."""
    return sorted({(t, n) for t, n in choices if ctx.total_gpus(t) < n <= s.limit(s.registered.get(t, 0))
                   and (cs := ctx.gpu_counts(job, t)) and (n in cs if job.opaque else cs[0] <= n)
                   and covers(ctx, job, t, n)})


def asks(ctx: RoundContext, job: JobView, s: Supply, named: bool = True) -> list[tuple[str, int]]:
    """What the job asks for with every registered node READY, as a request-as-is policy (fcfs,
    gandiva) asks: its count (the fewest it fits on without one) of the type it names when that type
    is registered and `named`, else of each registered type it may use."""
    types = [job.gpu_type_hint] if named and job.gpu_type_hint in s.registered else sorted(s.registered)
    return [(t, job.gpus_hint or min(ctx.gpu_counts(job, t), default=0)) for t in types]


def covers(ctx: RoundContext, job: JobView, gpu_type: str, n: int) -> bool:
    """Whether a Cell of the job runs `n` GPUs of the type once registered nodes come back, judged as
    the policies judge one on READY nodes (`ctx.throughput` > 0 on an even layout, `ctx.ideal_nodes`).
    The snapshot counts the registered GPUs but not the nodes down, whose sizes it does not know: any
    even split (placement.quotas, fewest nodes first) may be theirs, so the first with a Cell covers
    it, and a count none covers is one no nodes coming back run."""
    return any(ctx.throughput(job, gpu_type, n, n // q) > 0 for q in quotas(n, n))


def back_text(ctx: RoundContext, s: Supply, back: Iterable[tuple[str, int]]) -> str:
    """What a job waits for (`if_back`'s choices): "it fits in memory on 16 x A100-80GB (registered:
    16 x A100-80GB; READY: 8 x A100-80GB)"; an opaque job "runs on" them (it has no memory figure)."""
    back = sorted(back)
    now = ", ".join(f"{ctx.total_gpus(m)} x {m}" for m in sorted({t for t, _ in back}))
    verb = "runs on" if s.opaque else "fits in memory on"
    return f"it {verb} {' or '.join(f'{n} x {t}' for t, n in back)} (registered: {s.text()}; READY: {now})"


def over_registered(s: Supply, need: int, what: str) -> str:
    """`count_cause`'s cause where `need` GPUs of one type are more than the registered GPUs, READY
    or not, or a job, may have ("" when they are not): no node coming back would run it."""
    cause = count_cause(replace(s, ready=s.registered), need, what)
    return cause[1] if cause else ""


def fewest_text(s: Supply, fewest: Mapping[str, int]) -> str:
    """"it fits in memory on no fewer than 16 x A100-80GB (registered: 8)": the fewest GPUs of each
    type the job fits on, naming the per-job cap where that, not the registered GPUs, is what limits."""
    over = " or ".join(f"{n} x {m} (registered: {s.registered.get(m, 0)})" for m, n in sorted(fewest.items()))
    capped = s.cap and any(s.cap < n <= s.registered.get(m, 0) for m, n in fewest.items())
    return f"it fits in memory on no fewer than {over}" + (f"; a job may have at most {s.cap}" if capped else "")


def opaque_what(gpus: int) -> str:
    """`count_cause`'s `what` for an opaque job: it never runs on fewer or more GPUs."""
    return f"it runs on exactly {gpus} GPUs of one type"


def no_cell(ctx: RoundContext, job: JobView, t: str, n: int, s: Supply) -> str:
    """Why n GPUs of t run the job nowhere, its memory aside (the caller names that first): more than
    the type has or a job may have, an opaque count the nodes cannot split evenly, else no Cell of
    them (on the READY nodes' layout, nor on any even layout of the registered ones: `if_back`),
    naming the counts of t it fits on in memory."""
    reg, fits = s.registered.get(t, 0), list(ctx.gpu_counts(job, t))
    if n > reg:
        return f"{n} x {t} is more than the cluster has ({reg})"
    if n > s.limit(reg):
        return f"{n} x {t} is more than a job may have ({s.cap})"
    if job.opaque:
        return f"{opaque_what(n)}, which the nodes of {t} cannot split evenly"
    if n in fits:
        return f"the estimates have no Cell of {n} x {t} (it fits in memory on {n} x {t})"
    listed = f"{', '.join(map(str, fits[:-1]))} or {fits[-1]}" if len(fits) > 1 else "".join(map(str, fits))
    return (f"the estimates have no Cell of {n} x {t} (out of memory or not covered; it fits in memory on "
            f"{f'{listed} x {t}' if fits else f'no count of {t}'})")


def opaque_cause(ctx: RoundContext, job: JobView, s: Supply) -> str:
    """Why an opaque job's count runs on no READY node of `s`: more GPUs than a type has or a job may
    have (`count_cause`), else the types whose READY nodes hold that many but cannot split them
    evenly (its one Cell needs an even split); "" when no READY type holds its count."""
    n = opaque.gpus_of(job)
    what = opaque_what(n)
    if (cause := count_cause(s, n, what)) and cause[0]:
        return cause[1]
    uneven = [f"{ctx.ideal_nodes(t, n)} nodes of {t}" for t in sorted(s.ready) if n <= s.limit(s.ready[t])]
    return f"{what}, which {' or '.join(uneven)} cannot split evenly" if uneven else ""


def request_cause(ctx: RoundContext, job: JobView, s: Supply, counts: Mapping[str, int], of: str = "of one type") -> str:
    """Why no registered node, READY or not, runs a job asking for `counts` (its GPUs on each type of
    `s`), the first that holds: an opaque job the cluster cannot hold or types it lacks (`type_cause`),
    more GPUs than the cluster has of one type ("it asks for 16 GPUs {of}"), no count that holds it
    in memory, else per type why its count there runs nowhere (`no_cell`); "" when there is none."""
    cause = type_cause(job, ctx.snap, s)
    if cause is not None and cause[0]:
        return cause[1]
    n = job.gpus_hint
    if n and (why := over_registered(s, n, opaque_what(n) if job.opaque else f"it asks for {n} GPUs {of}")):
        return why
    if not job.opaque and (why := memory_cause(s, fewest(ctx, job, sorted(s.registered)), n)):
        return why
    return "; ".join(no_cell(ctx, job, t, c, s) for t, c in sorted(counts.items()))
