"""nn.Modules over `hyla.ops`. Mixers take `(hidden_states [T, D], positions [T], batch)` and
find their caches in `batch.caches[self.layer_idx]`."""
