"""The `--tool-call-parser` and `--reasoning-parser` names (vLLM's), without importing parsers."""

TOOL_CALL_PARSERS = ("auto", "kimi_k2", "deepseek_v31", "deepseek_v32", "glm45", "glm47",
                     "hermes", "qwen3_coder")
REASONING_PARSERS = ("auto", "deepseek_r1", "deepseek_v3", "qwen3", "glm45", "kimi_k2", "kimi")
