"""Hand-made bad input: YAML bombs, sweeps too big to run, names that climb out of the data
dir, bodies too large or not UTF-8. Each is refused with a message naming the bound or the
rule, never a server error, never a file outside the data dir. (Generated input:
tests/test_api_schema.py and the fuzzers in tests/test_fuzz_*.py.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mqttbed.api.app import create_app
from mqttbed.campaigns.spec import MAX_RUNS, load_spec, spec_from_text
from mqttbed.controller.storage import DataLayout, write_event_chunk
from mqttbed.controller.tokens import TokenRole, create_token
from mqttbed.core.bounded_yaml import MAX_BYTES, MAX_DEPTH, MAX_VALUES
from mqttbed.core.errors import SpecError
from mqttbed.core.names import UnsafeName
from mqttbed.core.settings import Settings

pytestmark = pytest.mark.timeout(60)

BILLION_LAUGHS = "\n".join(
    ["name: lol", "description: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)])
REGISTER = {"name": "pi-1", "hostname": "pi", "pid": 1, "cores": 1, "gpio_backend": "virtual",
            "clock": "CLOCK_MONOTONIC", "clock_resolution_ns": 1}


# -- campaign specs ------------------------------------------------------------------------

def test_a_billion_laughs_spec_is_refused_quickly_naming_the_bound():
    started = time.monotonic()
    with pytest.raises(SpecError, match=f"expands to more than {MAX_VALUES:,} values"):
        spec_from_text(BILLION_LAUGHS)
    assert time.monotonic() - started < 1.0


def test_anchors_used_a_few_times_still_load():
    spec = spec_from_text("name: anchors\nworkload: &w {subscribers: 3}\n"
                          "scenarios: [{name: a, workload.subscribers: 2}]\n"
                          "description: plain\n")
    assert spec.workload.subscribers == 3


def test_a_recursive_alias_is_refused():
    with pytest.raises(SpecError, match="recursive alias"):
        spec_from_text("name: loop\ndescription: &a [x, *a]\n")


def test_nesting_deeper_than_the_bound_is_refused_not_a_recursion_error():
    with pytest.raises(SpecError, match=f"nested more than {MAX_DEPTH} levels"):
        spec_from_text("name: deep\ndescription: " + "[" * 50_000 + "]" * 50_000)


def test_an_integer_of_ten_thousand_digits_is_refused_not_a_crash():
    with pytest.raises(SpecError, match="cannot be read: Exceeds the limit .4300 digits."):
        spec_from_text("name: big\nworkload: {messages: " + "9" * 10_000 + "}\n")


def test_a_sweep_whose_cross_product_exceeds_the_bound_is_refused_naming_it():
    keys = ["workload.subscribers", "workload.publishers", "workload.rate_hz",
            "workload.payload_bytes", "workload.messages", "workload.qos"]
    sweep = "".join(f"  {k}: [{', '.join(str(v) for v in range(40, 50))}]\n" for k in keys)
    started = time.monotonic()
    with pytest.raises(SpecError) as refused:
        spec_from_text(f"name: huge\nrepetitions: 3\nsweep:\n{sweep}")
    assert time.monotonic() - started < 1.0  # refused before any point is expanded
    message = str(refused.value)
    assert "10 x 10 x 10 x 10 x 10 x 10 x 3 = 3,000,000 runs" in message
    assert f"the {MAX_RUNS:,} one campaign may have (MAX_RUNS)" in message


def test_a_sweep_at_the_bound_is_accepted():
    spec = spec_from_text("name: edge\nrepetitions: 100\nsweep:\n"
                          "  workload.subscribers: [" + ", ".join(map(str, range(1, 101)))
                          + "]\n")
    assert len(spec.sweep["workload.subscribers"]) * spec.repetitions == MAX_RUNS


def test_a_spec_file_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(SpecError, match=r"is not UTF-8: byte 9 is 0xe9; save it as UTF-8"):
        load_spec(path)


def test_a_huge_spec_file_is_refused_without_being_read(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as file:
        file.truncate(8 << 30)  # 8 GiB, sparse: reading it would take the test down
    with pytest.raises(SpecError, match=f"more than the {MAX_BYTES:,}"):
        load_spec(path)


def test_a_huge_payload_size_is_refused_naming_the_limit():
    with pytest.raises(SpecError, match=r"workload\.payload_bytes: bad value 10000000000"):
        spec_from_text("name: p\nworkload: {payload_bytes: 10000000000}\n")


# -- names that would become paths --------------------------------------------------------

@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "x..y", "/abs", ".hidden", "",
                                  "nul\x00", "a" * 200])
def test_an_id_that_is_not_a_plain_file_name_never_becomes_a_path(tmp_path, name):
    layout = DataLayout(tmp_path / "data")
    with pytest.raises(UnsafeName, match="no '/' and no '..'"):
        write_event_chunk(layout, "c1", "c1-r0000", name, 0, {}, {})
    with pytest.raises(UnsafeName):
        layout.run_dir("c1", name)
    assert not any(tmp_path.rglob("*.parquet"))


# -- the served app ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    data = tmp_path_factory.mktemp("bad-input")
    app = create_app(Settings(data_dir=data / "data"), "http://127.0.0.1:9", run_campaigns=False)
    sessions = app.state.controller.sessions
    user = create_token(sessions, "u", TokenRole.USER)
    agent = create_token(sessions, "a", TokenRole.AGENT)
    with TestClient(app) as client:
        client.user = {"authorization": f"Bearer {user}"}
        client.agent = {"authorization": f"Bearer {agent}"}
        client.data = data
        yield client


def test_a_spec_body_that_is_not_utf8_is_422_naming_the_byte(app_client):
    response = app_client.post("/api/v1/campaigns", content=b"name: caf\xe9\n",
                               headers={**app_client.user, "content-type": "application/yaml"})
    assert response.status_code == 422
    assert "request body is not UTF-8: byte 9 is 0xe9" in response.json()["detail"]


def test_a_yaml_bomb_over_the_api_is_422_naming_the_bound(app_client):
    response = app_client.post("/api/v1/campaigns", content=BILLION_LAUGHS,
                               headers={**app_client.user, "content-type": "application/yaml"})
    assert response.status_code == 422
    assert "MAX_VALUES" in response.json()["detail"]


def test_a_body_declared_larger_than_the_limit_is_413_before_it_is_read(app_client):
    response = app_client.post("/api/v1/campaigns", content=b"x" * (2 << 20),
                               headers={**app_client.user, "content-type": "application/yaml"})
    assert response.status_code == 413
    assert "at most 1,052,672" in response.json()["detail"]


def test_a_streamed_body_past_the_limit_is_413(app_client):
    def chunks():
        for _ in range(64):
            yield b"# padding padding padding\n" * 1024

    response = app_client.post("/api/v1/campaigns", content=chunks(),
                               headers={**app_client.user, "content-type": "application/yaml"})
    assert response.status_code == 413


def test_an_agent_named_with_a_path_is_refused(app_client):
    response = app_client.post("/agent/v1/register", json={**REGISTER, "name": "../../tmp/x"},
                               headers=app_client.agent)
    assert response.status_code == 422
    assert "no '/' and no '..'" in response.text


def test_a_chunk_whose_agent_id_climbs_out_is_refused_and_writes_nothing(app_client):
    chunk = {"run_id": "c1-r0000", "agent_id": "../../../../escaped", "seq": 0,
             "columns": {}, "constants": {}}
    response = app_client.post("/agent/v1/runs/c1-r0000/chunks", json=chunk,
                               headers=app_client.agent)
    assert response.status_code == 422
    assert not list(Path(app_client.data).rglob("escaped*"))


@pytest.mark.parametrize("ids", ["..%2F..%2Fetc,x", "../../etc,x"])
def test_compare_with_an_id_that_climbs_out_is_404_not_a_file_read(app_client, ids):
    response = app_client.get(f"/compare?ids={ids}", headers=app_client.user)
    assert response.status_code == 404
    assert "no '/' and no '..'" in response.text
