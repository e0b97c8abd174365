# torch_npu/_C (torch-npu 2.13.0 wheel, read unzipped): the HCCL process group, as
# torch_npu/_init/registry/distributed.py:4-20 builds it and
# torch_npu/profiler/profiler_interface.py:382-400 names it; shutdown is a bound method
# of the compiled module (libtorch_npu.so exports the name); barrier is torch's Backend method.
from datetime import timedelta

from torch.distributed import Store, Work

class ProcessGroupHCCL:
    class Options:
        _timeout: timedelta
        is_high_priority_stream: bool
        def __init__(self) -> None: ...

    def __init__(self, store: Store, rank: int, size: int, options: Options) -> None: ...
    def get_hccl_comm_name(self, rank_id: int, init_comm: bool = True) -> str: ...
    def barrier(self) -> Work: ...
    def shutdown(self) -> None: ...
