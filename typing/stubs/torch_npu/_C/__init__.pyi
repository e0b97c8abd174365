# torch_npu 2.13.0 (wheel): the compiled module; only _distributed_c10d is used by name.
