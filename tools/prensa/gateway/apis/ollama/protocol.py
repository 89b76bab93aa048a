"""Ollama's embedding API shapes (pydantic only): `/api/embed`, the older `/api/embeddings`, and
the two model routes embedding clients read, `/api/tags` and `/api/show`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

OPTIONS = (
    "Ollama's runner options. `num_ctx` below the model's max length is refused (it would cut inputs "
    "shorter); the others do not change an embedding and are ignored."
)
KEEP_ALIVE = "Accepted and ignored: prensa's models stay loaded."


class OllamaEmbedRequest(BaseModel):
    model: str = Field(description="Served model name; a `:latest` tag is ignored.")
    input: str | list[str] | None = Field(
        None, description='A text or a list of texts; none (or "") answers [].'
    )
    truncate: bool = Field(
        True, description="Cut inputs over the model's max length at the end; false: refuse them."
    )
    dimensions: int | None = Field(
        None,
        description="Keep the first N dimensions, then re-normalise (Ollama "
        "ignores N outside 1 .. the embedding size; so does prensa).",
    )
    options: dict[str, Any] | None = Field(None, description=OPTIONS)
    keep_alive: str | float | None = Field(None, description=KEEP_ALIVE)


class OllamaEmbedResponse(BaseModel):
    model: str = Field(description="The model name as requested.")
    embeddings: list[list[float]] = Field(
        description="One L2-normalised vector per input, in input order."
    )
    total_duration: int = Field(description="Nanoseconds the request took in the gateway.")
    load_duration: int = Field(description="Always 0: the model was loaded.")
    prompt_eval_count: int = Field(description="Tokens the model read, special tokens included.")


class OllamaEmbeddingsRequest(BaseModel):
    """The older single-text route, which Ollama answers without normalising."""

    model: str = Field(description="Served model name; a `:latest` tag is ignored.")
    prompt: str = Field("", description='The text; "" answers an empty embedding.')
    options: dict[str, Any] | None = Field(None, description=OPTIONS)
    keep_alive: str | float | None = Field(None, description=KEEP_ALIVE)


class OllamaEmbeddingsResponse(BaseModel):
    embedding: list[float] = Field(description="The model's pooled vector, not normalised.")


class OllamaModelDetails(BaseModel):
    format: str = Field(description="Always `onnx`.")
    family: str = Field(description="prensa task: embed, m3, rerank, classify or splade.")
    families: list[str] = Field(description="The family, alone.")
    parameter_size: str = Field(description="Always empty: not known to the gateway.")
    quantization_level: str = Field(description="The served precision (fp32, fp16, int8).")
    parent_model: str = Field(description="Always empty.")


class OllamaListedModel(BaseModel):
    name: str = Field(description="`<model>:latest`.")
    model: str = Field(description="`<model>:latest`.")
    modified_at: str = Field(description="When the gateway started (ISO 8601).")
    size: int = Field(description="Always 0: not known to the gateway.")
    digest: str = Field(description="SHA-256 of the model's name and revision.")
    details: OllamaModelDetails = Field(description="Format, family and precision.")


class OllamaTags(BaseModel):
    models: list[OllamaListedModel] = Field(description="Every served model.")


class OllamaShowRequest(BaseModel):
    model: str | None = Field(None, description="Served model name; a `:latest` tag is ignored.")
    name: str | None = Field(None, description="The older spelling of `model`.")
    verbose: bool | None = Field(None, description="Accepted and ignored.")


class OllamaShow(BaseModel):
    modelfile: str = Field(description="Always empty.")
    parameters: str = Field(description="Always empty.")
    template: str = Field(description="Always empty.")
    modified_at: str = Field(description="When the gateway started (ISO 8601).")
    details: OllamaModelDetails = Field(description="Format, family and precision.")
    model_info: dict[str, Any] = Field(
        description="`general.architecture` (the task), `<task>.context_length` "
        "(max tokens per input) and `<task>.embedding_length`."
    )
    capabilities: list[str] = Field(description="`embedding` for models that answer `/api/embed`.")
