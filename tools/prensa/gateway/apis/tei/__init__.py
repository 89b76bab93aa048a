"""TEI's native HTTP API (and vLLM's and Infinity's bodies on its paths)."""
