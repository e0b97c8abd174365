"""Exception types of the AFD packages.

Every error a user can meet derives from :class:`AFDError`, so a caller can catch the
whole family; the subclasses say which part of a deployment is wrong.
"""

from __future__ import annotations


class AFDError(RuntimeError):
    """Base class of every AFD error."""


class AFDConfigError(AFDError, ValueError):
    """``additional_config["afd"]`` (or a connector's extra config) is invalid.

    The message names the key, the offending value and what to do instead.
    """


class AFDInstallError(AFDError):
    """A package needed for this role, platform or connector is not installed."""


class AFDProtocolError(AFDError):
    """A message on the wire differs from what the receiver expected.

    Raised for mispaired peers (step, layer, stage, token count, dtype or hidden size
    disagree) and for peers whose configuration differs at rendezvous.
    """


class AFDPeerError(AFDError):
    """A peer stopped answering, closed its connection, or did not arrive in time."""


class AFDShutdown(AFDError):
    """The local connector was closed while an operation was waiting."""
