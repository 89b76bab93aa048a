"""The engine and its parts, which no API shape reaches into: the registry of served models, the
service (per-task operations over the engine's one `infer`), tokenization, chunking, dispatch
(cutting, merging, bounding Triton calls), admission limits, prompts and the encodings of vectors."""
