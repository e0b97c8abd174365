"""The Connector life cycle, on a minimal subclass and on P2pGlooAFDConnector (no torch).

Nothing here opens a connection: ``__init__`` must create no resources, and ``close()``
must be safe before ``initialize()``.
"""

from __future__ import annotations

import socket

import pytest

from afd_core.config import AFDConfig
from afd_core.connector import AttentionEndpoint, Connector, ConnectorParts, WireSpec
from afd_core.connectors.gloo import P2pGlooAFDConnector
from afd_core.errors import AFDConfigError, AFDShutdown
from afd_core.tools.launch import free_ports

WIRE = WireSpec(hidden_size=8, dtype="float32", num_exchange_layers=2)


def config(role: str = "attention", **kw) -> AFDConfig:
    return AFDConfig(role=role, connector="P2pGlooAFDConnector", **kw)


class NullEndpoint(AttentionEndpoint):
    """An attention endpoint that exchanges nothing (the defaults are what is tested)."""

    def begin_step(self, payload) -> None:
        raise NotImplementedError

    def send(self, layer, stage, hidden, *, router_logits=None, routing=None) -> None:
        raise NotImplementedError

    def recv(self, layer, stage):
        raise NotImplementedError


class RecordingConnector(Connector):
    """The smallest complete connector: records life-cycle calls."""

    name = "RecordingConnector"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def connect(self) -> ConnectorParts:
        self.calls.append("connect")
        return ConnectorParts(NullEndpoint(), (lambda: self.calls.append("shutdown"),))


def test_close_before_initialize_is_safe_and_idempotent():
    conn = RecordingConnector(config(), 0, WIRE)
    assert not conn.is_closed and not conn.is_initialized
    conn.close()
    conn.close()
    assert conn.is_closed and not conn.is_initialized
    assert conn.calls == []


def test_initialize_runs_once_and_close_undoes_it():
    conn = RecordingConnector(config(), 0, WIRE)
    conn.initialize()
    conn.initialize()
    assert conn.is_initialized and conn.calls == ["connect"]
    conn.close()
    conn.close()
    assert not conn.is_initialized
    assert conn.calls == ["connect", "shutdown"]


def test_a_closed_connector_cannot_be_initialized_again():
    conn = RecordingConnector(config(), 0, WIRE)
    conn.close()
    with pytest.raises(RuntimeError, match="was closed; build a new connector"):
        conn.initialize()


def test_world_rank_follows_the_topology():
    assert (
        RecordingConnector(
            config("ffn", num_attention_ranks=3, num_ffn_ranks=2), 1, WIRE
        ).world_rank
        == 1
    )
    assert (
        RecordingConnector(config(num_attention_ranks=3, num_ffn_ranks=2), 1, WIRE).world_rank == 3
    )


def test_connector_extra_config_is_rejected_when_the_connector_takes_none():
    with pytest.raises(AFDConfigError, match=r"fields \['depth'\] but RecordingConnector"):
        RecordingConnector(config(connector_extra_config={"depth": 2}), 0, WIRE)
    with pytest.raises(AFDConfigError, match="P2pGlooAFDConnector takes none"):
        P2pGlooAFDConnector(config(connector_extra_config={"depth": 2}), 0, WIRE)


@pytest.mark.parametrize("role", ["ffn", "attention"])
def test_gloo_connector_construction_opens_nothing(role):
    (port,) = free_ports(1)
    conn = P2pGlooAFDConnector(config(role, port=port), 0, WIRE)
    # FFN rank 0 hosts the store once initialized; constructing it must not bind the port.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    conn.close()
    conn.close()
    assert conn.is_closed


def test_gloo_connector_refuses_data_before_initialize_and_after_close():
    conn = P2pGlooAFDConnector(config(), 0, WIRE)
    with pytest.raises(RuntimeError, match="call initialize"):
        conn.attention.send(0, 0, None)
    with pytest.raises(RuntimeError, match="the ffn endpoint is for the ffn role"):
        conn.ffn.next_step()
    conn.close()
    with pytest.raises(AFDShutdown):
        conn.attention.recv(0, 0)


def test_gloo_connector_rejects_a_dtype_it_cannot_send():
    with pytest.raises(AFDConfigError, match="dtype 'float64' cannot travel on the wire"):
        P2pGlooAFDConnector(config(), 0, WireSpec(8, "float64", 1))


def test_an_endpoint_without_graph_steps_refuses_them_but_may_enter_a_capture_routine():
    endpoint = NullEndpoint()
    with endpoint.graph_capture():  # vLLM may run a capture routine that captures nothing
        pass
    with pytest.raises(NotImplementedError, match="does not support CUDA graph steps"):
        endpoint.watch_graph_replay(0)


def test_a_connector_closed_while_connecting_takes_its_parts_down():
    class ClosedMidway(RecordingConnector):
        def connect(self) -> ConnectorParts:
            parts = super().connect()
            self.fuse.close()  # what close() on another thread does before it waits
            return parts

    conn = ClosedMidway(config(), 0, WIRE)
    with pytest.raises(AFDShutdown, match="closed during initialize"):
        conn.initialize()
    assert conn.calls == ["connect", "shutdown"]


class MislabelledConnector(P2pGlooAFDConnector):
    """A plugin bug: its recipe names the expert-routed pattern, its class the block one."""

    def recipe(self):
        from dataclasses import replace

        from afd_core.assembly import EXPERT_ROUTED

        return replace(super().recipe(), pattern=EXPERT_ROUTED)


def test_a_recipe_whose_pattern_is_not_the_pattern_type_is_refused_before_any_rendezvous():
    conn = MislabelledConnector(config(), 0, WIRE)
    with pytest.raises(
        AFDConfigError, match=r"ExpertRouted pattern, but its pattern_type is P2pBlock"
    ):
        conn.initialize()
    assert not conn.is_initialized
