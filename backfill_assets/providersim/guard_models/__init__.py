"""The guard models as vLLM serves them: Llama Guard 3/4 (chat and legacy completions) and
gpt-oss-safeguard (harmony format, analysis apart from the answer)."""
