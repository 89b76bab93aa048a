"""Bulk jobs on the gateway: `store` (files and jobs in a data directory, SQLite) and `runner`
(lines run through the gateway's own app, one gateway per job by lease)."""
