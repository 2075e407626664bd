"""Speculative decoding: n-gram drafts verified in one multi-token step (docs/architecture.md)."""
