"""The request path: one forwarder for every dialect and route (OpenAI, Anthropic, llama.cpp's
native routes, audio), the relay, validation, tools, media, listings and reranking.
"""
