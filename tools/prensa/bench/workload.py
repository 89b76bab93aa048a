"""`prensa.bench.workload`, the name calibration files record their corpus under
(`prensa.export.calibration.CORPUS`); the workload itself lives in `prensa.workload`."""

from prensa.workload import RerankCase, embedding_texts, passages, rerank_cases

__all__ = ["RerankCase", "embedding_texts", "passages", "rerank_cases"]
