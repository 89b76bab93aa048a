"""Ollama's embedding API."""
