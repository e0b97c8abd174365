"""The ops as torch sees them: registered schemas, fake shapes, one graph under
``torch.compile(fullgraph=True)``, the CPU kernels' refusals without a group."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from afd_ascend_ops import ops  # noqa: E402
from afd_ascend_ops.registry import UnknownGroupError  # noqa: E402
from afd_ascend_ops.schemas import SCHEMAS  # noqa: E402
from afd_core.errors import AFDInstallError  # noqa: E402

afd = torch.ops.afd_ascend
H = 16


def shapes(tensors):
    return [(tuple(t.shape), t.dtype) for t in tensors]


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_op_is_registered_with_its_schema(name):
    registered = str(getattr(afd, name).default._schema)
    assert registered == str(torch._C.parse_schema(f"afd_ascend::{SCHEMAS[name]}"))


def test_defining_again_skips_an_op_that_exists_and_refuses_another_schema():
    library = torch.library.Library("afd_ascend_unit_test", "FRAGMENT")
    assert ops.define_missing(library, "probe(Tensor x, int n=0) -> Tensor")
    assert not ops.define_missing(library, "probe(Tensor x, int n=0) -> Tensor")
    with pytest.raises(AFDInstallError, match="already defined"):
        ops.define_missing(library, "probe(Tensor x, int m=0) -> Tensor")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a2e_fake_shapes_on_ffn_and_attention(dtype):
    with FakeTensorMode():
        x = torch.empty(0, H, dtype=dtype)
        # FFN rank 1 of 2, three attention ranks: ceil(3/2) = 2 counts.
        gated = afd.a2e(x, None, None, 7, H, 4, 2, 3, 1, "g", 0, 1)
        plain = afd.a2e(x, None, None, 7, H, 4, 2, 3, 1, "g")
        attention = afd.a2e(torch.empty(5, H, dtype=dtype), None, None, 5, H, 4, 2, 3, 3, "g")
    assert shapes(gated) == [
        ((7, H), dtype),
        ((7, 4), torch.int32),
        ((7, 4), torch.float32),
        ((2,), torch.int32),
        ((7,), torch.bool),
    ]
    assert shapes(plain)[1:3] == [((1, 1), torch.int32), ((1, 1), torch.float32)]
    assert shapes(plain)[0] == ((7, H), dtype)
    assert shapes(attention) == [
        ((1, 1), dtype),
        ((1, 1), torch.int32),
        ((1, 1), torch.float32),
        ((2,), torch.int32),
        ((1,), torch.bool),
    ]


def test_e2a_fake_shapes_on_ffn_and_attention():
    with FakeTensorMode():
        counts = torch.empty(2, dtype=torch.int32)
        ffn = afd.e2a(torch.empty(7, H, dtype=torch.bfloat16), counts, 7, H, 4, 2, 3, 0, "g")
        attention = afd.e2a(torch.empty(5, 3, dtype=torch.bfloat16), counts, 0, H, 4, 2, 3, 2)
    assert shapes([ffn, attention]) == [((1, 1), torch.bfloat16), ((5, H), torch.bfloat16)]


def test_cam_async_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(3, H, dtype=torch.bfloat16)
        ids = torch.empty(3, 2, dtype=torch.int32)
        comm = torch.empty(1, dtype=torch.float16)
        # 2 attention ranks (tp 1), 2 FFN ranks of 3 experts each, top 2, 64 tokens.
        sent = afd.afd_async_dispatch_send(
            x, ids, comm, 0, 64, 3, H, 2, 2, 2, 3, 0, 4, 1, 1, 0, "g"
        )
        plain = afd.afd_async_dispatch_recv(x[:1, 0], comm, 0, 64, H, 2, 2, 2, 3, 2, 4, 1, 0, "g")
        quant = afd.afd_async_dispatch_recv(x[:1, 0], comm, 0, 64, H, 2, 2, 2, 3, 2, 4, 1, 1, "g")
        info = torch.empty(9, dtype=torch.int64)
        back = afd.afd_async_combine_send(x, comm, info, 0, 64, H, 2, 2, 2, 3, 2, 4, 1, "g")
        scales = torch.empty(3, 2)
        got = afd.afd_async_combine_recv(
            x[:1, 0], ids, scales, comm, 0, 3, H, 2, 2, 2, 3, 0, 4, "g"
        )
    assert shapes([sent, back]) == [((1,), torch.int8)] * 2
    assert shapes(plain) == [
        ((128, H), torch.bfloat16),
        ((1,), torch.float32),
        ((5 + 1 + 3,), torch.int64),
        ((3,), torch.int64),
    ]
    assert shapes(quant)[:2] == [((128, H), torch.int8), ((128,), torch.float32)]
    assert shapes([got]) == [((3, H), torch.bfloat16)]


def test_a2e_compiles_into_one_graph_with_the_fake_shapes():
    seen = []

    def capture(gm, example_inputs):
        seen.extend(
            node.meta["example_value"]
            for node in gm.graph.nodes
            if node.op == "call_function" and node.target in (afd.a2e, afd.a2e.default)
        )
        return lambda *args: (torch.zeros(()),)  # the op itself never runs here

    @torch.compile(fullgraph=True, backend=capture)
    def exchange(x):
        out = afd.a2e(x, None, None, 6, H, 2, 1, 2, 0, "g", 0, 1)
        return out[0].sum() + out[3].sum()

    exchange(torch.ones(0, H, dtype=torch.bfloat16))
    assert len(seen) == 1
    assert shapes(seen[0]) == [
        ((6, H), torch.bfloat16),
        ((6, 2), torch.int32),
        ((6, 2), torch.float32),
        ((2,), torch.int32),
        ((6,), torch.bool),
    ]


def test_the_cpu_kernel_names_an_unknown_group():
    x = torch.ones(2, H, dtype=torch.bfloat16)
    with pytest.raises(UnknownGroupError, match="'no-such-group'"):
        afd.a2e(x, None, None, 2, H, 2, 1, 1, 1, "no-such-group")
    with pytest.raises(UnknownGroupError, match="'no-such-group'"):
        afd.e2a(x, torch.zeros(1, dtype=torch.int32), 2, H, 2, 1, 1, 1, "no-such-group")


def test_the_cam_async_cpu_kernels_name_an_unknown_group():
    x = torch.ones(3, H, dtype=torch.bfloat16)
    comm = torch.ones(1, dtype=torch.float16)
    with pytest.raises(UnknownGroupError, match="'no-such-group'"):
        afd.afd_async_combine_send(x, comm, torch.zeros(9, dtype=torch.int64), 0, 64, H, 2, 2,
                                   2, 3, 2, 4, 1, "no-such-group")  # fmt: skip
