"""vLLM's pooling API: its bodies, answers and errors on its own paths and the ones it shares."""
