"""supervisor/straggler.py: the verdict logic on window summaries (pure; the real launches are in
tests/process/test_straggler.py and tests/cluster/test_straggler_remote.py)."""
import random

from trainrun.supervisor import straggler as st

HOSTS2x2 = {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
HOSTS4 = {r: f"h{r // 2 + 1}" for r in range(8)}  # 4 hosts x 2 ranks


def text(wall=4000, wait=0, coll=100, last=0, steps=40, before=0) -> str:
    return f"{wall} {wait} {coll} {last} {steps} {before}"


def feed(watch, rounds, per_rank, t0=0.0):
    """`rounds` windows of every rank, 4 s apart; per_rank(rank, i) -> the window's text. All lines printed."""
    out = []
    for i in range(rounds):
        for r in sorted(watch.hosts):
            out += watch.on_window(r, per_rank(r, i), t0 + 4.0 * (i + 1))
    return out


def slow_rank(slow, share=0.95, wait_others=1600, before=0, inside_extra=True):
    def per_rank(r, i):
        if r in slow:
            return text(wait=40, last=int(100 * share), steps=20, before=before)
        return text(wait=wait_others, last=2, steps=20)
    return per_rank


def test_one_slow_rank_is_named_with_its_host_and_figures():
    w = st.Watch(dict(HOSTS2x2))
    lines = feed(w, 4, slow_rank({3}))
    assert len(lines) == 1, lines
    assert lines[0].startswith("straggler: rank 3 on h2: it was last to 95% of collectives in the last")
    assert "the other ranks waited 40% of their time for it" in lines[0]
    assert "compute 1.6x the median" in lines[0]  # (4000-40) / (4000-1600)


def test_no_verdict_before_two_windows_after_the_start_up_window():
    w = st.Watch(dict(HOSTS2x2))
    assert feed(w, 2, slow_rank({3})) == []  # the first is start-up, the second alone is too little
    assert w.current is None
    assert len(feed(w, 1, slow_rank({3}), t0=8.0)) == 1


def test_a_slow_host_is_named_as_the_host():
    w = st.Watch(dict(HOSTS4))
    def per_rank(r, i):  # h3's ranks 4 and 5 are slow: rank 5 is usually the last of the two
        if r in (4, 5):
            return text(wait=100, last=30 if r == 4 else 65)
        return text(wait=1200, last=3)
    lines = feed(w, 4, per_rank)
    assert len(lines) == 1 and lines[0].startswith("straggler: host h3 (ranks 4, 5): its ranks were last to 95%"), lines


def test_recovery_is_reported_once_and_then_nothing():
    w = st.Watch(dict(HOSTS2x2))
    feed(w, 4, slow_rank({1}))
    healthy = lambda r, i: text(wait=300, last=random.Random(r * 100 + i).randint(0, 30))  # noqa: E731
    lines = feed(w, 10, healthy, t0=12.0)
    assert lines == ["straggler: rank 1 on h1 keeps up again"]


def test_no_false_alarm_on_noisy_balanced_windows():
    """Healthy jobs: every rank's last share and wait share drawn at random in a wide band (a loaded
    machine), including jobs where ties make every rank 'last' to most collectives."""
    for seed in range(300):
        rng = random.Random(seed)
        hosts = HOSTS4 if seed % 2 else HOSTS2x2
        tie = rng.random() < 0.5
        base_last = rng.uniform(0.3, 0.9) if tie else 1 / len(hosts)
        w = st.Watch(dict(hosts))

        def per_rank(r, i, rng=rng, base_last=base_last):
            coll = rng.randint(20, 200)
            share = min(1.0, max(0.0, rng.gauss(base_last, 0.12)))
            return text(wait=rng.randint(0, 2500), coll=coll, last=int(coll * share))
        assert feed(w, 12, per_rank) == [], f"seed {seed}"


def test_a_rank_that_waits_as_much_as_the_others_is_no_straggler():
    w = st.Watch(dict(HOSTS2x2))  # last to most collectives, but it waits as long as everyone: not holding them
    assert feed(w, 4, lambda r, i: text(wait=1500, last=90 if r == 2 else 10)) == []


def test_a_cheap_straggler_is_not_worth_a_line():
    w = st.Watch(dict(HOSTS2x2))  # always last, but the others wait only 5% of their time
    assert feed(w, 4, lambda r, i: text(wait=200 if r != 2 else 0, last=100 if r == 2 else 0)) == []


def test_loader_and_compute_are_told_apart_by_the_time_before_the_step():
    def job(where):
        def per_rank(r, i):
            if r == 3:  # 100 ms per step more than the others (20 steps): before the step or inside it
                return text(wait=40, last=95, steps=20, before=2000 + 400 if where == "loader" else 400)
            return text(wait=1600, last=2, steps=20, before=400)
        return per_rank
    loader = feed(st.Watch(dict(HOSTS2x2)), 4, job("loader"))
    compute = feed(st.Watch(dict(HOSTS2x2)), 4, job("compute"))
    assert loader[0].endswith("its time goes before the step (data loading or the forward pass)"), loader
    assert compute[0].endswith("its time goes inside the step (compute: backward, optimizer)"), compute


def test_without_an_optimizer_nothing_is_said_about_where():
    w = st.Watch(dict(HOSTS2x2))
    lines = feed(w, 4, lambda r, i: text(wait=40 if r == 3 else 1600, last=95 if r == 3 else 2, steps=-100))
    assert len(lines) == 1 and "its time goes" not in lines[0]


def test_summary_only_after_a_straggler_with_advice_by_hosts():
    healthy = st.Watch(dict(HOSTS2x2))
    feed(healthy, 4, lambda r, i: text(wait=300, last=25))
    assert healthy.summary() == []
    w = st.Watch(dict(HOSTS2x2))
    feed(w, 4, slow_rank({3}))
    lines = w.summary()
    assert lines[0].startswith("straggler summary") and "rank 3 on h2 95%" in lines[0]
    assert "--exclude h2" in lines[1] and "--check --perf" in lines[1]
    one = st.Watch({0: "localhost", 1: "localhost"})
    feed(one, 4, lambda r, i: text(wait=40 if r == 1 else 1600, last=95 if r == 1 else 2))
    assert "--exclude" not in "\n".join(one.summary()) and "rank 1 on localhost" in one.summary()[1]


def test_bad_lines_are_ignored():
    w = st.Watch(dict(HOSTS2x2))
    assert w.on_window(0, "garbage", 1.0) == [] and w.on_window(0, "0 0 0 0 0", 1.0) == []
    assert st.Window.parse(1, "4000 10 5 1 -3", 2.0).before_ms == 0  # the five-field form


def test_the_output_dir_record_holds_the_window_and_the_named_straggler():
    import json
    w = st.Watch(dict(HOSTS2x2))
    assert json.loads(w.record(3, text(wait=40, last=95, before=7) + " 4096 300 12", 5.0)) == {
        "time": 5.0, "rank": 3, "host": "h2", "wall_ms": 4000, "wait_ms": 40, "collectives": 100, "last": 95,
        "steps": 40, "before_ms": 7, "bytes": 4096, "rss_mb": 300, "gpu_mb": 12, "straggler": None}
    feed(w, 4, slow_rank({3}))
    assert json.loads(w.record(0, text(), 20.0))["straggler"] == [3]
    assert w.record(0, "nonsense", 1.0) is None


def test_the_nine_field_line_carries_payload_and_memory_and_six_fields_still_parse():
    w = st.Window.parse(2, "4000 100 50 3 20 7 65536 512 64", 1.0)
    assert (w.before_ms, w.reduced_bytes, w.rss_mb, w.gpu_mb) == (7, 65536, 512, 64)
    assert st.Window.parse(2, w.text, 1.0) == w
    old = st.Window.parse(2, "4000 100 50 3 20 7", 1.0)
    assert (old.before_ms, old.reduced_bytes, old.rss_mb) == (7, 0, 0)


def test_replaying_the_records_gives_the_launchers_verdicts_and_margin():
    """supervisor/straggler.replay on --output-dir's records: the same verdict as the live Watch, and
    for a healthy job a positive margin that names the binding condition."""
    import json
    live = st.Watch(dict(HOSTS2x2))
    records = []
    for i in range(5):
        for r in sorted(HOSTS2x2):
            t = slow_rank({3})(r, i)
            records.append(json.loads(live.record(r, t, 4.0 * (i + 1))))
            live.on_window(r, t, 4.0 * (i + 1))
    again = st.replay(records)
    assert [v.ranks for v in again.seen] == [v.ranks for v in live.seen] == [(3,)]

    healthy = st.Watch(dict(HOSTS2x2))
    feed(healthy, 6, lambda r, i: text(wait=1000, last=30))  # every rank alike: ties
    low = healthy.lowest
    assert low is not None and low.slack > 0 and healthy.seen == []
    assert low.binding in st.RULE
    assert abs(low.slack - st.LAST_MARGIN) < 1e-9  # its share equals the others': the margin binds, by 0.30


def test_the_margin_shrinks_as_a_rank_slows_and_reaches_zero_when_named():
    def lowest(share):
        w = st.Watch(dict(HOSTS2x2))
        feed(w, 5, lambda r, i: text(wait=60 if r == 3 else 1600, last=int(100 * share) if r == 3 else 5))
        return w
    slacks = [lowest(s).lowest.slack for s in (0.2, 0.3, 0.5)]
    assert slacks == sorted(slacks, reverse=True) and slacks[-1] > 0
    assert lowest(0.9).seen  # named: no margin recorded after the verdict (it was <= 0)
