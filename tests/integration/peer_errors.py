"""How integration tests recognise the error of a rank whose peer went away, and make a
peer that breaks the protocol."""

from __future__ import annotations


def reports_peer_gone(error: str | None, peer: str, doing: str) -> bool:
    """True when ``error`` says that ``peer`` went away while this rank waited for ``doing``.

    Two parts may notice first, so two wordings are right: the transport ("<peer> closed
    the connection during <doing>") and the peer watch ("<peer> is gone: ..." or
    "<peer> left: ...", with "(while waiting for <doing>)"). A data plane of ops names
    its own call ("<peer> closed the connection during e2a call 3 on group ...", with
    "(while waiting for <doing>)").
    """
    if error is None:
        return False
    if f"{peer} closed the connection during {doing}" in error:
        return True
    said = ("is gone: ", "left: ", "closed the connection during ")
    named = any(f"{peer} {what}" in error for what in said)
    return named and f"(while waiting for {doing})" in error


def skip_the_exchange_rule(layers: tuple[int, ...]) -> None:
    """Make this process a peer whose build skips the rule of a step's exchanges
    (:class:`~afd_core.kit.step_exchanges.StepExchanges` admits any layer of ``layers``, in
    any order), so that a mispaired layer reaches the wire and the receiver's header check."""
    from afd_core.kit.step_exchanges import StepExchanges

    def take(self: StepExchanges, layer: int, stage: int) -> int:
        return stage * len(layers) + layers.index(layer)

    StepExchanges.take = take  # type: ignore[method-assign]
