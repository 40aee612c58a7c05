"""runtime/waiting.py's pure rules: spin or sleep from mode, age and host load; sleep lengths; the
TRAINRUN_WAIT values; the load sample read at most every SAMPLE_S."""
import pytest

from trainrun.runtime import waiting as w


@pytest.mark.parametrize("mode,age,running,cores,want", [
    ("spin", 0.0, 99, 2, True),        # spin ignores the load (the behaviour before the policy)
    ("spin", 0.0019, 99, 2, True),
    ("spin", 0.0021, 0, 2, False),     # ... but not the budget
    ("block", 0.0, 1, 2, True),        # a wait younger than FLOOR_S always polls
    ("block", 0.0001, 1, 2, False),    # block: then sleeps, idle host or not
    ("auto", 0.0001, 2, 2, True),      # auto, as many runnable tasks as cores: young waits spin
    ("auto", 0.0021, 2, 2, False),     # old ones do not
    ("auto", 0.0001, 3, 2, False),     # oversubscribed: the core goes back at once
    ("auto", 0.00001, 30, 2, True),    # ... after the floor
])
def test_decide(mode, age, running, cores, want):
    assert w.decide(mode, age, 0.002, running, cores) is want


def test_backoff_grows_within_bounds():
    assert w.backoff_s(0.0) == w.MIN_SLEEP_S
    assert w.backoff_s(0.001) == pytest.approx(0.001 / 16)
    assert w.backoff_s(1.0) == w.MAX_SLEEP_S
    assert w.backoff_s(0.0005) <= w.backoff_s(0.002)


@pytest.mark.parametrize("value,want", [(None, "auto"), ("", "auto"), ("SPIN", "spin"), (" block ", "block")])
def test_mode_from(value, want):
    assert w.mode_from(value) == want


def test_mode_from_refuses_a_typo():
    with pytest.raises(ValueError, match=r"TRAINRUN_WAIT='spn'.*auto, spin, block"):
        w.mode_from("spn")


def test_host_load_sampled_at_most_every_sample_s(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("3.00 2.00 1.00 5/100 123\n")
    load = w.HostLoad(str(f))
    assert load.running(10.0) == 5
    f.write_text("0.10 0.20 0.30 1/100 124\n")
    assert load.running(10.0 + w.SAMPLE_S / 2) == 5      # the old sample: no read
    assert load.running(10.0 + 1.5 * w.SAMPLE_S) == 1


def test_host_load_unreadable_counts_as_idle(tmp_path):
    load = w.HostLoad(str(tmp_path / "missing"))
    assert load.running(0.0) == 0


class _Load:
    def __init__(self, running, cores):
        self.cores, self._r = cores, running

    def running(self, now):
        return self._r


def test_policy_auto_follows_the_load():
    busy, idle = w.Policy("auto", _Load(5, 2)), w.Policy("auto", _Load(2, 2))
    assert busy.oversubscribed() and not idle.oversubscribed()
    assert not busy.spin(0.001, 0.002)
    assert idle.spin(0.001, 0.002)
    busy.set_mode("spin")
    assert busy.spins and busy.spin(0.001, 0.002)
