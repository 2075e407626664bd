"""DeepSeek-V4's shared-KV attention with sinks over a sliding window and compressed entries."""

from hyla.ops.sink_attention.reference import sink_window_attention

__all__ = ["sink_window_attention"]
