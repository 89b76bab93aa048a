"""NIM's ranking API."""
