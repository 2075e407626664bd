"""Pure tensor functions. Each op lives in `ops/<op>/`: `reference.py` is the readable PyTorch
definition (CPU, fp32-exact), `kernels.py` the GPU fast path with the same signature; the
package `__init__` exposes the public function and dispatches on the tensor's device."""
