from tessera.controller.core.attempts import EXIT_UNKNOWN, RankStatus, Verdict, judge


def rs(rank: int, running: bool, code: int = 0, it: int = 0, reason: str = "") -> RankStatus:
    return RankStatus(rank, running, code, reason, it)


def test_starting_until_all_ranks_run() -> None:
    assert judge(2, {0: rs(0, True)}, 10, False).kind == "starting"
    assert judge(2, {0: rs(0, True), 1: rs(1, True)}, 10, False).kind == "running"


def test_success_needs_all_zero_and_iterations() -> None:
    done = {0: rs(0, False, 0, 10), 1: rs(1, False, 0, 10)}
    assert judge(2, done, 10, False).kind == "succeeded"
    early = {0: rs(0, False, 0, 4), 1: rs(1, False, 0, 4)}
    assert judge(2, early, 10, False).kind == "stopped"
    assert judge(2, {0: rs(0, False, 0, 10), 1: rs(1, True)}, 10, False).kind == "starting"


def test_failures_and_signals() -> None:
    v = judge(2, {0: rs(0, True), 1: rs(1, False, 3, reason="bad plan")}, 10, False)
    assert v.kind == "failed" and v.reason == "rank 1: exit code 3; bad plan"
    v = judge(1, {0: rs(0, False, -9)}, 10, False)
    assert v.kind == "failed" and "SIGKILL" in v.reason and "out of memory" in v.reason
    assert judge(1, {0: rs(0, False, 127)}, 10, False).reason.startswith("rank 0: exit code 127 (program not found")
    # The keeper could not start it and says why: no guess from the 127 before that.
    why = "spawn failed: cannot run '/tmp' in /w as uid 1001: [Errno 13] Permission denied: '/tmp', exit code 127"
    assert judge(1, {0: rs(0, False, 127, reason=why)}, 10, False).reason == f"rank 0: {why}"
    assert judge(1, {0: rs(0, False, EXIT_UNKNOWN)}, 10, False).kind == "interrupted"
    # The agent killed it for its disk use (nodeagent/diskuse.py): its reason, not the OOM killer's guess.
    why = "evicted by the agent: the job's files on this node hold 4.0 MiB, over ..., killed by SIGKILL"
    assert judge(1, {0: rs(0, False, -9, reason=why)}, 10, False) == Verdict("failed", f"rank 0: {why}", 0)


def test_requested_stop_ignores_exit_codes() -> None:
    assert judge(2, {0: rs(0, False, -15), 1: rs(1, False, 0)}, 10, True).kind == "stopped"
    assert judge(2, {0: rs(0, False, -15), 1: rs(1, True)}, 10, True).kind == "starting"


def test_a_fenced_rank_interrupts_whatever_its_exit_code() -> None:
    # The keeper stopped it because its agent lost the lease: requeue from the checkpoint, no retry used.
    for code in (0, -15, -9):
        v = judge(2, {0: rs(0, False, code, 4, reason="fenced: no lease renewal for 1.6 s, exit code 0"),
                      1: rs(1, True)}, 10, False)
        assert (v.kind, v.rank) == ("interrupted", 0) and v.reason.startswith("rank 0: fenced: no lease renewal")
    assert judge(1, {0: rs(0, False, 0, 4, reason="fenced: x")}, 10, True).kind == "stopped"


def test_failed_verdict_names_the_rank() -> None:
    v = judge(2, {0: rs(0, True), 1: rs(1, False, 3)}, 10, False)
    assert v.rank == 1 and v.reason == "rank 1: exit code 3"


def test_stalled() -> None:
    from tessera.controller.core.attempts import stalled

    assert stalled(10.0, 0.0, None, True, 30, 60) is None
    assert stalled(31.0, 0.0, None, True, 30, 60) == "not every rank was running 30s after launch"
    assert stalled(59.0, 0.0, None, False, 30, 60) is None
    assert stalled(61.0, 0.0, None, False, 30, 60) == "no progress from rank 0 for 60s since launch (hung?)"
    assert stalled(100.0, 0.0, 50.0, False, 30, 60) is None
    assert stalled(111.0, 0.0, 50.0, False, 30, 60) == "no progress from rank 0 for 60s since its last report (hung?)"
    assert stalled(10_000.0, 0.0, None, False, 30, -1) is None
