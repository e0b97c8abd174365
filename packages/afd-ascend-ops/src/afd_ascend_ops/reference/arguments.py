"""The checks of the reference kernels' arguments that every op shares."""

from __future__ import annotations

import torch

from afd_ascend_ops.reference.bodies import TORCH_DTYPES, WIRE_TORCH_DTYPES


def wire_dtype(op: str, group: str, name: str, tensor: torch.Tensor) -> str:
    """The wire name of ``tensor``'s dtype; ValueError for a tensor the CPU reference
    kernels cannot move."""
    dtype = WIRE_TORCH_DTYPES.get(tensor.dtype)
    if dtype is None or tensor.device.type != "cpu":
        raise ValueError(
            f"afd_ascend::{op} on group {group!r}: the CPU reference kernel moves CPU tensors "
            f"of {sorted(TORCH_DTYPES)}; {name} is {tensor.dtype} on {tensor.device}"
        )
    return dtype


def check_positive(op: str, name: str, value: int) -> None:
    """ValueError unless ``value`` is positive."""
    if value <= 0:
        raise ValueError(f"afd_ascend::{op}: {name} must be positive, not {value}")
