"""Cache bookkeeping (plain Python, no torch): block pool, per-request block tables and state
slots, prefix index, and the byte arithmetic of cache entries (`spec`)."""
