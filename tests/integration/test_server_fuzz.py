"""Fuzz the server from its own OpenAPI schema (schemathesis, property-based).

Schemathesis reads ``/openapi.json`` from a real server (tiny real model, loopback port) and sends
requests that follow the schema and requests that break it. Each answer must be no 5xx, carry a
status and a body the schema documents for it, and a request that breaks the schema must be refused.
A request the schema allows may still be refused with a documented 400/413: the schema cannot say
that ``nbest`` <= ``beam`` nor state the server's configured limits (sentences, work), so schemathesis's
"schema-valid data is accepted" check is left out.
The example count is small so the module runs in seconds; a failure prints the request to replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import schemathesis
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.server import running_server
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from app.inference.engines import open_engine
from app.serving import ServerLimits, create_app

pytestmark = pytest.mark.usefixtures("single_torch_thread")

EXAMPLES = 25  # per operation and mode: a few seconds on two busy cores
# Bodies up to 256 KiB: schemathesis counts a 413 for an oversized schema-breaking body as a failure
# to reject it (it expects 400/422), so the size limit must not answer before validation does.
LIMITS = ServerLimits(max_request_bytes=256 * 1024, max_sentences=8, max_request_tokens=512, max_wait_ms=1.0)


@pytest.fixture(scope="module")
def api_schema(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[schemathesis.BaseSchema]:
    path: Path = tmp_path_factory.mktemp("fuzz") / "model.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    with running_server(create_app(open_engine(path), LIMITS)) as (url, _):
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


@pytest.mark.parametrize(
    ("path", "method", "mode"),
    [
        ("/translate", "POST", GenerationMode.POSITIVE),
        ("/translate", "POST", GenerationMode.NEGATIVE),
        ("/health", "GET", GenerationMode.POSITIVE),  # no input: nothing to break
    ],
)
def test_the_api_keeps_its_own_schema(
    api_schema: schemathesis.BaseSchema, path: str, method: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def answers_as_documented(case: schemathesis.Case) -> None:
        case.call_and_validate(timeout=30, excluded_checks=[positive_data_acceptance])

    answers_as_documented()
