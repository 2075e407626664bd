"""nn.Modules that hold weights and call `hyla.ops`. Mixers (one per layer kind) take
`(hidden_states [T, D], positions [T], batch: ForwardBatch)` and find their cache tensors in
`batch.caches[self.layer_idx]`."""
