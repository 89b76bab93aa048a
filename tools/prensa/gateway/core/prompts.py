"""Prompts: the text a model's sentence-transformers config prepends to an input, chosen by name.

A request names a prompt with TEI's `prompt_name`, or says what its inputs are with `input_type`
(NIM's query/passage, Cohere's search_query/search_document/...), which picks the model's prompt
of that role when it has one: asymmetric models (e5, bge with a query instruction) get their
instruction, symmetric ones embed the text as given. Without either, the server's
`--default-prompt` / `--default-prompt-name` applies. Prompts apply to texts, never to token ids.
A model whose pooling leaves prompts out (`include_prompt: false`) pools only the text's own
tokens: its prompted texts go the token path with the prompt's tokens marked (`PromptedText`).
"""

from __future__ import annotations

from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.tokenization import Item, PromptedText
from prensa.gateway.errors import validation
from prensa.gateway.settings import GatewaySettings

# The prompt names each input type looks for, in order (sentence-transformers configs name roles freely).
ROLE_PROMPTS: dict[str, tuple[str, ...]] = {
    "query": ("query", "search_query"),
    "search_query": ("search_query", "query"),
    "passage": ("passage", "document", "search_document"),
    "document": ("document", "passage", "search_document"),
    "search_document": ("search_document", "document", "passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def prompt_text(
    model: ServedModel,
    settings: GatewaySettings,
    prompt_name: str | None = None,
    input_type: str | None = None,
) -> str | None:
    """The text to prepend to each of this request's texts, or None."""
    if prompt_name is not None:
        if prompt_name not in model.prompts:
            known = ", ".join(sorted(model.prompts)) or "none"
            raise validation(
                f"prompt `{prompt_name}` is not defined for model `{model.name}`; its prompts: {known}"
            )
        return model.prompts[prompt_name]
    if input_type is not None:
        return next(
            (model.prompts[n] for n in ROLE_PROMPTS[input_type] if n in model.prompts), None
        )
    if settings.default_prompt is not None:
        return settings.default_prompt
    return model.prompts.get(settings.default_prompt_name) if settings.default_prompt_name else None


def with_prompt(items: list[Item], prompt: str | None, marked: bool = False) -> list[Item]:
    """`items` with `prompt` before each text; `marked` texts remember it (`PromptedText`)."""
    if not prompt:
        return items
    if marked:
        return [PromptedText(prompt, item) if isinstance(item, str) else item for item in items]
    return [prompt + item if isinstance(item, str) else item for item in items]


def prompted(
    model: ServedModel,
    settings: GatewaySettings,
    items: list[Item],
    prompt_name: str | None = None,
    input_type: str | None = None,
) -> list[Item]:
    """`items` with the request's prompt prepended to its texts, marked where the model's pooling
    leaves it out."""
    return with_prompt(
        items,
        prompt_text(model, settings, prompt_name, input_type),
        marked=not model.include_prompt,
    )
