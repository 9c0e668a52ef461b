"""LLM agents end to end: ``hf:`` with a tiny local model, ``openai:`` against ``envrl serve-model``
serving the same model over real HTTP, and a dead server. Nothing is downloaded."""

from __future__ import annotations

import json
import socket
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("openai")

from envrl.evaluation import ResultStore, run_evaluation  # noqa: E402

#: short episodes and responses keep the tiny model's runs to seconds
ENV_KWARGS = {"max_episode_steps": 3}
OPTIONS = {"max_new_tokens": 16}


def _trajectories(summary):
    return [
        [(step.action, (step.agent_info or {}).get("response")) for step in record.trajectory]
        for record in summary.records
    ]


@pytest.fixture(scope="module")
def served_model(tiny_checkpoint):
    """``envrl serve-model``'s app for the tiny checkpoint on a real localhost port."""
    from werkzeug.serving import make_server

    from envrl.agents.hf import HFBackend
    from envrl.agents.serve_model import create_app

    backend = HFBackend(str(tiny_checkpoint), device="cpu")
    app = create_app(backend, model_name="tiny")
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    backend.close()


def test_hf_agent_batched_equals_unbatched_and_records_every_response(tiny_checkpoint, tmp_path):
    spec = f"hf:{tiny_checkpoint}"
    common = dict(episodes=4, runs_dir=tmp_path, env_kwargs=ENV_KWARGS, agent_options=OPTIONS, progress=False)
    batched = run_evaluation("webshop", "test", spec, workers=1, batch_size=4, run_id="batched", **common)
    single = run_evaluation("webshop", "test", spec, workers=1, batch_size=1, run_id="single", **common)
    assert batched.errors == 0 and single.errors == 0
    assert _trajectories(batched) == _trajectories(single)  # greedy decoding does not depend on the batch

    record = batched.records[0]
    assert record.turns == 3
    for step in record.trajectory:
        info = step.agent_info
        assert set(info) >= {
            "response",
            "think",
            "format_valid",
            "format_problem",
            "prompt_tokens",
            "completion_tokens",
            "latency",
            "finish_reason",
        }
        assert 0 < info["completion_tokens"] <= OPTIONS["max_new_tokens"] and info["prompt_tokens"] > 100
        if not info["format_valid"]:  # a random model rarely writes the tags: the empty action, env feedback
            assert step.action == "" and not step.valid
    stats = record.agent_stats
    assert stats["responses"] == 3
    assert stats["format_invalid"] == sum(not s.agent_info["format_valid"] for s in record.trajectory)
    assert stats["completion_tokens"] == sum(s.agent_info["completion_tokens"] for s in record.trajectory)

    assert (
        f"model responses: 12 ({100 * sum(r.agent_stats['format_invalid'] for r in batched.records) / 12:.1f}% "
        "format-invalid, 0 failed requests)" in batched.format()
    )

    config = ResultStore(tmp_path).get_run("batched")
    protocol = config["agent_protocol"]
    assert protocol["template"] == "think-action" and protocol["history"] == 2
    assert protocol["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 16, "seed": None}
    assert protocol["backend"]["backend"] == "hf" and protocol["backend"]["model"] == str(tiny_checkpoint)
    assert config["step_limit"] == 3 and config["batch_size"] == 4
    assert set(config["agent_versions"]) == {"python", "torch", "transformers", "tokenizers"}
    assert config["agent_options"] == OPTIONS


def test_openai_agent_through_serve_model_matches_the_hf_agent(tiny_checkpoint, served_model, tmp_path):
    common = dict(
        episodes=4, runs_dir=tmp_path, env_kwargs=ENV_KWARGS, agent_options=OPTIONS, progress=False, batch_size=4
    )
    local = run_evaluation("webshop", "test", f"hf:{tiny_checkpoint}", run_id="hf", **common)
    remote = run_evaluation("webshop", "test", f"openai:tiny@{served_model}", run_id="openai", **common)
    assert remote.errors == 0
    assert _trajectories(remote) == _trajectories(local)  # same prompts, same model, same greedy text
    steps = [s for r in remote.records for s in r.trajectory]
    assert all(s.agent_info["attempts"] == 1 and "error" not in s.agent_info for s in steps)
    remote_tokens = [(s.agent_info["prompt_tokens"], s.agent_info["completion_tokens"]) for s in steps]
    local_tokens = [
        (s.agent_info["prompt_tokens"], s.agent_info["completion_tokens"]) for r in local.records for s in r.trajectory
    ]
    assert remote_tokens == local_tokens  # usage on the wire equals the local count
    protocol = ResultStore(tmp_path).get_run("openai")["agent_protocol"]
    assert protocol["backend"]["backend"] == "openai" and protocol["backend"]["base_url"] == served_model


def test_a_dead_server_gives_failed_steps_not_a_crashed_run(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    summary = run_evaluation(
        "webshop",
        "test",
        f"openai:nobody@http://127.0.0.1:{port}/v1",
        episodes=2,
        runs_dir=tmp_path,
        env_kwargs=ENV_KWARGS,
        progress=False,
        batch_size=2,
        agent_options={"max_retries": 1, "timeout": 2.0},
    )
    assert summary.errors == 0 and summary.episodes_done == 2  # the episodes ran to their step limit
    for record in summary.records:
        assert record.turns == 3 and not record.success
        assert all(
            s.action == "" and s.agent_info["attempts"] == 2 and "after 2 attempts" in s.agent_info["error"]
            for s in record.trajectory
        )
        assert record.agent_stats["failed_requests"] == 3
    line = (tmp_path / summary.run_id / "episodes.jsonl").read_text().splitlines()[0]
    assert "after 2 attempts" in json.dumps(json.loads(line)["trajectory"][0]["agent_info"])


def test_bad_llm_agent_input_fails_fast_with_one_line(tmp_path, monkeypatch):
    from envrl.evaluation import EvaluationError

    with pytest.raises(EvaluationError, match="unknown prompt template 'nope'"):
        run_evaluation(
            "webshop",
            "test",
            "hf:/no/such/model",
            episodes=1,
            runs_dir=tmp_path,
            progress=False,
            agent_options={"template": "nope"},
        )
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(EvaluationError, match="OPENAI_API_KEY"):
        run_evaluation("webshop", "test", "openai:gpt-4o-mini", episodes=1, runs_dir=tmp_path, progress=False)


def test_a_missing_local_checkpoint_fails_before_any_worker_starts(tmp_path):
    from envrl.evaluation import EvaluationError

    with pytest.raises(EvaluationError, match="no checkpoint at /no/such/model"):
        run_evaluation("webshop", "test", "hf:/no/such/model", episodes=1, runs_dir=tmp_path, progress=False)


def test_the_recorded_protocol_fingerprints_the_weights_without_loading_them(tiny_checkpoint):
    from envrl.agents import make_agent
    from envrl.agents.hf import HFBackend

    agent = make_agent(f"hf:{tiny_checkpoint}", "webshop")
    recorded = agent.protocol()["backend"]["weights_sha256"]
    backend = HFBackend(str(tiny_checkpoint), device="cpu")
    assert recorded is not None and recorded == backend.weights_sha256()
    assert make_agent("hf:some-org/not-on-this-machine", "webshop").protocol()["backend"]["weights_sha256"] is None
