"""The API families the gateway speaks, one folder each (protocol: pydantic shapes only; routes:
parse, call the core, shape the JSON); `common` holds what several share, `errors` their error
bodies. vLLM's and Infinity's bodies arrive on TEI's and bge-m3's paths; `dialects` alone tells them
apart, by their fields, for the routes' answers and the error handlers' alike."""
