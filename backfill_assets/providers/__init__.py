"""Model providers: the OpenAI-compatible and fake adapters, the error taxonomy, the rate
limiter.
"""
