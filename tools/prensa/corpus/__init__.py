"""`prensa embed-corpus`: embed a whole corpus into Parquet, locally or on a Ray cluster."""

# Seconds a request is sent again while the server heals before a run stops (`--heal-wait`); read
# by the command line without the corpus extra's imports.
HEAL_WAIT_S = 120.0
