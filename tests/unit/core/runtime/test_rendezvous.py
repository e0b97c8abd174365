"""Hello records, how two of them are compared at rendezvous, and the listener probe."""

from __future__ import annotations

import socket
import sys
from dataclasses import replace

import pytest

from afd_core.config import AFDConfig
from afd_core.connector import WireSpec
from afd_core.errors import AFDConfigError, AFDProtocolError
from afd_core.runtime.rendezvous import (
    PROTOCOL,
    Hello,
    bind_listener,
    compare_hello,
    is_self_connection,
    open_session,
)
from afd_core.tools.launch import free_ports
from afd_core.wire.metadata import TransferHeader

WIRE = WireSpec(hidden_size=128, dtype="bfloat16", num_exchange_layers=4)


def hello(role: str, rank: int, wire: WireSpec = WIRE, **config) -> Hello:
    cfg = AFDConfig(role=role, connector="P2pGlooAFDConnector", **config)
    return Hello.of(cfg, rank, wire)


def test_hello_records_round_trip_through_json():
    record = hello("attention", 1, num_attention_ranks=2)
    assert Hello.decode(record.encode()) == record
    assert record.world_rank == 2
    assert record.protocol == PROTOCOL


def test_an_unreadable_hello_record_is_a_protocol_error():
    with pytest.raises(AFDProtocolError, match="install the same version on both roles"):
        Hello.decode(b"{not json")
    with pytest.raises(AFDProtocolError, match="unreadable hello record"):
        Hello.decode(b'{"role": "ffn"}')


def test_records_that_agree_compare_equal_whatever_role_and_timeout():
    assert (
        compare_hello(hello("ffn", 0), hello("attention", 0, afd_process_group_timeout_s=5)) is None
    )


def test_a_config_difference_names_the_field_and_who_has_which_value():
    message = compare_hello(
        hello("ffn", 0, num_attention_ranks=2), hello("attention", 0, num_attention_ranks=1)
    )
    assert message == (
        "AFD rendezvous: this ffn rank 0 has num_attention_ranks=2, attention rank 0 "
        "(world rank 1) has 1; start both roles with the same AFD config"
    )


def test_a_wire_difference_asks_for_the_same_model_and_dtype():
    message = compare_hello(hello("attention", 0), hello("ffn", 0, WireSpec(256, "bfloat16", 4)))
    assert (
        "this attention rank 0 has wire.hidden_size=128, FFN rank 0 (world rank 0) "
        "has 256" in message
    )
    assert message.endswith("serve the same model with the same dtype on both roles")


def test_a_protocol_difference_asks_for_the_same_afd_core():
    theirs = replace(hello("ffn", 0), protocol={**PROTOCOL, "data": 99})
    message = compare_hello(hello("attention", 0), theirs)
    assert f"protocol.data={TransferHeader.VERSION}, FFN rank 0 (world rank 0) has 99" in message
    assert "install the same afd-core version on both roles" in message


def test_every_difference_is_listed():
    message = compare_hello(
        hello("ffn", 0, num_attention_ranks=2, compute_gate_on_attention=True),
        hello("attention", 0, WireSpec(128, "float16", 4)),
    )
    for field in (
        "num_attention_ranks=2",
        "compute_gate_on_attention=True",
        "wire.dtype='bfloat16'",
    ):
        assert field in message


@pytest.mark.skipif(sys.platform != "linux", reason="TCP simultaneous open is Linux behaviour")
def test_a_probe_connected_to_itself_is_not_a_listener():
    # What the attention side's probe of a not yet listening FFN port can run into.
    (port,) = free_ports(1)
    with socket.socket() as own:
        own.bind(("127.0.0.1", port))
        own.connect(("127.0.0.1", port))
        assert is_self_connection(own)
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        assert not is_self_connection(client)


def _accepts(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect((host, port))
        except OSError:
            return False
        return True


def test_the_store_listens_on_the_configured_host_only():
    pytest.importorskip("torch.distributed", reason="the store is torch's TCPStore")
    (port,) = free_ports(1)
    session = open_session("127.0.0.1", port, is_master=True, timeout_s=10)
    try:
        assert _accepts("127.0.0.1", port)
        # Linux routes all of 127.0.0.0/8 to the loopback device: a listener bound to
        # every interface (torch's own) would accept 127.0.0.2 and ::1 too.
        assert not _accepts("127.0.0.2", port)
        if socket.has_ipv6:
            assert not _accepts("::1", port)
        client = open_session("127.0.0.1", port, is_master=False, timeout_s=10)
        assert client.session_id == session.session_id
    finally:
        del session


def test_a_store_address_in_use_is_a_config_error_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AFDConfigError, match=rf"cannot listen on 127\.0\.0\.1:{port}"):
            bind_listener("127.0.0.1", port)
    with pytest.raises(AFDConfigError, match="not an address of this machine"):
        bind_listener("192.0.2.1", port)  # TEST-NET-1: never an address of this host


def test_a_rank_listens_on_its_own_address_towards_ffn_rank_0():
    from afd_core.runtime.liveness import local_address_towards

    assert local_address_towards("127.0.0.1") == "127.0.0.1"
    assert local_address_towards("localhost") in {"127.0.0.1", "::1"}


def test_a_num_stages_difference_names_both_values():
    message = compare_hello(hello("attention", 0, num_stages=2), hello("ffn", 0, num_stages=1))
    assert message == (
        "AFD rendezvous: this attention rank 0 has num_stages=2, FFN rank 0 (world rank 0) "
        "has 1; start both roles with the same AFD config"
    )
