"""Cache bookkeeping (plain Python, no torch): pools, tables, prefix index, byte arithmetic."""
