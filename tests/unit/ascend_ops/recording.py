"""A transport that records interrupt and close and refuses to move data: for tests of
what the reference groups decide before any message moves."""

from __future__ import annotations

import torch

from afd_core.dataplane.transport import Transport


class RecordingTransport(Transport):
    def __init__(self) -> None:
        self.calls: list[str] = []

    @property
    def device(self):
        return torch.device("cpu")

    def post_send(self, tensor, peer):
        raise AssertionError("no op runs in these tests")

    post_recv = post_send

    def wait(self, transfer, deadline):
        raise AssertionError("no op runs in these tests")

    def interrupt(self) -> None:
        self.calls.append("interrupt")

    def close(self) -> None:
        self.calls.append("close")
