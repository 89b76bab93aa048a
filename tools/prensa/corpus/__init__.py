"""`prensa embed-corpus`: embed a whole corpus into Parquet, locally or on a Ray cluster."""
