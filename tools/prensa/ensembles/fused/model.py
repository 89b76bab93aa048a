"""Fused model: tokenize -> encode -> pool in one Python-backend model: two process hops fewer.

Each Python-backend stage costs an inter-process hop (Triton core -> stub -> back) and, on a
busy machine, a context switch or two; a lone short query through the three-stage ensemble
pays that three times. This model runs the same stage code (`prensa_stage_tokenize`,
`prensa_stage_encode`, `prensa_stage_pool`, copied beside it) in one `execute`: all requests'
texts are tokenized in one call, every row goes through the token-budget encoder, and each
request is pooled on its own. A request Triton marks cancelled is answered CANCELLED without
being computed, as in the encode stage. It has the ensemble's inputs and outputs, so clients do
not know which one they call, plus two ways in that the ensemble spreads over its stages: token ids
(`input_ids`, `attention_mask`, optional `token_type_ids`) instead of `text`, and the encoder's
`last_hidden_state` (and `sentence_embedding`, where the graph pools) as outputs. Those are
returned only to a request that names its outputs and leaves some out: a request naming none
(Triton then asks for all) gets what the ensemble gives, not a [rows, tokens, hidden] tensor it
did not ask for. Config parameters: the union of the three stages'.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy.typing as npt
import prensa_stage as contract
import prensa_stage_encode as encode_stage
import prensa_stage_pool as pool_stage
import prensa_stage_tokenize as tokenize_stage

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton, e.g. by unit tests of the functions above the model
    pb_utils = None

Tensors = dict[str, npt.NDArray[Any]]


def client_outputs(
    tokens: Tensors, encoded: Tensors, requested: set[str], pooler: Callable[[Tensors], Tensors]
) -> Tensors:
    """The outputs a request asked for: pooled ones from the pool stage, encoder ones as they are."""
    outputs = pooler({**tokens, **encoded})
    outputs.update(
        {
            name: value
            for name, value in encoded.items()
            if name in requested and name not in outputs
        }
    )
    return {name: value for name, value in outputs.items() if name in requested}


def _given_tokens(request: Any) -> Tensors | Exception:
    try:
        return cast(Tensors, encode_stage.read_token_inputs(request))
    except ValueError as exc:
        return exc


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = contract.parameters(config)
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.text_encoder = tokenize_stage.TextEncoder.from_parameters(params, version_dir)
        self.encoder = encode_stage.load_encoder(config, version_dir)
        self.pool = pool_stage.Pooler.from_parameters(params)
        self.token_metrics = encode_stage.TokenCounters(args["model_name"])
        self.all_outputs = {output["name"] for output in config["output"]}

    def _tokens(self, requests: list[Any]) -> list[Tensors | Exception]:
        """Token tensors per request: its own ids, or its texts tokenized with every other request's."""
        has_ids = [
            pb_utils.get_input_tensor_by_name(r, contract.INPUT_IDS) is not None for r in requests
        ]
        texts = iter(
            tokenize_stage.tokenize_requests(
                self.text_encoder,
                [r for r, ids in zip(requests, has_ids) if not ids],
                self.encoder.pad_id,
            )
        )
        return [_given_tokens(r) if ids else next(texts) for r, ids in zip(requests, has_ids)]

    def _wanted(self, request: Any) -> set[str]:
        """The outputs to return: per-token ones only when asked for among fewer than all outputs."""
        requested = set(request.requested_output_names())
        return requested if requested < self.all_outputs else requested - set(contract.ENCODER_ONLY)

    def execute(self, requests: list[Any]) -> list[Any]:
        cancelled = contract.CancelCheck(requests)
        live = cancelled.live()
        tokens = dict(zip(live, self._tokens([requests[i] for i in live])))
        valid = [i for i in live if not isinstance(tokens[i], Exception)]
        with self.token_metrics.counting(self.encoder):
            results = self.encoder.encode_each(
                [tokens[i] for i in valid], lambda j: cancelled(valid[j])
            )
        encoded = dict(zip(valid, results))
        return [
            self._response(request, tokens.get(i), encoded.get(i))
            for i, request in enumerate(requests)
        ]

    def _response(
        self, request: Any, tokens: Tensors | Exception | None, encoded: Tensors | Exception | None
    ) -> Any:
        """One request's answer: CANCELLED when skipped (`tokens` None: before tokenizing), its own
        error, or its outputs."""
        if tokens is None or isinstance(encoded, contract.Cancelled):
            return contract.cancelled_response()
        if isinstance(tokens, Exception):
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"invalid input: {tokens}")
            )
        try:
            if isinstance(encoded, Exception):
                raise RuntimeError(f"encoder failed: {encoded}")
            assert encoded is not None  # encode_each answers every request with valid tokens
            values = client_outputs(tokens, encoded, self._wanted(request), self.pool)
        except Exception as exc:  # noqa: BLE001 - this request fails alone
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        return pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in values.items()])

    def finalize(self) -> None:
        self.token_metrics.close()
