"""Pure tensor functions: `ops/<op>/reference.py` defines each op in PyTorch, `kernels.py` is
its Triton fast path, and the package `__init__` dispatches on the tensor's device."""
