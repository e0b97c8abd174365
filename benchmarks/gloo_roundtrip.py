"""Per-layer round trip of P2pGlooAFDConnector against a raw gloo ping-pong.

Two processes (FFN rank 0, attention rank 0) on this host. For every token count and
hidden size (bf16) the same run alternates, layer by layer (so both see the same load
from anything else on the host):

* **connector**: the attention endpoint's ``send`` + ``recv``; the FFN endpoint's
  ``recv`` + ``send`` of the unchanged hidden states (identity compute), in steps of
  ``BLOCK`` layers, each step announced by one control payload (``begin_step``);
* **raw**: a ``ProcessGroupGloo`` ping-pong of the same hidden-state bytes each way
  (receive posted before the send, like the connector);
* **framed**: header messages without the connector: a 64-byte header message and then
  the hidden states each way, posted in the connector's order. That is how the
  connector sends messages above its frame limit (1 MiB; up to it a message is one
  frame, header and tensors together: ``afd_core.runtime.messages.frames``).
  ``framed / raw`` is what a header message of its own costs;
* **inline**: the frame form's essential work written inline, without the endpoints:
  the attention side copies a 64-byte header and the hidden states into a reused frame,
  posts the receive of the reply into a frame allocated one layer ahead and the send,
  allocates the next reply frame, waits, compares the reply's 64 header bytes and views
  its rows as the output; the FFN side receives into a reused frame, compares the
  header, copies header and rows into its reply frame and sends it. ``inline / raw`` is
  what a frame costs on its own; ``conn / inline`` what the endpoints add to it.

Raw, framed and inline run on the connector's own gloo group (the one its link opened
for the control channel and the data plane), under tags of their own: each gloo group
has an I/O thread of its own, and with two groups the scheduler places those threads
differently on a 2-core host, which alone made two identical raw ping-pongs on two
groups differ by 0.87-1.29x from run to run (docs/performance.md).

It prints the median and the 10th percentile round trip of connector and raw (µs), their
ratios, the median framed round trip as a ratio to raw, and the median time the
attention rank spends beginning one step (its control payload).
:func:`measure` and :func:`format_table` are also used by ``benchmarks/afd_decode.py``.
Usage::

    PYTHONPATH=packages/afd-core/src python benchmarks/gloo_roundtrip.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import queue
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TOKENS = (1, 8, 64, 256)
HIDDEN = (128, 2048)
BLOCK = 50  # layers per connector step
TAG_PING, TAG_PONG = 11, 12
HEADER_BYTES = 64
RESULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RoundTrip:
    """Timings (µs) of one (tokens, hidden) size: one value per timed layer, or per timed
    step for ``control_us`` (the attention rank's ``send_step``)."""

    tokens: int
    hidden: int
    raw_us: tuple[float, ...]
    conn_us: tuple[float, ...]
    control_us: tuple[float, ...]
    framed_us: tuple[float, ...]
    inline_us: tuple[float, ...]

    @property
    def nbytes(self) -> int:
        """Hidden-state bytes each way (bf16)."""
        return self.tokens * self.hidden * 2

    @property
    def raw_median(self) -> float:
        """Median raw gloo round trip (µs)."""
        return statistics.median(self.raw_us)

    @property
    def conn_median(self) -> float:
        """Median connector round trip (µs)."""
        return statistics.median(self.conn_us)

    @property
    def framed_median(self) -> float:
        """Median round trip of the connector's messages on the raw group (µs)."""
        return statistics.median(self.framed_us)

    @property
    def inline_median(self) -> float:
        """Median round trip of the frame form written inline (µs)."""
        return statistics.median(self.inline_us)

    @property
    def raw_p10(self) -> float:
        """10th percentile raw gloo round trip (µs)."""
        return statistics.quantiles(self.raw_us, n=10)[0]

    @property
    def conn_p10(self) -> float:
        """10th percentile connector round trip (µs)."""
        return statistics.quantiles(self.conn_us, n=10)[0]

    @property
    def control_median(self) -> float:
        """Median time of one step's control payload send (µs)."""
        return statistics.median(self.control_us)

    @property
    def control_min(self) -> float:
        """Fastest control payload send of one step (µs); one sample per step, too few
        for a 10th percentile."""
        return min(self.control_us)


class _MeasuredConnector:
    """A ``P2pGlooAFDConnector`` whose links keep a handle on their gloo group: the raw,
    framed and inline ping-pongs run on it under tags of their own, served by the same
    gloo I/O thread as the connector's messages."""

    def __init__(self, role: str, port: int, hidden: int) -> None:
        from dataclasses import replace

        from afd_core.assembly import Recipe, TransportPlane, TransportSite
        from afd_core.config import AFDConfig
        from afd_core.connector import WireSpec
        from afd_core.connectors.gloo import P2pGlooAFDConnector

        groups: list[Any] = []

        class Measured(P2pGlooAFDConnector):
            def recipe(self) -> Recipe:  # the connector's own recipe, its data plane recorded
                recipe = super().recipe()
                assert isinstance(recipe.data, TransportPlane)
                gloo = recipe.data.open

                def data_plane(site: TransportSite) -> Any:
                    groups.append(site.control.group)  # type: ignore[attr-defined]
                    return gloo(site)

                return replace(recipe, data=TransportPlane(data_plane))

        config = AFDConfig(role=role, connector="P2pGlooAFDConnector", port=port)
        wire = WireSpec(hidden_size=hidden, dtype="bfloat16", num_exchange_layers=BLOCK)
        self.connector = Measured(config, 0, wire)
        self.connector.initialize()
        (self.raw,) = groups  # this rank's one link


#: The header both inline sides agree on (any 64 bytes: the inline form checks, as the
#: connector does, that the bytes arrived as sent).
_INLINE_HEADER = bytes(range(HEADER_BYTES))


class _InlineEcho:
    """The FFN side of the inline frame form (see the module docstring)."""

    def __init__(self, raw: Any, nbytes: int) -> None:
        import torch

        self._raw, self._nbytes = raw, nbytes
        self._received = torch.empty(HEADER_BYTES + nbytes, dtype=torch.uint8)
        self._reply = torch.empty(HEADER_BYTES + nbytes, dtype=torch.uint8)
        self._received_at, self._reply_at = self._received.data_ptr(), self._reply.data_ptr()

    def serve_one(self) -> None:
        self._raw.recv([self._received], 1, TAG_PING).wait()
        if ctypes.string_at(self._received_at, HEADER_BYTES) != _INLINE_HEADER:
            raise RuntimeError("inline frame: header mismatch")
        ctypes.memmove(self._reply_at, self._received_at, HEADER_BYTES)
        rows_at = self._received_at + HEADER_BYTES  # identity compute: the output is the input
        ctypes.memmove(self._reply_at + HEADER_BYTES, rows_at, self._nbytes)
        self._raw.send([self._reply], 1, TAG_PONG).wait()


class _InlineExchange:
    """The attention side of the inline frame form (see the module docstring)."""

    def __init__(self, raw: Any, tokens: int, hidden: int) -> None:
        import torch

        self._raw, self._tokens, self._hidden = raw, tokens, hidden
        self._nbytes = tokens * hidden * 2
        self._send = torch.empty(HEADER_BYTES + self._nbytes, dtype=torch.uint8)
        self._send_at = self._send.data_ptr()
        self._next_reply = self._reply_frame()

    def _reply_frame(self) -> tuple[Any, int, Any]:
        import torch

        frame = torch.empty(HEADER_BYTES + self._nbytes, dtype=torch.uint8)
        rows = frame[HEADER_BYTES:].view(torch.bfloat16).view(self._tokens, self._hidden)
        return frame, frame.data_ptr(), rows

    def round_trip(self, hidden: Any) -> Any:
        ctypes.memmove(self._send_at, _INLINE_HEADER, HEADER_BYTES)
        ctypes.memmove(self._send_at + HEADER_BYTES, hidden.data_ptr(), self._nbytes)
        reply, reply_at, out = self._next_reply
        works = [self._raw.recv([reply], 0, TAG_PONG), self._raw.send([self._send], 0, TAG_PING)]
        self._next_reply = self._reply_frame()
        _wait_all(works)
        if ctypes.string_at(reply_at, HEADER_BYTES) != _INLINE_HEADER:
            raise RuntimeError("inline frame: header mismatch")
        return out


def _ffn(
    ports: Sequence[int], rounds: int, tokens_list: Sequence[int], hiddens: Sequence[int]
) -> None:
    import torch

    torch.set_num_threads(1)
    for hidden, port in zip(hiddens, ports, strict=True):
        measured = _MeasuredConnector("ffn", port, hidden)
        conn, raw = measured.connector, measured.raw
        ffn = conn.ffn  # as the FFN server holds it: one endpoint per connector
        for tokens in tokens_list:
            buf = torch.empty(tokens * hidden, dtype=torch.bfloat16)
            header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
            inline = _InlineEcho(raw, buf.numel() * buf.element_size())
            for _ in range(rounds + 1):  # the first round warms up
                step = ffn.next_step()
                for layer in range(BLOCK):
                    raw.recv([buf], 1, TAG_PING).wait()
                    raw.send([buf], 1, TAG_PONG).wait()
                    _wait_all([raw.recv([header], 1, TAG_PING), raw.recv([buf], 1, TAG_PING)])
                    _wait_all([raw.send([header], 1, TAG_PONG), raw.send([buf], 1, TAG_PONG)])
                    inline.serve_one()
                    batch = ffn.recv(step, layer, 0)
                    ffn.send(batch, batch.hidden)
        conn.close()


def _attention(
    ports: Sequence[int],
    rounds: int,
    tokens_list: Sequence[int],
    hiddens: Sequence[int],
    out: Any,
) -> None:
    import torch

    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    torch.set_num_threads(1)
    rows = []
    for hidden, port in zip(hiddens, ports, strict=True):
        measured = _MeasuredConnector("attention", port, hidden)
        conn, raw = measured.connector, measured.raw
        attention = conn.attention  # as the exchange op holds it: one endpoint per connector
        step_id = 0
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden).to(torch.bfloat16)
            ping, pong = x.view(-1), torch.empty(tokens * hidden, dtype=torch.bfloat16)
            header_out = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
            header_in = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
            inline = _InlineExchange(raw, tokens, hidden)
            raw_us, conn_us, control_us, framed_us, inline_us = [], [], [], [], []
            for r in range(rounds + 1):
                payload = ControlPayload(step_id, 0, (AFDDPMetadata(0, (tokens,)),))
                t0 = time.perf_counter()
                attention.begin_step(payload)
                if r:
                    control_us.append((time.perf_counter() - t0) * 1e6)
                for layer in range(BLOCK):  # alternate, so both see the same load
                    t0 = time.perf_counter()
                    work = raw.recv([pong], 0, TAG_PONG)
                    raw.send([ping], 0, TAG_PING).wait()
                    work.wait()
                    t1 = time.perf_counter()
                    _wait_all([
                        raw.recv([header_in], 0, TAG_PONG), raw.recv([pong], 0, TAG_PONG),
                        raw.send([header_out], 0, TAG_PING), raw.send([ping], 0, TAG_PING),
                    ])  # fmt: skip
                    t2 = time.perf_counter()
                    z = inline.round_trip(x)
                    t3 = time.perf_counter()
                    attention.send(layer, 0, x)
                    y = attention.recv(layer, 0)
                    t4 = time.perf_counter()
                    if r:
                        raw_us.append((t1 - t0) * 1e6)
                        framed_us.append((t2 - t1) * 1e6)
                        inline_us.append((t3 - t2) * 1e6)
                        conn_us.append((t4 - t3) * 1e6)
                step_id += 1
            assert torch.equal(x, y) and torch.equal(x, z)
            rows.append(
                RoundTrip(tokens, hidden, tuple(raw_us), tuple(conn_us), tuple(control_us),
                          tuple(framed_us), tuple(inline_us))
            )  # fmt: skip
        conn.close()
    out.put(rows)


def _wait_all(works: list[Any]) -> None:
    for work in works:
        work.wait()


def measure(
    rounds: int = 8, tokens: Sequence[int] = TOKENS, hiddens: Sequence[int] = HIDDEN
) -> list[RoundTrip]:
    """Run both processes and return one :class:`RoundTrip` per (hidden, tokens) size.

    Each size gets ``rounds`` timed steps of :data:`BLOCK` layers after one warm-up step.
    Needs torch and afd-core importable; both processes end before it returns.
    """
    from afd_core.tools.launch import free_ports

    ports = tuple(free_ports(len(hiddens)))  # one rendezvous per hidden size
    sizes = (rounds, tuple(tokens), tuple(hiddens))
    return run_pair(_ffn, _attention, (ports, *sizes), "round-trip benchmark")


def run_pair(ffn: Any, attention: Any, args: tuple[Any, ...], what: str) -> Any:
    """Run ``ffn(*args)`` and ``attention(*args, queue)`` in two spawned processes; see
    :func:`run_ranks`."""
    return run_ranks([ffn], attention, args, what)


def run_ranks(others: Sequence[Any], attention: Any, args: tuple[Any, ...], what: str) -> Any:
    """Run each of ``others`` as ``fn(*args)`` and ``attention(*args, queue)``, each in a
    spawned process of its own.

    Returns what the attention process puts on the queue. Raises RuntimeError as soon as
    any process ends without a result, or after :data:`RESULT_TIMEOUT_S`; every process
    is gone when it returns.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=fn, args=args) for fn in others]
    procs.append(ctx.Process(target=attention, args=(*args, out)))
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    try:
        while True:
            try:
                return out.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{what}: no result (exit codes of ended processes: {dead}); "
                        "see their output above"
                    ) from None
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def format_table(rows: Sequence[RoundTrip], rounds: int) -> str:
    """The round-trip table of ``rows`` (from :func:`measure` with ``rounds``) as text."""
    lines = [
        f"per-layer round trip in µs over {rounds * BLOCK} layers (bf16; the connector "
        "sends one frame (header and data) each way up to 1 MiB, a 64-byte header message and "
        "the data above; raw, framed and inline run on the connector's gloo group; p10 is less "
        "sensitive to other load on the host; framed: a header message and the data, median, "
        "as a ratio to raw; inline: the frame form without the endpoints, median, as a ratio "
        "to raw; ctrl: one step's control payload send, median and fastest)",
        f"{'tokens':>6} {'hidden':>6} {'bytes/dir':>10} | {'raw med':>8} {'conn med':>8} "
        f"{'ratio':>5} | {'raw p10':>8} {'conn p10':>8} {'ratio':>5} | {'framed':>6} | "
        f"{'inline':>6} | {'ctrl med':>8} {'ctrl min':>8}",
    ]
    for row in rows:
        lines.append(
            f"{row.tokens:>6} {row.hidden:>6} {row.nbytes:>10} | {row.raw_median:>8.1f} "
            f"{row.conn_median:>8.1f} {row.conn_median / row.raw_median:>5.2f} | "
            f"{row.raw_p10:>8.1f} {row.conn_p10:>8.1f} {row.conn_p10 / row.raw_p10:>5.2f} | "
            f"{row.framed_median / row.raw_median:>6.2f} | "
            f"{row.inline_median / row.raw_median:>6.2f} | "
            f"{row.control_median:>8.1f} {row.control_min:>8.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="timed blocks per size")
    args = parser.parse_args()
    print(format_table(measure(args.rounds), args.rounds))


if __name__ == "__main__":
    main()
