"""The coordinator alone (no MPI): readiness, fusion, mismatch messages, stalls, join."""
from trainrun.runtime.messages import Meta
from trainrun.runtime.negotiation import Coordinator
from trainrun.runtime.ops import Average, Sum


def meta(name, kind="allreduce", dtype="float32", shape=(4,), op=Sum, pre=1.0, post=1.0, root=-1, splits=None,
         device="cpu"):
    return Meta(name, kind, dtype, shape, op, pre, post, root, splits, device)


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_ready_only_when_every_rank_submitted_in_completion_order():
    c = Coordinator(2, fusion_threshold=0, stall_timeout=60)
    c.submit(0, [meta("a"), meta("b")])
    assert c.responses() == []
    c.submit(1, [meta("b")])
    c.submit(1, [meta("a")])
    assert [r[1] for r in c.responses()] == [["b"], ["a"]]  # threshold 0: no fusion
    assert not c.pending()


def test_fusion_groups_by_dtype_and_op_up_to_threshold():
    c = Coordinator(2, fusion_threshold=40, stall_timeout=60)  # 40 bytes = ten float32
    metas = [meta("a"), meta("b"), meta("c", dtype="float64"), meta("d", op=Average), meta("e", shape=(8,)),
             meta("f", device="cuda")]
    c.submit(0, metas)
    c.submit(1, metas[::-1])
    responses = c.responses()
    assert all(kind == "allreduce" for kind, *_ in responses)
    # a + b = 32 bytes fit the threshold, e (32 more) does not; other dtype/op/device never fuse
    assert sorted(tuple(names) for _, names, _, _ in responses) == [("b", "a"), ("c",), ("d",), ("e",), ("f",)]


def test_mismatch_names_tensor_field_and_ranks():
    c = Coordinator(3, fusion_threshold=1 << 20, stall_timeout=60)
    c.submit(0, [meta("w", shape=(4,))])
    c.submit(1, [meta("w", shape=(5,))])
    c.submit(2, [meta("w", shape=(4,))])
    ((kind, names, submitters, (cls, msg, *_)),) = c.responses()
    assert (kind, names, submitters, cls) == ("error", ["w"], [{0, 1, 2}], "mismatch")
    assert msg == "Mismatched shape for tensor 'w': ranks [0, 2]: (4,); rank 1: (5,)"


def test_allgather_may_differ_in_first_dim_only():
    c = Coordinator(2, fusion_threshold=0, stall_timeout=60)
    c.submit(0, [meta("g", kind="allgather", shape=(1, 3))])
    c.submit(1, [meta("g", kind="allgather", shape=(4, 3))])
    assert c.responses() == [("allgather", ["g"], [1, 4], None)]


def test_stall_names_missing_ranks_after_timeout():
    clock = Clock()
    c = Coordinator(3, fusion_threshold=0, stall_timeout=10, clock=clock)
    c.submit(0, [meta("x")])
    c.submit(2, [meta("x")])
    clock.t = 5
    assert c.responses() == []
    clock.t = 11
    ((kind, names, submitters, (cls, msg, *_)),) = c.responses()
    assert (kind, names, submitters, cls) == ("error", ["x"], [{0, 2}], "stall")
    assert "rank 1 did not submit 'x'" in msg and not c.pending()


def test_a_stall_in_a_process_set_names_global_ranks_for_the_launcher():
    """The failure carries who did not submit (global ranks) and the timeout: the launcher names them."""
    clock = Clock()
    c = Coordinator(3, fusion_threshold=0, stall_timeout=10, clock=clock, ranks=[2, 5, 7])
    c.submit(0, [meta("x")])
    c.submit(2, [meta("x")])
    clock.t = 11
    ((_, _, _, failure),) = c.responses()
    assert (failure.kind, failure.absent, failure.seconds) == ("stall", (5,), 10)
    assert "rank 5 did not submit 'x'" in failure.message


def test_join_counts_as_present_for_allreduce_and_reports_last():
    c = Coordinator(2, fusion_threshold=1 << 20, stall_timeout=60)
    c.submit(1, [meta("__join__", kind="join")])
    c.submit(0, [meta("a", shape=(3,))])
    assert c.responses() == [("allreduce", ["a"], ("float32", Sum, 1.0, 1.0, "cpu", [(3,)]), None)]
    c.submit(0, [meta("__join__", kind="join")])
    assert c.responses() == [("join", ["__join__"], 0, None)]


def test_a_rank_that_shut_down_fails_what_the_others_wait_for_at_once():
    """Rank 1 left (submitted shutdown, its program ended) while ranks 0 and 2 wait in 'x': 'x' fails
    at once for them, naming rank 1 in the form the launcher reads (supervisor/result.py named_rank)."""
    c = Coordinator(3, fusion_threshold=0, stall_timeout=60)
    c.submit(0, [meta("x")])
    c.submit(2, [meta("x")])
    c.submit(1, [meta("__shutdown__", kind="shutdown")])
    ((kind, names, submitters, (cls, msg, *_)),) = c.responses()
    assert (kind, names, submitters, cls) == ("error", ["x"], [{0, 2}], "left")
    assert msg.startswith("trainrun: rank 1 stopped: it left (its program ended or called hvd.shutdown) "
                          "while ranks 0,2 waited in allreduce 'x'; collectives cannot complete"), msg
    c.submit(0, [meta("later", kind="broadcast", root=0)])  # a later op it lacks fails as soon as it is seen
    ((kind, names, submitters, (cls, msg, *_)),) = c.responses()
    assert (names, submitters, cls) == (["later"], [{0}], "left") and "rank 0 waited in broadcast 'later'" in msg


def test_an_op_the_leaving_rank_submitted_still_runs():
    c = Coordinator(2, fusion_threshold=0, stall_timeout=60)
    c.submit(1, [meta("a"), meta("__shutdown__", kind="shutdown")])  # an async op it never waited for
    c.submit(0, [meta("a")])
    assert c.responses() == [("allreduce", ["a"], None, None)]


def test_shutdown_never_stalls_and_completes_when_every_rank_is_there():
    """A rank that finished waits in shutdown for as long as the others work: no stall error for it."""
    clock = Clock()
    c = Coordinator(2, fusion_threshold=0, stall_timeout=10, clock=clock)
    c.submit(0, [meta("__shutdown__", kind="shutdown")])
    clock.t = 1000
    assert c.responses() == [] and not c.stall_check_due()
    c.submit(1, [meta("__shutdown__", kind="shutdown")])
    assert c.responses() == [("shutdown", ["__shutdown__"], None, None)]
