"""schemathesis against the app's own OpenAPI schema: no request makes it answer 5xx.

The app runs without its campaign worker, so started campaigns stay queued and no
broker is deployed by generated requests.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from mqttbed.api.app import create_app
from mqttbed.controller.tokens import TokenRole, create_token
from mqttbed.core.settings import Settings

APP = create_app(Settings(data_dir=Path(tempfile.mkdtemp(prefix="mqttbed-schema-"))),
                 "http://127.0.0.1:9", run_campaigns=False)
USER_TOKEN = create_token(APP.state.core.sessions, "schemathesis", TokenRole.USER)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_no_generated_request_gets_a_server_error(case):
    response = case.call(headers={"authorization": f"Bearer {USER_TOKEN}"})
    assert response.status_code < 500, (case.method, case.formatted_path, response.text)
