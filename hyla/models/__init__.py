"""Model assembly: one hybrid decoder built from a layer pattern (`hybrid.py`), per-family
adapters that turn Hugging Face configs and tensor names into hyla's (`kimi_linear.py`,
`deepseek_v32.py`, `qwen3_next.py`, `registry.py`), and the checkpoint loader (`loader.py`)."""
