"""PMI-1 server state machine: literal wire lines in, literal lines out (as MPICH 5.0 sends them)."""
import os

import pytest

from trainrun.mpiworld import pmi, pmienv, shm

KVS = "trainrun_job1_abc"


def server(size=2, mapping="(vector,(0,1,2))"):
    return pmi.PmiServer(pmi.PmiJob(size=size, kvsname=KVS, process_mapping=mapping))


@pytest.mark.parametrize("line, reply", [
    (b"cmd=init pmi_version=1 pmi_subversion=1", b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"),
    (b"cmd=get_maxes", b"cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n"),
    (b"cmd=get_appnum", b"cmd=appnum appnum=0 rc=0\n"),
    (b"cmd=get_my_kvsname", b"cmd=my_kvsname kvsname=trainrun_job1_abc rc=0\n"),
    (b"cmd=get_universe_size", b"cmd=universe_size size=2 rc=0\n"),
    (b"cmd=get kvsname=trainrun_job1_abc key=PMI_process_mapping",
     b"cmd=get_result rc=0 value=(vector,(0,1,2))\n"),
    (b"cmd=get kvsname=trainrun_job1_abc key=PMI_hwloc_xmlfile",
     b"cmd=get_result rc=-1 msg=key_PMI_hwloc_xmlfile_not_found\n"),
    (b"cmd=put kvsname=trainrun_job1_abc key=-allgather-1-0-seg-1/9 value=20B2[2]63",
     b"cmd=put_result rc=0\n"),
    (b"cmd=finalize", b"cmd=finalize_ack rc=0\n"),
    (b"cmd=initack pmiid=1",
     b"cmd=initack rc=0\ncmd=set size=2\ncmd=set rank=1\ncmd=set debug=0\n"),
])
def test_one_line_one_reply(line, reply):
    step = server().feed(1, line + b"\n")
    assert step.replies == [(1, reply)]
    assert step.errors == [] and step.aborted is None


def test_init_and_finalize_are_reported():
    s = server()
    assert s.feed(0, b"cmd=init pmi_version=1 pmi_subversion=1\n").initialized == [0]
    assert s.feed(1, b"cmd=initack pmiid=1\n").initialized == [1]
    assert s.feed(0, b"cmd=finalize\n").finalized == [0]


def test_put_then_get_across_ranks_with_escapes():
    s = server()
    s.feed(0, b"cmd=put kvsname=trainrun_job1_abc key=bc-0 value=a\\ b\\\\c\n")
    step = s.feed(1, b"cmd=get kvsname=trainrun_job1_abc key=bc-0\n")
    assert step.replies == [(1, b"cmd=get_result rc=0 value=a\\ b\\\\c\n")]
    assert pmi.parse_line(step.replies[0][1].rstrip(b"\n")) == ("get_result", {"rc": "0", "value": "a b\\c"})


def test_barrier_releases_all_ranks_once_all_arrived_and_repeats():
    s = server(size=3)
    for _ in range(2):
        assert s.feed(2, b"cmd=barrier_in\n").replies == []
        assert s.feed(0, b"cmd=barrier_in\n").replies == []
        out = s.feed(1, b"cmd=barrier_in\n").replies
        assert out == [(r, b"cmd=barrier_out rc=0\n") for r in (0, 1, 2)]


def test_barrier_in_twice_is_an_error():
    s = server()
    s.feed(0, b"cmd=barrier_in\n")
    step = s.feed(0, b"cmd=barrier_in\n")
    assert step.errors and step.replies[0][1].startswith(b"cmd=barrier_out rc=-1 msg=")


def test_partial_lines_are_buffered_per_rank():
    s = server()
    assert s.feed(0, b"cmd=get_app").replies == []
    assert s.feed(1, b"cmd=get_maxes\ncmd=get_my_").replies == [
        (1, b"cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n")]
    assert s.feed(0, b"num\ncmd=finalize\n").replies == [
        (0, b"cmd=appnum appnum=0 rc=0\n"), (0, b"cmd=finalize_ack rc=0\n")]
    assert s.feed(1, b"kvsname\n").replies == [(1, b"cmd=my_kvsname kvsname=trainrun_job1_abc rc=0\n")]


def test_abort_is_reported_without_reply():
    step = server().feed(1, b"cmd=abort exitcode=3 message=abort\n")
    assert step.aborted == (1, 3, "abort") and step.replies == []


@pytest.mark.parametrize("line, reply_prefix, error", [
    (b"cmd=bogus x=1", b"cmd=bogus_result rc=-1 msg=cmd=bogus:\\ unknown", "cmd=bogus: unknown or unsupported"),
    (b"cmd=init pmi_version=2 pmi_subversion=0", b"cmd=response_to_init rc=-1", "PMI version 2.0"),
    (b"cmd=get key=a kvsname=other", b"cmd=get_result rc=-1", "unknown KVS 'other'"),
    (b"cmd=put kvsname=trainrun_job1_abc key=" + b"k" * 65 + b" value=v", b"cmd=put_result rc=-1", "exceeds"),
    (b"cmd=put kvsname=trainrun_job1_abc value=v", b"cmd=put_result rc=-1", "missing key="),
    (b"cmd=initack pmiid=0", b"cmd=initack rc=-1", "pmiid=0 on the connection of rank 1"),
    (b"cmd=abort exitcode=x", b"cmd=abort_result rc=-1", "exitcode='x' is not an integer"),
])
def test_bad_commands_get_an_error_reply_and_are_reported(line, reply_prefix, error):
    step = server().feed(1, line + b"\n")
    assert len(step.replies) == 1 and step.replies[0][1].startswith(reply_prefix)
    assert len(step.errors) == 1 and step.errors[0][0] == 1 and error in step.errors[0][1]


@pytest.mark.parametrize("line, reply", [
    (b"cmd=publish_name service=s port=p", b"cmd=publish_result rc=-1"),
    (b"cmd=lookup_name service=s", b"cmd=lookup_result rc=-1"),
])
def test_optional_services_are_declined_without_failing_the_job(line, reply):
    step = server().feed(1, line + b"\n")
    assert step.errors == [] and len(step.unsupported) == 1
    assert len(step.replies) == 1 and step.replies[0][1].startswith(reply)


@pytest.mark.parametrize("line, error", [
    (b"hello", "expected 'cmd=...'"),
    (b"", "expected 'cmd=...'"),
    (b"cmd=put key", "bad token at column 8"),
    (b"cmd=get key=a\\", "bad token"),
    (b"cmd=get k(y)=a", "bad token"),
    (b"cmd=get key=\xff", "not UTF-8"),
    (b"mcmd=spawn", "MPI_Comm_spawn (PMI mcmd) is not supported"),
])
def test_malformed_lines_are_reported_without_reply(line, error):
    step = server().feed(0, line + b"\n")
    assert step.replies == [] and len(step.errors) == 1 and error in step.errors[0][1]


def test_overlong_unterminated_line_is_an_error_and_dropped():
    s = server()
    assert "longer than 4096" in s.feed(0, b"cmd=put " + b"x" * 5000).errors[0][1]
    assert s.feed(0, b"cmd=get_appnum\n").replies == [(0, b"cmd=appnum appnum=0 rc=0\n")]


def test_rank_outside_job_is_a_caller_bug():
    with pytest.raises(ValueError):
        server().feed(2, b"cmd=finalize\n")


@pytest.mark.parametrize("kw", [dict(size=0, kvsname=KVS), dict(size=1, kvsname="a b"), dict(size=1, kvsname="")])
def test_job_validates(kw):
    with pytest.raises(ValueError):
        pmi.PmiJob(process_mapping="(vector,(0,1,1))", **kw)


@pytest.mark.parametrize("ranks_per_node, mapping", [
    ([4], "(vector,(0,1,4))"),                             # what Hydra serves for mpiexec -n 4
    ([3, 1, 1, 3], "(vector,(0,1,3),(1,2,1),(3,1,3))"),     # Hydra: -hosts a:3,b:1,c:1,d:3 -n 8
    ([2, 2, 2], "(vector,(0,3,2))"),
    ([2, 2, 1], "(vector,(0,2,2),(2,1,1))"),
    ([1], "(vector,(0,1,1))"),
    ([1, 2, 1], "(vector,(0,1,1),(1,1,2),(2,1,1))"),
])
def test_process_mapping(ranks_per_node, mapping):
    assert pmi.process_mapping(ranks_per_node) == mapping


@pytest.mark.parametrize("bad", [[], [2, 0]])
def test_process_mapping_rejects_empty_nodes(bad):
    with pytest.raises(ValueError):
        pmi.process_mapping(bad)


def test_kvsname_derives_from_the_job_id_as_a_valid_token():
    assert shm.kvsname_for("job 1/x") == "trainrun_job_1_x" == shm.kvsname_for("job 1/x")
    assert shm.kvsname_for("a") != shm.kvsname_for("b")
    pmi.PmiJob(size=1, kvsname=shm.kvsname_for("job 1/x"), process_mapping="(vector,(0,1,1))")


def test_world_id_is_mpich_fnv1a():
    # Seen on this machine: KVS trainrun_scratch_2d80d2dc8e4e -> /dev/shm/mpich_shm_32089d8d_{0,1}
    assert shm.world_id("trainrun_scratch_2d80d2dc8e4e") == 0x32089D8D
    assert shm.world_id("") == 2166136261


def test_remove_shm_segments_only_this_jobs(tmp_path):
    mine = f"{shm.world_id(KVS):x}"
    names = [f"mpich_shm_{mine}_0", f"mpich_vci_{mine}_1", f"mpich_shm_{mine}1_0", "mpich_shm_deadbeef_0",
             f"mpich_shm_{mine}_0.bak", "other"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    removed = shm.remove_shm_segments(KVS, shm_dir=str(tmp_path))
    assert removed == [str(tmp_path / names[0]), str(tmp_path / names[1])]
    assert sorted(os.listdir(tmp_path)) == sorted(names[2:])


def test_socket_env():
    assert pmienv.socket_env(3, 8, 11) == {"PMI_FD": "11", "PMI_RANK": "3", "PMI_SIZE": "8"}
