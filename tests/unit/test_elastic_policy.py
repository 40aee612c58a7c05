"""The elastic loop's pure decisions (elasticjob/policy.py): cool-downs, host picks, start-up failures, back-off."""
import math

from trainrun.plan.hosts import HostSpec
from trainrun.elasticjob.policy import CooldownBook, ElasticSettings, RankEnd, backoff, cooldown_for, deterministic, pick_hosts

H = [HostSpec("h1", 2), HostSpec("h2", 2), HostSpec("h3", 2)]
ELASTIC = ElasticSettings(max_restarts=None, min_np=4, max_np=6, cooldown=(2.0, 10.0))


def test_cooldowns_double_up_to_the_max_and_forever_without_a_range():
    assert [cooldown_for(n, (2.0, 10.0)) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 10.0]
    assert cooldown_for(1, None) == math.inf


def test_a_failed_host_sits_out_then_comes_back():
    book = CooldownBook((2.0, 10.0))
    assert book.fail("h3", now=100.0) == 2.0
    assert not book.available("h3", 101.9) and book.available("h3", 102.0)
    assert book.fail("h3", now=200.0) == 4.0  # the second failure sits out longer
    forever = CooldownBook(None)
    forever.fail("h1", 0.0)
    assert not forever.available("h1", 1e9)


def test_pick_shrinks_onto_the_hosts_left_and_grows_back():
    book = CooldownBook((2.0, 10.0))
    assert [h.name for h in pick_hosts(H, book, 0.0, ELASTIC, 6).hosts] == ["h1", "h2", "h3"]
    book.fail("h2", 0.0)
    pick = pick_hosts(H, book, 1.0, ELASTIC, 6)
    assert [h.name for h in pick.hosts] == ["h1", "h3"] and pick.np == 4
    assert pick_hosts(H, book, 2.0, ELASTIC, 6).np == 6


def test_pick_below_min_np_says_why():
    book = CooldownBook(None)
    book.fail("h1", 0.0)
    book.fail("h2", 0.0)
    pick = pick_hosts(H, book, 1.0, ELASTIC, 6)
    assert pick.hosts == () and "2 slot(s) available on 1 host(s), --min-np is 4" in pick.why


def test_pick_caps_at_max_np_and_leaves_extra_hosts_out():
    pick = pick_hosts(H, CooldownBook(), 0.0, ElasticSettings(None, 1, 3), 3)
    assert pick.np == 3 and [h.name for h in pick.hosts] == ["h1", "h2"]


def test_without_elastic_sizing_every_host_and_the_same_np():
    book = CooldownBook()
    book.fail("h1", 0.0)
    pick = pick_hosts(H, book, 1.0, ElasticSettings(max_restarts=2), 5)
    assert [h.name for h in pick.hosts] == ["h1", "h2", "h3"] and pick.np == 5


def test_start_up_failure_of_every_rank_is_deterministic():
    ends = [RankEnd(r, 1, 0.5 + r / 10, "ModuleNotFoundError: No module named 'x'") for r in range(4)]
    why = deterministic(ends, 4, world_formed=False)
    assert why and "every rank (4) exited with code 1" in why and "No module named 'x'" in why


def test_failures_a_restart_may_cure_are_not_deterministic():
    same = [RankEnd(r, 1, 0.5, "boom") for r in range(4)]
    assert deterministic(same[:3], 4, False) is None                       # not every rank failed
    assert deterministic(same, 4, world_formed=True) is None               # failed after the world formed
    assert deterministic([*same[:3], RankEnd(3, -15, 0.6)], 4, False) is None  # one was stopped, not failing
    assert deterministic([*same[:3], RankEnd(3, 1, 0.6, "other")], 4, False) is None  # different errors
    assert deterministic([RankEnd(r, 1, 30.0, "boom") for r in range(4)], 4, False) is None  # not at start-up
    assert deterministic([RankEnd(r, 255, 0.5) for r in range(4)], 4, False) is None  # host lost


def test_backoff_doubles_and_is_capped():
    assert [backoff(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0] and backoff(50) == 10.0  # DEFAULT_MAX_BACKOFF


def test_backoff_never_passes_the_users_cap():
    """--max-backoff (issue 38: it doubled 0.5, 1, 2, 4, 8, 16 s with no bound a user could set)."""
    assert [backoff(n, cap=3.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert [backoff(n, cap=0.2) for n in (1, 2)] == [0.2, 0.2]
    assert backoff(3, cap=0.0) == 0.0 and backoff(10_000, cap=60.0) == 60.0  # no overflow after many failures
    assert backoff(4, host_sits_out=True, cap=3.0) == 0.0


def test_no_backoff_when_the_failed_host_sits_out():
    assert backoff(1, host_sits_out=True) == 0.0 and backoff(5, host_sits_out=True) == 0.0
    assert backoff(1, host_sits_out=False) == 0.5


def test_settings_defaults_and_description():
    assert not ElasticSettings().enabled and ElasticSettings(max_restarts=1).enabled
    assert ELASTIC.sizing and ELASTIC.restarts_left(1000)
    assert not ElasticSettings(max_restarts=2).restarts_left(2)
    text = ELASTIC.describe()
    assert "max-restarts unlimited" in text and "np 4..6" in text and "2..10 s" in text
