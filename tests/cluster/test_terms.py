"""
Terms, eras and plausible values (lockservice.cluster.terms): pure, told
the time.
"""

from __future__ import annotations

from lockservice.cluster import terms
from lockservice.cluster.clocktrust import PLAUSIBLE_AHEAD

NOW_US = 1_800_000_000_000_000


def test_a_new_term_follows_the_clock_and_rises_above_every_term_seen() -> None:
    t = terms.Terms()
    assert t.new(NOW_US) == NOW_US and t.highest == NOW_US
    assert t.new(NOW_US) == NOW_US + 1  # the clock did not move
    t.learn(NOW_US + 50)
    t.learn(5)  # lower terms change nothing
    assert t.highest == NOW_US + 50
    assert t.new(NOW_US + 10) == NOW_US + 51
    assert t.new(NOW_US + 100) == NOW_US + 100


def test_a_value_more_than_an_hour_ahead_is_implausible() -> None:
    assert terms.plausible(NOW_US + PLAUSIBLE_AHEAD, NOW_US)
    assert not terms.plausible(NOW_US + PLAUSIBLE_AHEAD + 1, NOW_US)
    assert terms.limit(NOW_US) == NOW_US + PLAUSIBLE_AHEAD


def test_refusals_are_logged_at_most_every_ten_seconds_per_peer() -> None:
    t = terms.Terms()
    assert t.logRefusal(1, 100.0)
    assert not t.logRefusal(1, 109.9)
    assert t.logRefusal(2, 109.9)
    assert t.logRefusal(1, 110.0)


def test_an_offer_is_made_once_with_the_era_the_keys_mirror() -> None:
    eras = terms.Eras()
    assert eras.takeOffer() is None
    eras.leaving(me=2, leader=1, term=7, position=40)
    eras.leaving(me=2, leader=0, term=8, position=50)  # an offer due already stands
    assert eras.takeOffer() == (1, 7, 40)
    assert eras.takeOffer() is None
    eras.leaving(me=2, leader=None, term=9, position=3)  # our own keys, stepping down
    assert eras.takeOffer() == (2, 9, terms.WHOLE)
    eras.restored(me=2, term=3)
    assert eras.offerFrom == (2, 3, terms.WHOLE)
    eras.steppingDown(me=2, term=4)
    assert eras.takeOffer() == (2, 4, terms.WHOLE)


def test_an_era_taken_over_whole_is_inherited_until_a_promotion() -> None:
    eras = terms.Eras()
    eras.tookOver((1, 7, 50), tokens=99)
    assert eras.inherited((1, 7, 5)) and not eras.inherited((2, 7, 5))
    assert eras.inheritedTokens == 99
    eras.promoted(None, tokens=120)
    assert not eras.inherited((1, 7, 5))


def test_a_promoted_standby_inherits_its_leaders_stream_up_to_its_own_position() -> None:
    """
    An offer of the same stream from a standby whose copy went less far
    (its link was cut) brings nothing new: what it holds and we do not was
    released or expired in the part it missed.  One whose copy went
    further may bring grants we lack: merged.
    """
    eras = terms.Eras()
    eras.promoted((0, 7, 120), tokens=5)
    assert eras.inherited((0, 7, 100)) and eras.inherited((0, 7, 120))
    assert not eras.inherited((0, 7, 121)) and eras.further((0, 7, 121))
    # The term is the leader's at the time: a term bumped since is the
    # same stream.
    assert eras.inherited((0, 8, 100)) and not eras.inherited((1, 7, 100))
    assert not eras.further((0, 7, 120)) and not eras.further((1, 7, 121))
