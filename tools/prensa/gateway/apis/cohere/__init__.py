"""Cohere's embed and rerank APIs, v1 and v2, and Jina's rerank."""
