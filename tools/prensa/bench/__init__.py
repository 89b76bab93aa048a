"""Benchmarks and load tests: the workload, the systems compared, and the reports."""
