"""Tensor and expert parallelism inside one node. The engine process is rank 0 (the driver
worker) and alone holds the scheduler and cache bookkeeping; ranks 1..N-1 fork from a forkserver."""
