"""Tensor and expert parallelism inside one node (more later: nothing here assumes one host).

    groups.py    the TP group of one rank (device collectives) and its CPU group (the plan)
    sharding.py  which slice of every weight a rank holds; the rank's own ModelConfig
    loader.py    build a rank's model and read only its slices from the safetensors files
    worker.py    one rank: its model shard, caches and ModelRunner; the loop of ranks 1..N-1
    executor.py  the engine side: spawns the workers, sends each step's plan, checks health

The engine process is rank 0 (the driver worker); ranks 1..N-1 are processes forked from a
forkserver. The scheduler and the cache bookkeeping live only in the engine process.
"""
