"""``ExpertRoutedAFDConnector``: expert-routed M:N exchange (M attention ranks, N FFN ranks).

The routed experts are split over the FFN ranks in contiguous blocks
(:mod:`afd_core.placement`); each FFN rank builds and loads only its block. The
attention rank runs the gate and the router (``compute_gate_on_attention`` is required)
and sends each token to every FFN rank that holds one of its top-k experts, once per such
rank, with the routing; each FFN rank computes only its experts and sends back its
partial result per token; the attention rank adds them up. Any M and N (N > M too).

A recipe (:mod:`afd_core.assembly`): afd-core's expert-routed pattern (steps announced to
FFN rank 0 and relayed to the others), over a data transport chosen by
``connector_extra_config.transport``: ``"nccl"``
(:class:`~afd_connectors_gpu.nccl_transport.NcclTransport`, CUDA tensors), ``"gloo"``
(host memory, any platform) or ``"auto"`` (the default: NCCL when this process has CUDA,
else gloo; set it explicitly when the roles run on different kinds of hosts).

Not built yet, and this is its seam: a DeepEP (NVSHMEM, fixed-capacity low-latency
buffers) dispatch/combine backend, which would replace the point-to-point endpoints with
an endpoint pair of the same contract. Until afd-connectors-gpu 0.3 the connector was
called ``DeepEPM2NAFDConnector`` after that plan; the old name stays registered for the
same class, so existing configs still start. The exchange
is eager: CUDA graphs are refused at start-up (its capabilities have no
``cuda_graphs``), since variable routed counts need host synchronisation per
layer on NCCL today. Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from afd_connectors_gpu.nccl_transport import NcclTransport
from afd_core.assembly import (
    EXPERT_ROUTED,
    Control,
    ExpertRouted,
    Layout,
    Recipe,
    TransportPlane,
    TransportSite,
    gloo_data_plane,
)
from afd_core.config.coercion import reject_unknown_fields
from afd_core.config.partials import PartialsDtype, parse_partials_dtype
from afd_core.connector import Connector
from afd_core.dataplane.transport import Transport
from afd_core.errors import AFDConfigError

if TYPE_CHECKING:
    from afd_core.config import AFDConfig
    from afd_core.connector import WireSpec

TransportChoice = Literal["auto", "gloo", "nccl"]
_CHOICES: tuple[TransportChoice, ...] = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class M2NExtraConfig:
    """``connector_extra_config`` of :class:`ExpertRoutedAFDConnector`.

    ``transport``: ``"auto"`` (NCCL with CUDA, else gloo), ``"gloo"`` or ``"nccl"``;
    ``partials_dtype``: ``"model"`` or ``"float32"`` (:mod:`afd_core.config.partials`).
    """

    transport: TransportChoice = "auto"
    partials_dtype: PartialsDtype = "model"

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> M2NExtraConfig:
        """Parse ``raw`` strictly; AFDConfigError naming any unknown or invalid field."""
        reject_unknown_fields(raw, ("transport", "partials_dtype"), "ExpertRoutedAFDConnector")
        transport = raw.get("transport", "auto")
        if transport not in _CHOICES:
            raise AFDConfigError(
                f"AFD config: connector_extra_config.transport must be one of "
                f"{list(_CHOICES)}, got {transport!r}"
            )
        return cls(transport, parse_partials_dtype(raw, "ExpertRoutedAFDConnector"))


class ExpertRoutedAFDConnector(Connector):
    """AFD connector: expert-routed M:N over gloo or NCCL (see the module docstring)."""

    name = "ExpertRoutedAFDConnector"
    pattern_type = ExpertRouted

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec) -> None:
        super().__init__(config, role_rank, wire)
        EXPERT_ROUTED.check(self.runtime_spec())  # the routing must fit a message body

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> M2NExtraConfig:
        """Accept ``transport`` and ``partials_dtype`` (see :class:`M2NExtraConfig`)."""
        return M2NExtraConfig.parse(raw)

    def recipe(self) -> Recipe:
        """Over NCCL: one world of every rank. Over gloo: a link of its own per
        (attention rank, FFN rank) pair, so that an attention server can be replaced
        while the FFN ranks serve the others. Either way announced steps (relayed by FFN
        rank 0) and the expert-routed pattern."""
        if self._uses_nccl():

            def data(site: TransportSite) -> Transport:
                return NcclTransport.open(
                    site.opener, site.world_rank, site.world_size, site.peers, site.timeout_s
                )

            return Recipe(Layout.WORLD, Control.ANNOUNCED, TransportPlane(data), EXPERT_ROUTED)
        return Recipe(Layout.LINKS, Control.ANNOUNCED, gloo_data_plane(), EXPERT_ROUTED)

    def _uses_nccl(self) -> bool:
        choice = self.extra.transport
        if choice == "auto":
            import torch

            return torch.cuda.is_available()
        return choice == "nccl"
