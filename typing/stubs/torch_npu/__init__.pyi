# torch_npu 2.13.0: nothing of it is called by name; importing it registers the NPU device.
