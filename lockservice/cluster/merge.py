# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
The heal merge: what the side that loses a heal brings the winner, and
the per-grant rules the winner applies (a heal merges the two sides'
grants; it does not wipe the loser's).

The offer, one line each (built and parsed in
L{lockservice.cluster.peerwire}), sent before the loser's C{SYNC} so the
winner's snapshot already reflects it:

    OFFER <leader> <term>                the lines mirror <leader>'s stream of <term>
    RELEASED <key> <token>               a grant this side released since the
                                         two sides diverged (a release note)
    MERGE <key> <token> <remaining_us> <age_us> [<share>]
                                         a grant this side holds; one line per
                                         grant (a shared key has several), the
                                         optional last field its share

The rules are facts about grants, so the order of lines and of offers
does not matter:

  - a release answered by either side is never undone: the winner drops
    its copy of a grant the loser released (L{releasedThere}), and skips
    an offered copy of a grant it released itself (L{decide});
  - the same grant on both sides keeps the later deadline (a renewal
    answered by either side survives an expiry seen by the other);
  - otherwise the higher token wins a key.

The same lines can bring a saved table back (a restore meets the live
table by the same rules), and a shared key's "fit" rule belongs in
L{decide}.  Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Optional, Tuple

# On a heal, an offered copy of a grant we hold (same token) whose deadline
# is later by more than this was renewed on the other side (seconds; an
# offer of a million keys takes about a second to arrive and be applied).
RENEWAL_SLACK = 1.0

# What the winner does with one offered grant.
KEEP = "keep"  # nothing: ours stands (a higher token, our own deadline, our release)
TAKE = "take"  # install the offered grant (the key is free here, or it out-ranks ours)
EXTEND = "extend"  # the same grant: install its later deadline

# One grant as the winner holds it: (token, expiresAt).
Held = Tuple[int, float]


def decide(held: Optional[Held], token: int, expiresAt: float,
           releasedHere: bool) -> str:
    """
    What the winner does with an offered grant C{token} of a key, lasting
    until C{expiresAt}, given the grant it holds for that key (None: the
    key is free here) and whether it released that very grant itself.
    """
    if held is None:
        return KEEP if releasedHere else TAKE
    heldToken, heldExpiresAt = held
    if heldToken > token:
        return KEEP  # the higher token wins
    if heldToken == token:
        # A copy of our own deadline arrives a little later than it left:
        # within RENEWAL_SLACK it is the same deadline.
        return EXTEND if expiresAt > heldExpiresAt + RENEWAL_SLACK else KEEP
    return KEEP if releasedHere else TAKE


def releasedThere(held: Optional[int], token: int) -> bool:
    """
    Whether the winner, holding C{held} for a key, drops it for the
    loser's note that it released grant C{token} of that key.
    """
    return held == token
