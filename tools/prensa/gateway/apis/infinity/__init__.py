"""Infinity's API, where its bodies differ from the paths' other dialects: `/rerank` and `/classify`."""
