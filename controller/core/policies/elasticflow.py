"""ElasticFlow (ASPLOS'23) as a baseline: deadline-aware admission and elastic data-parallel scaling,
blind to GPU types and parallel plans (docs/reference/baselines.md Sec. 4).

`elasticflow` uses the jobs' deadlines; `elasticflow-l` (ElasticFlow-LS, the throughput variant the
Crius paper compares with) loosens every deadline to 1e9 s.

- "artifact" (Crius `ElasticFlowSched`): pools per GPU type, each job stays on the type it asked
  for. A job's minimum satisfactory share is the smallest power of two (1..16) whose data-parallel
  iteration time meets its deadline from now, counting one round and the restart cost (the rules'
  `Snapshot.restart_cost_s` where set, else the artifact's 150 s per GPU up to 600 s; under LS:
  the smallest count where data parallelism fits in memory). Admission: the minimum shares of the
  type's jobs, earliest deadline first, must fit in the type's GPUs; otherwise the job waits (not
  declined). Allocation: every job of the type gets its minimum share, then the job with the
  largest throughput gain is doubled while GPUs remain (up to 16); then every job of the type is
  placed again from scratch, multi-node jobs on whole nodes first, the rest first fit, largest
  first. Waiting jobs are retried in rounds with departures; the first that fails blocks its type.
  Pending jobs past their deadline are dropped.
- "paper": the same admission, but over the whole cluster as one pool of GPUs (any type,
  ElasticFlow's homogeneous view), every round, shares up to the largest type's GPUs instead of 16;
  a job no share of any type can serve
  (data parallelism does not fit its memory, the estimates have no Cell of a share that fits, or no
  share meets its deadline: the reason names which) is declined (dropped) as the paper's admission
  control declines it, where the artifact lets it wait (one whose share only registered nodes that
  are not READY hold waits for them, in both modes; with no READY node, one that no registered node
  would serve gets what it gets with every node READY: declined, or not admitted); a job starts at
  its minimum share on the type with the most free GPUs; once no admitted job waits, spare GPUs go
  to the largest marginal throughput per GPU, one doubling at a time, where the iterations it has
  left save at least the restart the doubling costs (ElasticFlow grows on any gain: a job was grown
  a second after it started for 0.1%, restarting its program); placement by Tessera's rules (fewest
  nodes, best fit), running jobs kept where they are unless their share changes; grown jobs keep
  their GPUs while an admitted job waits (ElasticFlow plans every minimum share before growth, but
  taking GPUs back made Morphling's multi-tenant replay slower: see the docs' elasticflow row).
- In both modes an opaque job (docs/opaque-jobs.md) has one share on each type it may use: the
  GPUs it asked for, whatever the powers of two, with no deadline test (nothing estimates its
  time); it is never grown or shrunk. Reasons name the cause (why_not): GPU types or counts the
  cluster lacks, memory, no Cell of a share, or the deadline.

Simplifies: no time-varying plan over future slots (progressive filling checks a constant share);
buddy allocation is replaced by the placement above.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.controller.core import opaque
from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Alloc, Board, free_text
from tessera.controller.core.policy import Mode, RoundContext, queue_key
from tessera.controller.core.snapshot import Decision, JobView, PendingKind, Slice

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT
LOOSE = 1e9
MAX_GPUS = 16
RESTART_PER_GPU, RESTART_CAP = 150.0, 600.0


@dataclass(frozen=True)
class ElasticFlowOptions:
    # ElasticFlow-LS (the Crius paper's baseline): every deadline loosened to 1e9 s. The policy
    # name sets it ("elasticflow": False, "elasticflow-l": True).
    loose: bool = True


class ElasticFlowPolicy:
    def __init__(self, mode: Mode = PAPER, loose: bool = True) -> None:
        self.mode = Mode(mode)
        self.loose = loose

    @property
    def name(self) -> str:
        return "elasticflow-l" if self.loose else "elasticflow"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        b = Board(ctx, self.name)
        _EF(self, b).round()
        return b.decisions(opportunistic=False)


class _EF:
    def __init__(self, pol: ElasticFlowPolicy, b: Board) -> None:
        self.pol = pol
        self.b = b
        self.ctx = b.ctx
        self.art = pol.mode == ARTIFACT
        self.name = pol.name
        self._need: int | None = None
        # Shares are powers of two (buddy allocation). The artifact caps them at 16 GPUs; the paper
        # at the round's per-job cap, else the cluster (the largest type here: a share runs on one
        # type), so a job that needs more than 16 GPUs (LLaMA-30B on Morphling's cluster) has a share.
        self.max_gpus = MAX_GPUS if self.art else self.ctx.max_gpus()

    # ------------------------------------------------------------------ shares

    def deadline(self, job: JobView) -> float:
        if self.pol.loose or job.deadline <= 0:
            return job.submit_time + LOOSE
        return job.deadline

    def it_dp(self, job: JobView, t: str, n: int) -> float:
        ctx = self.ctx
        if not job.may_use(t) or not ctx.dp_fits(job, t, n):
            return 0.0  # (a type it does not name: never a share of it; a review found it started there)
        e = ctx.best(job, t, n, ctx.ideal_nodes(t, n))
        return e.iteration_s if e else 0.0

    def thr_dp(self, job: JobView, t: str, n: int) -> float:
        it = self.it_dp(job, t, n)
        return job.global_batch_size / it if it > 0 else -1e9

    def min_share(self, job: JobView, t: str, current: int) -> int:
        ctx = self.ctx
        if job.opaque:
            return self.opaque_share(job, t)
        cost = ctx.snap.restart_cost_s or restart_s(current or job.gpus_hint or 1)
        n = 1
        while n <= self.max_gpus and n <= ctx.total_gpus(t):
            it = self.it_dp(job, t, n)
            if it > 0 and ctx.snap.now + cost + ctx.config.interval_s + job.remaining_iterations * it \
                    <= self.deadline(job):
                return n
            n *= 2
        return 0

    def opaque_share(self, job: JobView, t: str) -> int:
        """An opaque job's one share of t: its count where a Cell of it runs on the type's READY
        nodes (an even layout) within the per-job cap, else 0."""
        n, cap = opaque.gpus_of(job), self.ctx.config.max_gpus_per_job
        return n if n <= self.ctx.total_gpus(t) and not (cap and n > cap) and self.it_dp(job, t, n) > 0 else 0

    def type_of(self, job: JobView) -> str:
        types = [t for t in self.ctx.types() if job.may_use(t)]
        if job.opaque:  # the type it names first, else the first that runs its count (3 GPUs: not the A40 pair)
            runs = [t for t in types if self.opaque_share(job, t)]
            types = sorted(runs or types, key=lambda t: t != job.gpu_type_hint)
        elif job.gpu_type_hint in self.ctx.types():
            return job.gpu_type_hint
        return types[0] if types else ""

    # ------------------------------------------------------------------ the round

    def round(self) -> None:
        ctx, b = self.ctx, self.b
        for j in list(b.waiting.values()):
            if not self.pol.loose and j.deadline > 0 and j.deadline <= ctx.snap.now:
                b.drop(j, f"{self.name}: dropped: its deadline passed while it waited")
        departures = ctx.snap.departures > 0 or ctx.snap.arrivals is None
        older = [j for j in ctx.pending if j.id not in ctx.arrivals and j.id in b.waiting]
        if departures or not self.art:
            blocked: set[str] = set()
            for j in older:
                t = self.type_of(j)
                if self.art and t in blocked:
                    b.pend(j, PendingKind.WAITING, f"{self.name}: waiting behind an earlier job of {t}")
                    continue
                if not self.fit(j):
                    blocked.add(t)
        for j in ctx.pending:
            if j.id in ctx.arrivals and j.id in b.waiting:
                self.fit(j)
        if not self.art and not any(j.id not in b.dropped for j in b.waiting.values()):
            self._grow()  # spare GPUs go to admitted jobs once nobody waits

    def pool(self, t: str) -> list[Alloc]:
        if self.art:
            return [a for a in self.b.allocs.values() if a.gpu_type == t]
        return list(self.b.allocs.values())

    def fit(self, job: JobView) -> bool:
        b = self.b
        t = self.type_of(job)
        if not t:  # no READY node
            s = self.registered()
            if back := self.waits_for(job):
                b.pend(job, PendingKind.NO_ROOM_NOW, f"{self.name}: waiting for nodes: no READY node; {back}")
            elif not s.registered:
                b.pend(job, PendingKind.FITS_NOWHERE, f"{self.name}: fits nowhere: no GPU type in the cluster")
            else:
                self._never(job)
            return False
        if self.art:
            return self._fit_type(job, t)
        return self._fit_cluster(job)

    # --------------------------------------------------------------- artifact: one pool per type

    def _fit_type(self, job: JobView, t: str) -> bool:
        ctx, b = self.ctx, self.b
        members = self.pool(t)
        order = sorted([(self.deadline(a.job), i, a.job, a.gpus) for i, a in enumerate(members)]
                       + [(self.deadline(job), len(members), job, 0)], key=lambda x: (x[0], x[1]))
        total = ctx.total_gpus(t)
        shares: dict[str, int] = {}
        for _, _, j, cur in order:
            m = self.min_share(j, t, cur)
            if m == 0 or m > total:
                if m == 0 and j is job and (back := self.waits_for(job)):
                    b.pend(job, PendingKind.NO_ROOM_NOW, f"{self.name}: waiting for nodes: no share of the READY "
                                                         f"{t} serves it; {back}")
                    return False
                why = (f"the minimum shares exceed the {ctx.total_gpus(t)} {t}" if m
                       else self.refusal(job, t) if j is job else "no share meets its deadline")
                b.pend(job, PendingKind.NO_ROOM_NOW, f"{self.name}: not admitted on {t}: {why}")
                return False
            shares[j.id] = m
            total -= m
        jobs = {a.job.id: a.job for a in members}
        jobs[job.id] = job
        left = total
        while left > 0:
            best: tuple[float, str] | None = None
            for jid in [a.job.id for a in members] + [job.id]:
                n = shares[jid]
                if n > left or n >= self.max_gpus or jobs[jid].opaque:
                    continue
                gain = self.thr_dp(jobs[jid], t, 2 * n) - self.thr_dp(jobs[jid], t, n)
                if best is None or gain > best[0]:
                    best = (gain, jid)
            if best is None or best[0] <= -1e9:
                break
            left -= shares[best[1]]
            shares[best[1]] *= 2
        # Place the whole type again: multi-node jobs on whole nodes in node order, then first fit.
        saved = [(a, a.slices) for a in members]
        for a in members:
            b.release(a)
        pool = ctx.state.pools[t]
        cap = pool.max_cap
        order_j = sorted([*members, None], key=lambda a: -shares[a.job.id if a else job.id])
        nodes = [g for g in pool.groups if len(g.free) == g.capacity]
        partial = [g for g in pool.groups if 0 < len(g.free) < g.capacity]
        placed: dict[str, tuple[Slice, ...]] = {}
        ok = True
        free_nodes = list(nodes)
        for mem in order_j:
            jid = mem.job.id if mem else job.id
            n = shares[jid]
            if n <= cap:
                continue
            # A power of two takes whole nodes; an opaque count (6 on 4-GPU nodes) its even split.
            per = cap if n % cap == 0 else n // max(ctx.ideal_nodes(t, n), 1)
            fit = [g for g in free_nodes if len(g.free) >= per]
            k = n // per
            if n % per or len(fit) < k:
                ok = False
                break
            use = fit[:k]
            free_nodes = [g for g in free_nodes if all(g is not u for u in use)]
            placed[jid] = tuple(Slice(g.node_id, tuple(g.free[:per])) for g in use)
            for g in use:
                ctx.state.take((Slice(g.node_id, tuple(g.free[:per])),), t)
        if ok:
            rest = sorted(partial + free_nodes, key=lambda g: g.order)
            for g in rest:
                for mem in order_j:
                    jid = mem.job.id if mem else job.id
                    if jid in placed or shares[jid] > cap:
                        continue
                    if shares[jid] <= len(g.free):
                        one: tuple[Slice, ...] = (Slice(g.node_id, tuple(g.free[:shares[jid]])),)
                        ctx.state.take(one, t)
                        placed[jid] = one
            ok = len(placed) == len(members) + 1
        if not ok:
            for got in placed.values():
                ctx.state.release(got, t)
            for a, before in saved:
                ctx.state.take(before, t)
            b.pend(job, PendingKind.NO_ROOM_NOW,
                   f"{self.name}: admitted on {t} but its GPUs could not be laid out; waiting")
            return False
        for a in members:
            now_sl = placed[a.job.id]
            if now_sl != a.slices:
                a.note = f"re-placed by {self.name} when {job.id} was admitted"
            a.slices = now_sl
            a.gpus = shares[a.job.id]
            a.est = ctx.best(a.job, t, a.gpus, len(now_sl))
        ctx.state.release(placed[job.id], t)
        b.start(job, t, placed[job.id], f"admitted (minimum share {self.min_share(job, t, 0)}), "
                                        f"elastic share {shares[job.id]}")
        return True

    # --------------------------------------------------------------- paper: one pool for the cluster

    def _fit_cluster(self, job: JobView) -> bool:
        ctx, b = self.ctx, self.b
        types = ctx.types()
        total = sum(ctx.total_gpus(t) for t in types)
        if self._need is None:  # the minimum shares of the admitted jobs, once per round
            self._need = sum(self.min_share(a.job, a.gpu_type, a.gpus) or a.gpus for a in b.allocs.values())
        need = self._need
        m = 0
        for t in types:
            mm = self.min_share(job, t, 0)
            if mm and (m == 0 or mm < m):
                m = mm
        if m == 0 and (back := self.waits_for(job)):
            b.pend(job, PendingKind.NO_ROOM_NOW, f"{self.name}: waiting for nodes: no share of the READY nodes "
                                                 f"serves it; {back}")
            return False
        if m == 0:
            # No share will ever do (memory does not shrink, the deadline only nears, and no registered
            # node, once back, holds a share that fits): declined, as ElasticFlow's admission control
            # declines a job it cannot serve.
            b.drop(job, f"{self.name}: declined: {self.refusal(job)}")
            return False
        if need + m > total:
            b.pend(job, PendingKind.NO_ROOM_NOW,
                   f"{self.name}: not admitted: the minimum shares would exceed the cluster's {total} GPUs")
            return False
        # Start at the minimum share on the type with the most free GPUs (type-blind), then grow.
        order = sorted(types, key=lambda t: (-ctx.state.free_gpus(t), types.index(t)))
        mins = {t: mm for t in order if (mm := self.min_share(job, t, 0))}
        for t, mm in mins.items():
            sl = b.place(t, mm)
            if sl is not None and ctx.throughput(job, t, mm, len(sl)) > 0:
                b.start(job, t, sl, f"admitted with its minimum share {mm}")
                self._need = need + mm
                return True
        gpus = set(mins.values())
        what = (f"{m} free GPU{'s' if m > 1 else ''} together" if len(gpus) == 1 else
                f"its minimum share free together ({' or '.join(f'{n} x {t}' for t, n in sorted(mins.items()))})")
        b.pend(job, PendingKind.NO_ROOM_NOW, f"{self.name}: admitted (minimum share {m}) but no GPU type it may use "
                                             f"has {what}; {free_text(ctx)}")
        return False

    def supply(self, job: JobView) -> why_not.Supply:
        """The job's GPUs, registered and READY, by type it may use; a share has at most 16 GPUs in
        the artifact's mode (an opaque job: its count, up to the round's per-job cap)."""
        cap = MAX_GPUS if self.art and not job.opaque else self.ctx.config.max_gpus_per_job
        return why_not.supply(job, self.ctx.snap, {t: self.ctx.total_gpus(t) for t in self.ctx.types()}, cap)

    def refusal(self, job: JobView, t: str = "", ready: bool = True) -> str:
        """Why no share serves the job, on t (the artifact's one type; "": any type it may use), the
        first cause that holds: the cluster has none of its types, or too few GPUs of one for an
        opaque job's count (why_not); an opaque count no layout of the READY nodes splits evenly;
        memory, over the registered GPUs (the fewest it fits on, by the estimates); else what the
        power-of-two shares of the READY GPUs (`ready`; else of the registered ones, none of which
        runs it) do (`no_share`)."""
        ctx = self.ctx
        s = self.supply(job)
        if (cause := why_not.type_cause(job, ctx.snap, s)) and cause[0]:
            return cause[1]
        if t:
            s = s.only(t)
        if job.opaque:
            return why_not.opaque_cause(ctx, job, s) or f"{why_not.opaque_what(opaque.gpus_of(job))}: no READY node holds it"
        few = why_not.fewest(ctx, job, sorted(s.registered))
        if memory := why_not.memory_cause(s, few):
            return memory
        most = {u: min(self.max_gpus, c) if ready else s.limit(s.registered[u])
                for u, c in (s.ready if ready else s.registered).items()}
        tried = [(n, self.share(job, u, n, ready and self.it_dp(job, u, n) > 0)) for u in most for n in _powers(most[u])]
        return self.no_share(tried, max(most.values(), default=0), s, few)

    def share(self, job: JobView, t: str, n: int, runs: bool) -> str:
        """What n GPUs of t do for the job: "runs" (a data-parallel Cell of it: only its deadline may
        refuse it), "memory" (its replica does not fit, or the estimates fit it in memory on more GPUs
        only), "cell" (the estimates have no Cell of it)."""
        if runs:
            return "runs"
        fewest = self.ctx.gpu_counts(job, t)
        return "memory" if not self.ctx.dp_fits(job, t, n) or (fewest and n < fewest[0]) else "cell"

    def no_share(self, tried: list[tuple[int, str]], most: int, s: why_not.Supply, few: dict[str, int]) -> str:
        """Why none of the shares `tried` (`share`'s, of at most `most` GPUs) serves the job, the first
        that holds of some share: one runs but misses its deadline; the estimates have no Cell of one
        (with the fewest GPUs it fits on, `few`); none fits in memory."""
        span = (f"1-{most} GPUs" if most > 1 else "1 GPU") + ("" if self.art else " of any type")
        did = {what for _, what in tried}
        if "runs" in did:
            return f"no data-parallel share of {span} meets its deadline"
        if "cell" in did:
            return f"the estimates have no Cell of a data-parallel share of {span}" + (
                f"; {why_not.fewest_text(s, few)}" if few else "")
        return f"no data-parallel share of {span} fits its memory"

    def _never(self, job: JobView) -> None:
        """No READY node and no registered one that, back, would serve the job (`waits_for`): what it
        gets with every registered node READY, declined (paper) or not admitted on its type (the
        artifact lets it wait). A share with a Cell that fits is one `waits_for` waits for: none runs."""
        reg = self.supply(job).registered
        pinned = self.art and not job.opaque  # (an opaque job takes any type it may use that runs its count)
        t = (job.gpu_type_hint if job.gpu_type_hint in reg else min(reg, default="")) if pinned else ""
        why = self.refusal(job, t, ready=False)
        if self.art:
            self.b.pend(job, PendingKind.NO_ROOM_NOW, f"{self.name}: not admitted{f' on {t}' if t else ''}: {why}")
        else:
            self.b.drop(job, f"{self.name}: declined: {why}")

    def registered(self) -> why_not.Supply:
        """The cluster's GPUs by type, READY or not; shares up to 16 GPUs in the artifact's mode."""
        return why_not.Supply(why_not.by_type(self.ctx.snap), {}, MAX_GPUS if self.art else 0)

    def waits_for(self, job: JobView) -> str:
        """What the job waits for where no share of the READY nodes serves it: the smallest share of
        each registered type it may use (the one it asks for in the artifact's mode; an opaque job's
        count, of any) that the READY nodes cannot hold, the registered ones can, and that fits its
        memory (data-parallel too), by the estimates, which cover the registered pools; "" when none.
        Whether it meets a deadline takes READY nodes to time, so such a job waits rather than being
        declined."""
        ctx = self.ctx
        s = self.supply(job)
        pinned = self.art and not job.opaque and job.gpu_type_hint in s.registered
        types = [t for t in ([job.gpu_type_hint] if pinned else sorted(s.registered)) if job.may_use(t)]
        shares = [opaque.gpus_of(job)] if job.opaque else _powers(max(s.registered.values(), default=0))
        first: dict[str, int] = {}
        for t, n in why_not.if_back(ctx, job, s, ((t, n) for t in types for n in shares)):
            if t not in first and ctx.dp_fits(job, t, n):
                first[t] = n
        return why_not.back_text(ctx, s, first.items()) if first else ""

    def pays(self, job: JobView, t: str, n: int) -> bool:
        """Whether doubling the job from n GPUs of t saves, over the iterations it has left, at least
        the restart it costs (ElasticFlow grows on any gain; one of 0.1% restarted a job a second
        after it started)."""
        it, it2 = self.it_dp(job, t, n), self.it_dp(job, t, 2 * n)
        cost = self.ctx.snap.restart_cost_s or restart_s(2 * n)
        return it > 0 and it2 > 0 and job.remaining_iterations * (it - it2) >= cost

    def _grow(self) -> None:
        """Spare GPUs to the largest marginal return per GPU, one doubling at a time, where it pays
        for its restart (`pays`); a job whose doubling does not fit now is not tried again this
        round. An opaque job is never grown."""
        ctx, b = self.ctx, self.b
        skip: set[str] = set()
        while True:
            best: tuple[float, int, Alloc] | None = None
            cands = []
            for i, a in enumerate(sorted(b.allocs.values(), key=lambda a: queue_key(a.job))):
                if 2 * a.gpus > self.max_gpus or a.job.id in skip or a.job.opaque:
                    continue
                g = (self.thr_dp(a.job, a.gpu_type, 2 * a.gpus) - self.thr_dp(a.job, a.gpu_type, a.gpus)) / a.gpus
                if g > 0 and (a.orig is None or self.pays(a.job, a.gpu_type, a.gpus)):
                    cands.append((g, i, a))
            cands.sort(key=lambda c: (-c[0], c[1]))
            for g, i, a in cands:
                tr = b.trial()
                tr.give(b.parts(a))
                if tr.fits(a.gpu_type, 2 * a.gpus):
                    best = (g, i, a)
                    break
                skip.add(a.job.id)
            if best is None:
                return
            a = best[2]
            if 4 * a.gpus > self.max_gpus:
                skip.add(a.job.id)
            b.release(a)
            sl = b.place(a.gpu_type, 2 * a.gpus)
            if sl is None or ctx.throughput(a.job, a.gpu_type, 2 * a.gpus, len(sl)) <= 0:
                ctx.state.take(a.slices, a.gpu_type)
                return
            b.reassign(a, a.gpu_type, sl, "scaled up by ElasticFlow's marginal-return doubling", already_released=True)


def restart_s(gpus: int) -> float:
    """What a restart on `gpus` GPUs costs a job, as the Crius artifact charges baselines."""
    return min(RESTART_PER_GPU * gpus, RESTART_CAP)


def _powers(most: int) -> list[int]:
    """The power-of-two shares of at most `most` GPUs: 1, 2, 4, ..."""
    return [1 << k for k in range(most.bit_length())]
