"""hvd.elastic.ElasticSampler (trainrun/torch/sampler.py): the sharding by rank and size, the epoch's order,
the state a TorchState commits and syncs; then a real elastic job (pipe engine: one agent per host name) whose
world shrinks from 3 ranks to 2 in the middle of an epoch, and which still processes every sample exactly once
per epoch."""
import os
import signal
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from tests.elastic.harness import LiveRun, by_rank, discovery, leftover_segments, wait_gone

torch = pytest.importorskip("torch")

from trainrun.torch import sampler as sampler_mod  # noqa: E402  (after the skip)
from trainrun.torch.sampler import ElasticSampler  # noqa: E402

PIPE = [sys.executable, str(Path(__file__).parent / "pipe_trainrun.py")]
SAMPLER_WORKER = str(Path(__file__).parent / "workers" / "elastic_sampler.py")


class World:
    """rank()/size() of the sampler's module, set by the test (no runtime)."""

    def __init__(self, rank=0, size=1):
        self.rank, self.size = rank, size

    def set(self, rank, size):
        self.rank, self.size = rank, size
        return self

    def shards(self, n, size, state=None, shuffle=False, seed=0):
        """Each rank's indices for a world of `size` with the sampler state `state` (the world is left as it was)."""
        was, out = (self.rank, self.size), []
        for r in range(size):
            self.set(r, size)
            s = ElasticSampler(list(range(n)), shuffle=shuffle, seed=seed)
            if state is not None:
                s.load_state_dict(state)
            out.append(list(s))
            assert len(s) == len(out[-1])
        self.set(*was)
        return out


@pytest.fixture
def world(monkeypatch):
    w = World()
    monkeypatch.setattr(sampler_mod, "rank", lambda: w.rank)
    monkeypatch.setattr(sampler_mod, "size", lambda: w.size)
    return w


def test_each_rank_takes_every_size_th_index_from_its_rank(world):
    got = world.shards(12, 3)
    assert got == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]


def test_a_share_that_does_not_divide_is_padded_from_the_start(world):
    assert world.shards(10, 4) == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    # fewer samples left than ranks: every rank still gets one (repeats), none fails
    assert world.shards(10, 4, state={"epoch": 0, "processed_num": 9}) == [[9]] * 4
    assert world.shards(10, 4, state={"epoch": 0, "processed_num": 10}) == [[]] * 4


def test_shuffle_is_one_order_per_epoch_the_same_on_every_rank(world):
    world.set(0, 2)
    a, b = ElasticSampler(range(20), seed=5), ElasticSampler(range(20), seed=5)
    first = list(a)
    assert first == list(b) and sorted(first + world.shards(20, 2, shuffle=True, seed=5)[1]) == \
        list(range(20))
    assert first != list(range(0, 20, 2))  # shuffled
    a.set_epoch(1)
    assert list(a) != first and sorted(a.remaining_indices) == list(range(20))
    assert list(ElasticSampler(range(20), seed=6)) != first  # the seed picks the order
    world.rank = 1
    c = ElasticSampler(range(20), seed=5)
    c.set_epoch(1)
    assert sorted(list(a) + list(c)) == list(range(20))
    assert list(ElasticSampler(range(20), shuffle=False)) == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]


def test_record_batch_counts_the_batch_on_every_rank_and_set_epoch_clears_it(world):
    world.set(1, 4)
    s = ElasticSampler(range(64))
    s.set_epoch(3)
    s.record_batch(0, 2)
    s.record_batch(1, 2)
    assert s.processed_num == 16 and s.state_dict() == {"epoch": 3, "processed_num": 16}
    assert len(s) == 16  # the share changes only at a reset (load_state_dict, set_epoch)
    s.set_epoch(4)
    assert s.state_dict() == {"epoch": 4, "processed_num": 0}


@pytest.mark.parametrize("before,after,batch,steps", [(3, 2, 2, 3), (4, 3, 1, 5), (2, 5, 3, 2), (4, 4, 2, 1)])
def test_a_restart_at_another_size_shares_out_exactly_the_rest_of_the_epoch(world, before, after, batch, steps):
    """Every rank processed `steps` batches at size `before` and recorded them; the job restarts at size
    `after` from that state: what the new ranks take is the epoch's order less what was taken, each once."""
    n = 60
    taken = []
    state = None
    for r in range(before):
        world.rank, world.size = r, before
        s = ElasticSampler(range(n), seed=11)
        s.set_epoch(2)
        it = iter(s)
        for b in range(steps):
            taken += [next(it) for _ in range(batch)]
            s.record_batch(b, batch)
        state = s.state_dict()  # the same on every rank
    assert state == {"epoch": 2, "processed_num": before * batch * steps}
    rest = [i for shard in world.shards(n, after, state, shuffle=True, seed=11) for i in shard]
    left = n - len(taken)
    pad = -left % after
    counts = Counter(taken + rest)
    assert set(counts) == set(range(n))
    assert sum(counts.values()) == n + pad and all(c == 1 for c in Counter(taken).values())
    assert sorted(counts.values())[-1] <= 2 and sum(c - 1 for c in counts.values()) == pad  # only padding repeats


def test_torch_state_commits_and_loads_the_sampler_in_place(world):
    """TorchState(sampler=...) keeps the sampler's state_dict (not the sampler and its dataset) and loads it
    into the program's own sampler: restore() goes back to the last save, and re-shares by the size now."""
    from trainrun.elastic import packing
    from trainrun.torch.elastic import TorchState

    world.set(0, 2)
    s = ElasticSampler(list(range(40)), seed=1)
    extra = torch.nn.Linear(3, 1)
    state = TorchState(sampler=s, disc=extra, epoch=0)
    assert state.sampler is s and state.disc is extra and "sampler" not in state.snapshot()["objects"]
    snap = state.snapshot()
    assert snap["handled"]["sampler"] == {"epoch": 0, "processed_num": 0}
    assert len(packing.pack(snap).arrays) == 2  # the Linear's weight and bias as raw bytes; no dataset pickled
    s.record_batch(0, 4)
    state.save()
    s.record_batch(1, 4)
    with torch.no_grad():
        w = extra.weight.clone()
        state.save()
        extra.weight.add_(1)
    world.rank, world.size = 1, 4  # the next reset sees another world
    state.restore()
    assert state.sampler is s and s.processed_num == 16 and (s.rank, s.num_replicas) == (1, 4)
    assert torch.equal(extra.weight, w) and state.disc is extra
    assert list(s) == s.remaining_indices[1::4] and len(s.remaining_indices) == 24


def test_the_horovod_names_are_trainrun_s_sampler():
    import trainrun.torch as hvd
    from trainrun.torch import elastic

    assert hvd.elastic.ElasticSampler is ElasticSampler and elastic.ElasticSampler is ElasticSampler


def test_the_world_shrinks_mid_epoch_and_every_sample_is_processed_once(tmp_path):
    """3 ranks (far1..far3, one each) take an epoch of 48 samples in batches of 2, committing after each batch.
    In the middle of the first epoch far3 leaves (its rank killed, the discovery script drops it): the job
    restarts with 2 ranks, syncs the sampler from the last commit and shares out what is left. Counted two ways
    per epoch: the committed `seen` counts (an allreduce per step, rolled back with the state) and the batches
    each rank printed, less those after the commit the restart resumed from: every sample exactly once."""
    token = f"tok{uuid.uuid4().hex[:8]}"
    script, listing = discovery(tmp_path, ["far1:1", "far2:1", "far3:1"])
    env = {"N": "48", "BATCH": "2", "EPOCHS": "2", "STEP_PAUSE": "0.15"}
    run = LiveRun(["-v", "--host-discovery-script", str(script), "--min-np", "2", "--max-np", "3",
                   *[a for k, v in env.items() for a in ("-x", f"{k}={v}")], SAMPLER_WORKER, token],
                  cwd=tmp_path, launcher=PIPE)
    try:
        run.wait_for("take epoch 0 batch 3 size 3")
        listing.write_text("far1:1\nfar2:1\n")
        from tests.elastic.test_elastic_pipe import rank_pids

        pids = rank_pids(token, "far3")
        assert len(pids) == 1
        os.kill(pids[0], signal.SIGKILL)
        resume = run.wait_for("resume epoch")
    finally:
        code = run.finish(timeout=90)
    assert code == 0, run.stderr
    _, _, e, _, b, _, processed, _, size = resume.split(":", 1)[1].split()
    epoch, resumed_batch, processed, size = int(e), int(b), int(processed), int(size)
    assert (epoch, size) == (0, 2) and 0 < processed < 48 and processed == 3 * 2 * resumed_batch, resume
    lines = by_rank(run.lines)
    assert "epoch 0 done size 2 seen 1..1" in lines[0] and "epoch 1 done size 2 seen 1..1" in lines[0], lines[0]
    taken: dict[int, Counter] = {0: Counter(), 1: Counter()}
    sizes = {0: set(), 1: set()}
    for texts in lines.values():
        for text in texts:
            if text.startswith("take "):
                _, _, ep, _, bt, _, sz, _, restart, _, idx = text.split()
                if int(restart) == 0 and int(bt) >= resumed_batch:
                    continue  # after the commit the restart resumed from: rolled back, processed again
                taken[int(ep)].update(int(i) for i in idx.split(","))
                sizes[int(ep)].add(int(sz))
    assert sizes == {0: {3, 2}, 1: {2}}
    for ep in (0, 1):
        assert sorted(taken[ep]) == list(range(48)) and set(taken[ep].values()) == {1}, (ep, taken[ep])
    assert sum(t.startswith("final epoch 2") for texts in lines.values() for t in texts) == 2
    assert wait_gone(token) == [] and leftover_segments(run.stderr) == []
