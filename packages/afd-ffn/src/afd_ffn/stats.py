"""Counters of one FFN rank, readable while its server runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class FFNStats:
    """What an FFN rank has served since it started.

    ``steps``: control payloads (forwards of the attention ranks) completed (0 with an
    in-band connector, which has no steps: it counts ``work_items``, each one layer of one
    attention rank's stage);
    ``layer_exchanges``: (layer, stage) batches computed and sent back; ``tokens``: tokens
    of the completed steps, summed over the attention ranks and stages of each step (a
    token counts once per step, not once per layer), and ``tokens_by_attention_rank`` the
    same by attention rank (keys: the rank as a string); ``stages``: stages of the completed
    steps (a step of two micro-batch stages counts 2), of which ``two_stage_steps`` had
    two (``num_stages`` 2). CUDA graphs: ``graphs_captured``
    (capture steps; they move no data and are not counted as steps), ``graph_replays``
    and ``graph_steps_eager`` (graph steps served by replaying a captured graph, or
    eagerly because no graph of their shape is kept). ``rows``: rows computed over all
    eager layer exchanges (a token counts once per layer; with an expert-routed connector
    only the tokens routed to this rank). ``rendezvous``: rendezvous completed (1 after
    start-up; one more for each new set of attention ranks served after the previous ones
    all left, with a connector that does not replace attention ranks one by one; one that
    does counts its replacements in the endpoint's ``attention_replacements``).
    ``rendezvous_s``: seconds spent in the rendezvous completed (from each start of the
    connector's ``initialize`` to its end; failed attempts at a new rendezvous not
    counted). ``busy_s``: seconds from each eager layer batch received to its result sent (the
    FFN's work on a layer, the reply's copy included); over a window of wall time it
    gives the share the FFN rank worked rather than waited for attention. Written
    only by the server thread; readers see whole numbers (Python int updates are atomic),
    possibly one step behind.
    """

    steps: int = 0
    layer_exchanges: int = 0
    tokens: int = 0
    tokens_by_attention_rank: dict[str, int] = field(default_factory=dict)
    stages: int = 0
    two_stage_steps: int = 0
    rows: int = 0
    graphs_captured: int = 0
    graph_replays: int = 0
    graph_steps_eager: int = 0
    rendezvous: int = 0
    rendezvous_s: float = 0.0
    work_items: int = 0
    busy_s: float = 0.0

    def as_dict(self) -> dict[str, int | float]:
        """The counters as a plain dict (what ``afd_stats`` returns over vLLM's RPC)."""
        return asdict(self)
