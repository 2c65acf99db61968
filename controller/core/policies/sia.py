"""Sia (SOSP'23) as a baseline: goodput-optimised configurations per GPU type (docs/reference/baselines.md
Sec. 5).

Configurations are (GPU type, count). "artifact": count in 1, 2, 4, 8, 16, as Crius's `SiaSched`.
"paper": Sia's own set (sia-simulator `CONFIGS_4GPU/8GPU`): powers of two up to one node's GPUs, then
whole nodes (2, 3, ... nodes) up to the type's total, so a job that needs more than 16 GPUs (LLaMA-30B
on Morphling's cluster: 24 GPUs at least) has a configuration.
A job's goodput G_ic is its throughput in configuration c (no statistical efficiency: the batch is
the user's, as Crius keeps it), normalised by the row's smallest positive value.

- "artifact" (Crius `SiaSched`, baselines/sia_sched.py): on each arrival the program
  max sum_i sum_c A_ic min((N_min G_ic / min_c G_ic x f_i)^p, 3000) + (1 + allocated(new)), p = +0.5,
  with the reallocation factor f_i = max((T_i - N_i S) / (T_i + S), 0.01) (S = 600 s, T_i the
  job's age, N_i its reschedules; 0.01 for the new job); running jobs non-preemptive (each keeps
  one configuration) and, as the artifact applies only type changes to them, at most 5 of them
  change GPU type at their count; the GPUs of each type within its total; the new job must be
  allocated. Changed jobs are placed again (best locality, then relaxed, most idle nodes first);
  waiting jobs are retried in rounds with departures, with the data-parallel memory check, and
  block nothing; a new job no type can run is dropped.
- In both modes a job whose configurations only registered nodes that are not READY hold waits for
  them, neither dropped nor "fits nowhere" (the configurations of a type whose nodes are all down:
  powers of two up to its registered GPUs).
- In both modes an opaque job (docs/opaque-jobs.md) has one configuration per type it allows: the GPUs
  it asked for, whatever the mode's counts (3 GPUs is none of them), so it is never scaled.
- "paper" (Sia Eq. 1 at p = -0.5, lambda = 1.1): every round, minimise sum_i G_i^p over allocated
  jobs plus lambda per unallocated job, with the same restart factor; waiting jobs start on their
  smallest configuration, on the fewest nodes the estimates cover; one that does not fit starts on
  GPUs a running job gives back by halving when that adds less to the objective than its lambda
  takes away; a job grows at most 2x per round.

Simplifies: both programs are solved by bounded local search (the artifact's: at most 5 moves, 12
best per level, instead of GLPK with a 30 s limit; T_i is the job's age, not its execution time; the
paper's: one greedy pass of start (halving at most one running job per waiting job) / double /
change type per job, best first),
not a MILP solver; restart costs come from the rules of the simulation, not Sia's per-model table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tessera.controller.core import opaque
from tessera.controller.core.placement import BEST_FIT, SCATTER, quotas
from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Alloc, Board, free_text, place_as_requested
from tessera.controller.core.policy import Mode, RoundContext, queue_key
from tessera.controller.core.snapshot import Decision, JobView, PendingKind, Slice

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT
COUNTS = (1, 2, 4, 8, 16)
S_RESTART = 600.0
BONUS = 1e3
MAX_MOVES = 5
BRANCH = 12
CLIP = 3000.0
NODE_BUDGET = 2000  # search nodes per admission
LAMBDA = 1.1
WAITS = "sia: waiting for nodes: no configuration is feasible on the READY nodes; "
MAX_DONOR_TRIALS = 16  # halvings tried per waiting job and configuration (placement checks)


def sia_counts(per_node: int, total: int) -> tuple[int, ...]:
    """Sia's configurations of one type (sia-simulator `CONFIGS_8GPU` = 1, 2, 4, 8, 16, 24, ... 64
    on 8-GPU nodes): powers of two up to a node, then every whole number of nodes up to `total`."""
    out: list[int] = []
    n = 1
    while n <= min(per_node, total):
        out.append(n)
        n *= 2
    k = 2
    while per_node > 0 and k * per_node <= total:
        out.append(k * per_node)
        k += 1
    return tuple(out)


def _asked(job: JobView) -> int:
    """The count an opaque job asked for (its only configuration), 0 for any other job."""
    return opaque.gpus_of(job) if job.opaque else 0


def _counts_text(counts: list[int], t: str) -> str:
    """"1, 2, 4 or 8 x A100-80GB" ("" for none); a long list keeps its ends: "1, 2, ... or 160 x T"."""
    if not counts:
        return ""
    head = counts[:2] if len(counts) > 5 else counts[:-1]
    more = ", ..." if len(counts) > 5 else ""
    return (f"{', '.join(map(str, head))}{more} or " if head else "") + f"{counts[-1]} x {t}"


def _check(ok: Callable[[JobView, str, int, int], bool], job: JobView, t: str, n: int) -> Callable[[int], bool]:
    return lambda k: ok(job, t, n, k)


@dataclass(frozen=True)
class SiaOptions:
    """Sia has no options besides the mode."""


class SiaPolicy:
    def __init__(self, mode: Mode = PAPER) -> None:
        self.mode = Mode(mode)

    @property
    def name(self) -> str:
        return "sia"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        b = Board(ctx, self.name)
        s = _Sia(b, self.mode == ARTIFACT)
        if self.mode == ARTIFACT:
            s.artifact_round()
        else:
            s.paper_round()
        return b.decisions(opportunistic=False)


Config = tuple[str, int]


class _Sia:
    def __init__(self, b: Board, art: bool) -> None:
        self.b = b
        self.ctx = b.ctx
        self.art = art
        self.p = 0.5 if art else -0.5
        # Jobs of one model, batch and type restriction share their table (a long queue holds
        # thousands of jobs but few distinct models); read-only, valid for this round. An opaque
        # job's count is in the key: its configurations are that count only, and a JobView built
        # without `opaque_key` shares its placeholder model's key with every other opaque job.
        self._configs: dict[tuple[str, int, tuple[str, ...], int], tuple[dict[Config, float], list[Config]]] = {}
        self._raw: dict[tuple[str, int, int], dict[Config, float]] = {}  # goodputs' throughputs, likewise
        self._nowhere: dict[tuple[str, int, tuple[str, ...], int], str] = {}  # reasons' causes, likewise
        self._waiting: dict[tuple[str, int, tuple[str, ...], int], str] = {}

    def _table(self, job: JobView) -> tuple[dict[Config, float], list[Config]]:
        k = (job.key, job.global_batch_size, job.gpu_types, _asked(job))
        got = self._configs.get(k)
        if got is None:
            tab = self._configs_of(job)
            fewest = min((n for _, n in tab), default=0)
            got = self._configs[k] = (tab, sorted((c for c in tab if c[1] == fewest), key=lambda c: -tab[c]))
        return got

    def configs(self, job: JobView) -> dict[Config, float]:
        """Normalised goodput of each feasible configuration."""
        return self._table(job)[0]

    def smallest(self, job: JobView) -> list[Config]:
        """The configurations with the fewest GPUs, highest goodput first."""
        return self._table(job)[1]

    def _configs_of(self, job: JobView) -> dict[Config, float]:
        ctx = self.ctx
        out: dict[Config, float] = {}
        for t in ctx.types():
            if not job.may_use(t):
                continue
            for n in self.counts_of(job, t):
                if n > ctx.total_gpus(t) or (ctx.config.max_gpus_per_job and n > ctx.config.max_gpus_per_job):
                    continue
                if self.art and not ctx.dp_fits(job, t, n):
                    continue
                g = ctx.throughput(job, t, n, ctx.ideal_nodes(t, n))
                if g > 0:
                    out[(t, n)] = g
        if out:
            lo = min(out.values())
            out = {k: v / lo for k, v in out.items()}
        return out

    def counts(self, t: str) -> tuple[int, ...]:
        """GPU counts of the configurations of type t (see the module's docstring)."""
        if self.art:
            return COUNTS
        return sia_counts(self.ctx.max_per_node(t), self.ctx.total_gpus(t))

    def counts_of(self, job: JobView, t: str, registered: int | None = None) -> tuple[int, ...]:
        """The job's configurations' GPU counts on type t: `counts`, or the count an opaque job asked
        for. `registered`: those once the type's registered GPUs (READY or not) are all back, its
        nodes as large as its READY ones (as the registered GPUs when none is READY)."""
        if job.opaque:
            return (opaque.gpus_of(job),)
        if self.art:
            return COUNTS
        if registered is not None:
            return sia_counts(self.ctx.max_per_node(t) or registered, registered)
        return self.counts(t)

    def waits_for(self, job: JobView, count: int = 0) -> str:
        """What the job waits for where registered nodes, once back, would run it (why_not.if_back):
        its configurations of each registered type (`counts_of` with its registered GPUs; `count`:
        that count of each); "" when none."""
        s = why_not.round_supply(self.ctx, job)
        back = why_not.if_back(self.ctx, job, s, ((t, n) for t, c in s.registered.items()
                                                  for n in ((count,) if count else self.counts_of(job, t, c))))
        return why_not.back_text(self.ctx, s, back) if back else ""

    def nowhere(self, job: JobView) -> str:
        """"fits nowhere: no configuration is feasible", with the cause where one is known: the
        cluster's (why_not: types missing, an opaque count more than a type or a job may have), an
        opaque count no layout of its type's nodes splits evenly, or memory (the fewest GPUs it fits
        on, when no configuration holds that many or the estimates have no Cell of them; or that no
        count of its types does)."""
        k = (job.key, job.global_batch_size, job.gpu_types, _asked(job))
        why = self._nowhere.get(k)
        if why is None:
            why = self._nowhere[k] = self._nowhere_cause(job)
        return "sia: fits nowhere: no configuration is feasible" + (f"; {why}" if why else "")

    def _nowhere_cause(self, job: JobView) -> str:
        ctx = self.ctx
        s = why_not.round_supply(ctx, job)
        cause = why_not.type_cause(job, ctx.snap, s)
        if cause and cause[0]:
            return cause[1]
        types = [t for t in ctx.types() if job.may_use(t)]
        if job.opaque:
            return why_not.opaque_cause(ctx, job, s)
        few = why_not.fewest(ctx, job, sorted(s.registered))
        if not few:  # "no count of A100-80GB GPUs fits it (out of memory or ...)", as gavel says
            return why_not.memory_cause(s, few)
        if memory := why_not.memory_cause(s, few):
            return memory
        # Within the registered GPUs on some type (memory_cause): its configurations there have no Cell.
        cap = 0 if self.art else ctx.config.max_gpus_per_job
        tried = [_counts_text([n for n in self.counts_of(job, t) if n <= ctx.total_gpus(t) and not (cap and n > cap)], t)
                 for t in types if t in few]
        no_cell = f"the estimates have no Cell of {' or '.join(x for x in tried if x)}; " if any(tried) else ""
        return no_cell + why_not.fewest_text(s, few)

    def waiting(self, job: JobView) -> str:
        """Why a waiting job did not start this round (paper): a job starts only on its smallest
        configurations (the fewest GPUs of any type), none of which fits the free GPUs, and no halving
        of a running job both pays for one (Eq. 1) and makes room for it."""
        k = (job.key, job.global_batch_size, job.gpu_types, _asked(job))
        head = self._waiting.get(k)
        if head is None:
            small = self.smallest(job)
            on = {t for t, _ in small}
            least: dict[str, int] = {}
            for t, n in self.configs(job):
                if t not in on:
                    least[t] = min(least.get(t, n), n)
            others = [f"{t}: {f'{least[t]} GPUs at least' if t in least else 'none'}"
                      for t in self.ctx.types() if job.may_use(t) and t not in on]
            head = self._waiting[k] = (
                f"sia: waiting for its smallest configuration {' or '.join(f'{n} x {t}' for t, n in small)}, "
                f"the only {'ones' if len(small) > 1 else 'one'} it starts on"
                + (f" ({'; '.join(others)})" if others else "")
                + ": it does not fit the free GPUs, and no halving of a running job that pays for it makes room")
        return f"{head}; {free_text(self.ctx)}"

    def restart_factor(self, job: JobView) -> float:
        age = max(0.0, self.ctx.snap.now - job.submit_time)
        return max(0.0, (age - job.restarts * S_RESTART) / (age + S_RESTART)) if age + S_RESTART > 0 else 0.0

    # ------------------------------------------------------------------ artifact

    def artifact_round(self) -> None:
        ctx, b = self.ctx, self.b
        departures = ctx.snap.departures > 0 or ctx.snap.arrivals is None
        if departures:  # the artifact's restart trial blocks no type
            for j in [j for j in ctx.pending if j.id not in ctx.arrivals]:
                self.admit(j, dp_check=True)
        for j in ctx.pending:
            if j.id not in ctx.arrivals:
                continue
            n = j.gpus_hint or 1
            if (not any(ctx.throughput(j, t, n, ctx.ideal_nodes(t, n)) > 0 for t in ctx.types() if j.may_use(t))
                    and not self.waits_for(j, n)):
                b.drop(j, f"sia: dropped: {n} GPUs of no type can run it")
                continue
            self.admit(j, dp_check=False)

    def goodputs(self, job: JobView, factor: float) -> dict[Config, float]:
        """The artifact's `_gen_goodput_matrix` and factors: N_min x G / min G, times the reallocation
        factor, to the power p, clipped at 3,000."""
        ctx = self.ctx
        raw = self._raw.get((job.key, job.global_batch_size, _asked(job)))
        if raw is None:
            raw = self._raw[job.key, job.global_batch_size, _asked(job)] = {}
            for t in ctx.types():
                for n in self.counts_of(job, t):
                    if n > ctx.total_gpus(t):
                        continue
                    g = ctx.throughput(job, t, n, ctx.ideal_nodes(t, n))
                    if g > 0:
                        raw[(t, n)] = g
        if job.gpu_types:  # (the cache spans every type; a review found a job moved to one it does not name)
            raw = {c: v for c, v in raw.items() if job.may_use(c[0])}
        if not raw:
            return {}
        lo = min(raw.values())
        nmin = min(n for _, n in raw)
        return {c: min((nmin * v / lo * factor) ** self.p, CLIP) for c, v in raw.items()}

    def realloc_factor(self, job: JobView, running: bool) -> float:
        if not running:
            return 0.01
        age = max(0.0, self.ctx.snap.now - job.submit_time)
        return max((age - (job.restarts + 1) * S_RESTART) / (age + S_RESTART), 0.01)

    def admit(self, job: JobView, dp_check: bool) -> bool:
        """Admission by the artifact's program: running jobs may change GPU type at their count (at
        most 5 of them), the new job takes any configuration; maximise the sum of goodputs plus 1
        for allocating the new job; GPUs of each type within its total."""
        ctx, b = self.ctx, self.b
        types = ctx.types()
        cap = {t: ctx.total_gpus(t) for t in types}
        use = dict.fromkeys(types, 0)
        rows: list[tuple[Alloc, dict[Config, float]]] = []
        for a in sorted(b.allocs.values(), key=lambda a: queue_key(a.job)):
            use[a.gpu_type] += a.gpus
            rows.append((a, self.goodputs(a.job, self.realloc_factor(a.job, True))))
        moves_from: dict[str, list[tuple[float, int, str]]] = {t: [] for t in types}
        positive: list[tuple[float, int, str]] = []
        for i, (a, tab) in enumerate(rows):
            here = tab.get((a.gpu_type, a.gpus), 0.0)
            for t in types:
                if t != a.gpu_type and (t, a.gpus) in tab:
                    g = tab[(t, a.gpus)] - here
                    moves_from[a.gpu_type].append((g, i, t))
                    if g > 0:
                        positive.append((g, i, t))
        for lst in moves_from.values():
            lst.sort(key=lambda m: (-m[0], m[1], m[2]))
        positive.sort(key=lambda m: (-m[0], m[1], m[2]))
        max_pos = positive[0][0] if positive else 0.0
        newtab = self.goodputs(job, self.realloc_factor(job, False))
        if not newtab and (back := self.waits_for(job)):
            b.pend(job, PendingKind.NO_ROOM_NOW, WAITS + back)
            return False
        if not newtab:
            b.pend(job, PendingKind.FITS_NOWHERE, self.nowhere(job))
            return False
        best: list[tuple[float, Config, list[tuple[int, str]]]] = []
        visits = [0]

        def dfs(use: dict[str, int], val: float, mv: list[tuple[int, str]], c_new: Config) -> None:
            visits[0] += 1
            if visits[0] > NODE_BUDGET or not ctx.spend():
                return
            over = [t for t in types if use[t] > cap[t]]
            if not over and (not best or val > best[0][0]):
                best[:] = [(val, c_new, list(mv))]
            if len(mv) >= MAX_MOVES:
                return
            if not over and best and val + (MAX_MOVES - len(mv)) * max_pos <= best[0][0]:
                return
            moved = {i for i, _ in mv}
            k = 0
            for g, i, t in (moves_from[over[0]] if over else positive):
                if i in moved:
                    continue
                a = rows[i][0]
                if use[t] + a.gpus > cap[t]:
                    continue
                k += 1
                if k > (BRANCH if not mv else 3):
                    break
                use2 = dict(use)
                use2[a.gpu_type] -= a.gpus
                use2[t] += a.gpus
                dfs(use2, val + g, [*mv, (i, t)], c_new)

        for cfg in sorted(newtab, key=lambda c: (-newtab[c], c)):
            if best and 1 + newtab[cfg] + MAX_MOVES * max_pos <= best[0][0]:
                continue
            use2 = dict(use)
            use2[cfg[0]] += cfg[1]
            dfs(use2, 1 + newtab[cfg], [], cfg)
        if not best:
            b.pend(job, PendingKind.NO_ROOM_NOW, "sia: not admitted: no feasible program")
            return False
        _, c_new, mv = best[0]
        changed = [(rows[i][0], t) for i, t in mv]

        def ok(j: JobView, t: str, n: int, k: int) -> bool:
            return (not dp_check or ctx.dp_fits(j, t, n)) and ctx.throughput(j, t, n, k) > 0

        saved = [(a, a.gpu_type, a.slices) for a, _ in changed]
        for a, _ in changed:
            b.release(a)
        done: list[Alloc] = []
        good = True
        for a, t in changed:
            sl = place_as_requested(b, a.job, t, a.gpus, SCATTER, True, _check(ok, a.job, t, a.gpus))
            if sl is None:
                good = False
                break
            ctx.state.take(sl, t)
            a.gpu_type, a.slices = t, sl
            done.append(a)
        t_new, n_new = c_new
        target = place_as_requested(b, job, t_new, n_new, SCATTER, True, _check(ok, job, t_new, n_new)) \
            if good else None
        if target is None:
            for a in done:
                ctx.state.release(a.slices, a.gpu_type)
            for a, t0, sl0 in saved:
                a.gpu_type, a.slices = t0, sl0
                ctx.state.take(sl0, t0)
            b.pend(job, PendingKind.NO_ROOM_NOW,
                   f"sia: admitted to {n_new} x {t_new} but the placement failed; waiting")
            return False
        for a in done:
            a.est = ctx.best(a.job, a.gpu_type, a.gpus, len(a.slices))
            a.note = f"GPU type changed by Sia when {job.id} was admitted"
        b.start(job, t_new, target, f"Sia configuration {n_new} x {t_new} ({len(changed)} jobs change type)")
        return True

    # ------------------------------------------------------------------ paper

    def cost(self, job: JobView, cfg: Config | None, cur: Config | None, tab: dict[Config, float]) -> float:
        if cfg is None or cfg not in tab:
            return LAMBDA
        c: float = tab[cfg] ** self.p
        if cur is not None and cfg != cur:
            r = self.restart_factor(job)
            c = c / r if r > 0 else LAMBDA * 10
        return c

    def donor_list(self, t: str) -> list[tuple[float, str]]:
        """Running jobs of type t that could give half their GPUs back, with what halving adds to
        the objective (restart factor included), least first."""
        out: list[tuple[float, str]] = []
        for a in self.b.allocs.values():
            if a.orig is None or a.gpu_type != t or a.gpus < 2 or a.gpus % 2:
                continue
            tab = self.configs(a.job)
            cur, half = (t, a.gpus), (t, a.gpus // 2)
            if half in tab:
                out.append((self.cost(a.job, half, cur, tab) - self.cost(a.job, cur, cur, tab), a.job.id))
        out.sort()
        return out

    def make_room(self, job: JobView, donors: dict[str, list[tuple[float, str]]], moved: set[str]) -> str:
        """Eq. 1's trade at the head of the queue: an unallocated job costs lambda, so halving a
        running job is worth it when the objective falls by more than the halving adds. Starts the
        job on GPUs one halving frees and returns their type; "" when no halving pays or fits."""
        b = self.b
        tab = self.configs(job)
        for t, n in self.smallest(job):
            gain = LAMBDA - self.cost(job, (t, n), None, tab)
            if gain <= 0:
                continue
            if t not in donors:
                donors[t] = self.donor_list(t)
            tried = 0
            for loss, jid in donors[t]:
                if loss >= gain - 1e-9 or tried >= MAX_DONOR_TRIALS:
                    break
                a = b.allocs.get(jid)
                if jid in moved or a is None or a.gpu_type != t:
                    continue
                tried += 1
                tr = b.trial()
                rel, _, freed = b.shrink_parts(a)
                tr.give(rel)
                if not tr.fits(t, n):
                    continue
                b.ctx.state.release(freed, t)
                sl = self.place(job, t, n)
                if sl is None:  # fits by count, but on no node count the job can run on
                    b.ctx.state.take(freed, t)
                    continue
                b.shrink(a, f"halved by Sia to start {job.id}", released=True)
                moved.add(jid)
                b.start(job, t, sl, f"Sia: starts on its smallest configuration {n} x {t} "
                                    f"(GPUs of {jid}, halved: the objective falls by {gain - loss:.3f})")
                return t
        return ""

    def place(self, job: JobView, t: str, n: int, full: set[tuple[str, int, int]] | None = None,
              ) -> tuple[Slice, ...] | None:
        """n GPUs of type t on the fewest nodes the job can run on (a configuration's goodput is
        its best locality's; a job put on a spread the estimates do not cover would not run).
        `full`: (type, GPUs, nodes) that did not fit earlier while GPUs were only taken."""
        ctx = self.ctx
        for q in quotas(n, ctx.max_per_node(t)):
            k = n // q
            if (full is not None and (t, n, k) in full) or ctx.throughput(job, t, n, k) <= 0:
                continue
            sl = ctx.state.place(t, n, 1, BEST_FIT, nodes=k)
            if sl is not None:
                return sl
            if full is not None:
                full.add((t, n, k))
        return None

    def paper_round(self) -> None:
        ctx, b = self.ctx, self.b
        # 1) waiting jobs start on their cheapest-to-hold configuration (1 GPU first), FIFO.
        # Starting jobs only takes GPUs, so a placement that did not fit stays full until a halving
        # gives GPUs of its type back: a long queue is not placed job by job against a full cluster.
        full: set[tuple[str, int, int]] = set()
        moved: set[str] = set()
        donors: dict[str, list[tuple[float, str]]] = {}
        for j in list(ctx.pending):
            tab = self.configs(j)
            if not tab and (back := self.waits_for(j)):
                b.pend(j, PendingKind.NO_ROOM_NOW, WAITS + back)
                continue
            if not tab:
                b.pend(j, PendingKind.FITS_NOWHERE, self.nowhere(j))
                continue
            for t, n in self.smallest(j):
                sl = self.place(j, t, n, full)
                if sl is not None:
                    b.start(j, t, sl, f"Sia: starts on its smallest configuration {n} x {t}")
                    break
            else:
                t_room = self.make_room(j, donors, moved)
                if t_room:
                    full = {c for c in full if c[0] != t_room}  # a shrink gave GPUs of this type back
                else:
                    b.pend(j, PendingKind.NO_ROOM_NOW, self.waiting(j))
        # 2) one pass of improvements, best first: double (at most 2x per round) or change type.
        cands: list[tuple[float, str, Config]] = []
        for a in b.allocs.values():
            tab = self.configs(a.job)
            cur = (a.gpu_type, a.gpus)
            here = self.cost(a.job, cur, cur, tab)
            for cfg in tab:
                if cfg == cur or cfg[1] > 2 * a.gpus:
                    continue
                d = here - self.cost(a.job, cfg, cur, tab)
                if d > 1e-9:
                    cands.append((d, a.job.id, cfg))
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        for _d, jid, (t, n) in cands:
            if jid in moved or jid not in b.allocs:
                continue
            a = b.allocs[jid]
            tr = b.trial()
            tr.give(b.parts(a))
            if not tr.fits(t, n):
                continue
            b.release(a)
            sl = self.place(a.job, t, n)
            if sl is None:
                ctx.state.take(a.slices, a.gpu_type)
                continue
            b.reassign(a, t, sl, "Sia's goodput objective prefers this configuration", already_released=True)
            moved.add(jid)
