"""OpenAI's embeddings and model list (with NIM's and Jina's fields)."""
