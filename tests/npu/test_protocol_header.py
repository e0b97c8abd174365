"""The AscendC kernels' header (``csrc/common/afd_protocol.h``) is the reference ops'
header (``afd_ascend_ops.header.OpsHeader``): the same constants, and, compiled with
g++ as host C++17, the same 64 bytes for the same fields in both directions.

The constants are compared by reading the header's ``constexpr`` lines (no compiler
needed; most are in ``afd_header_table.h``, generated from ``afd_ascend_ops.header``); the
codec by building ``tests/npu/header_codec.cpp`` against the header.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from afd_ascend_ops.header import OPS, OpsHeader
from afd_core.wire.metadata import WIRE_DTYPES
from tests.npu.modules import ROOT

COMMON = ROOT / "packages" / "afd-ascend-ops" / "csrc" / "common"
PROTOCOL = COMMON / "afd_protocol.h"
TABLE = COMMON / "afd_header_table.h"  # its constants, generated from afd_ascend_ops.header
CODEC = Path(__file__).with_name("header_codec.cpp")

_CONSTEXPR = re.compile(r"^constexpr uint32_t (k\w+) = (0x[0-9a-fA-F]+|\d+)u?;", re.MULTILINE)


def constants() -> dict[str, int]:
    """The header's ``constexpr uint32_t kName = value;`` lines with a literal value."""
    text = PROTOCOL.read_text() + TABLE.read_text()
    return {name: int(value, 0) for name, value in _CONSTEXPR.findall(text)}


def test_the_kernel_header_constants_are_the_reference_headers() -> None:
    c = constants()
    assert c["kHeaderBytes"] == OpsHeader.SIZE
    assert c["kHeaderMagic"] == int.from_bytes(OpsHeader.MAGIC, "little")
    assert c["kHeaderVersion"] == OpsHeader.VERSION
    ops = {"a2e": "kOpA2e", "e2a": "kOpE2a", "dispatch": "kOpDispatch", "combine": "kOpCombine"}
    assert {op: c[name] for op, name in ops.items()} == OPS
    dtypes = {"bfloat16": "kDtypeBfloat16", "float16": "kDtypeFloat16", "float32": "kDtypeFloat32"}
    assert {dtype: c[name] for dtype, name in dtypes.items()} == WIRE_DTYPES
    gated = OpsHeader("dispatch", 0, 0, 0, 0, 1, "bfloat16", topk=1, gated=True).encode()
    assert int.from_bytes(gated[34:36], "little") == c["kFlagGated"]


HEADERS = [
    OpsHeader("a2e", seq=7, source=3, destination=1, rows=5, hidden_size=256, dtype="bfloat16"),
    OpsHeader(
        "e2a", seq=2**40 + 9, source=0, destination=4, rows=0, hidden_size=8, dtype="float32"
    ),
    OpsHeader(
        "dispatch", seq=1, source=2, destination=0, rows=64, hidden_size=4096, dtype="float16",
        topk=8, gated=True,
    ),
    OpsHeader(
        "combine", seq=123456, source=1, destination=2, rows=3, hidden_size=7168,
        dtype="bfloat16", layer=60,
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: building the kernels' header codec needs it")
    binary = tmp_path_factory.mktemp("header-codec") / "header_codec"
    command = [
        "g++",
        "-std=c++17",
        "-Wall",
        "-Werror",
        f"-I{COMMON}",
        str(CODEC),
        "-o",
        str(binary),
    ]
    built = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    return binary


def run(codec: Path, *args: object) -> str:
    done = subprocess.run(
        [str(codec), *map(str, args)], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.strip()


@pytest.mark.parametrize("header", HEADERS, ids=lambda h: h.op)
def test_the_kernels_encode_the_bytes_the_reference_encodes(codec: Path, header: OpsHeader) -> None:
    encoded = run(
        codec, "encode", OPS[header.op], WIRE_DTYPES[header.dtype], header.seq, header.source,
        header.destination, header.rows, header.hidden_size, header.topk, int(header.gated),
        header.layer,
    )  # fmt: skip
    assert bytes.fromhex(encoded) == header.encode()


@pytest.mark.parametrize("header", HEADERS, ids=lambda h: h.op)
def test_the_kernels_decode_the_reference_header_field_by_field(
    codec: Path, header: OpsHeader
) -> None:
    fields = [int(word) for word in run(codec, "decode", header.encode().hex()).split()]
    magic, version, op, dtype, seq, source, destination, rows, hidden, topk, flags, layer = fields
    assert magic.to_bytes(4, "little") == OpsHeader.MAGIC and version == OpsHeader.VERSION
    assert (op, dtype) == (OPS[header.op], WIRE_DTYPES[header.dtype])
    assert (seq, source, destination) == (header.seq, header.source, header.destination)
    assert (rows, hidden, topk, layer) == (
        header.rows,
        header.hidden_size,
        header.topk,
        header.layer,
    )
    assert flags == int(header.gated)


def test_a_changed_field_changes_the_kernels_bytes(codec: Path) -> None:
    """The codec check is sharp: one field off by one gives other bytes."""
    header = HEADERS[0]
    encoded = run(codec, "encode", 1, 1, header.seq, header.source, header.destination,
                  header.rows + 1, header.hidden_size, 0, 0, 0)  # fmt: skip
    assert bytes.fromhex(encoded) != header.encode()
