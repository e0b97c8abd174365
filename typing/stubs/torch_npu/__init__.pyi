# torch_npu 2.13.0: importing it registers the NPU device; _C._distributed_c10d is used by name.
