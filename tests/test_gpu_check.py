"""benchmarks/gpu/check.py works before a GPU is lent: ``--cpu`` runs every stage end to end.

The GPU session that will run the check is short, so the script must not fail on its own code
there: the same stages run here in float32 at tiny sizes (and, slow, with bf16 autocast on the
CPU, the GPU run's precision path). The run is a fresh process, as on the GPU: the trainer's
accelerate precision is process-wide and set once.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "check.py"
STAGES = ["model", "bf16", "lora", "grpo", "envrl", "overhead", "eval"]


def load_check() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_check(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--out", str(out), "--work", str(tmp_path / "work"), *extra],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8")), done.stdout


def check_report(report: dict[str, Any], stdout: str, precision: str) -> None:
    assert list(report["stages"]) == STAGES and report["ok"] is True
    for name, stage in report["stages"].items():
        assert (stage["ok"], stage["error"]) == (True, None), (name, stage)
        assert 0 < stage["seconds"] < 120
    # one summary line per stage, in order, then the total
    lines = [line for line in stdout.splitlines() if line.split(" ", 1)[0] in (*STAGES, "check")]
    assert [line.split()[0] for line in lines] == [*STAGES, "check"]
    assert all(line.split()[1] == "ok" for line in lines)
    assert report["mixed_precision"] == precision
    s = {name: stage["figures"] for name, stage in report["stages"].items()}

    # the tiny Qwen2 (hidden 64, 2 layers), its tokenizer trained on Diag-Chain text
    assert (s["model"]["parameters"], s["model"]["vocab"]) == (138688, 503)

    compute = "torch.bfloat16" if precision == "bf16" else "torch.float32"
    assert s["bf16"] | {"loss": 0, "seconds_per_update": 0, "peak_rss_mib": 0} == {
        "launcher_precision": precision,
        "accelerator_precision": precision,
        "weights_dtype": ["torch.float32"],  # float32 master weights under autocast
        "forward_logits_dtype": compute,
        "device": "cpu",
        "gpu": None,
        "bf16_supported": False,
        "loss": 0,
        "seconds_per_update": 0,
        "peak_rss_mib": 0,
    }

    lora = s["lora"]
    # rank 8 on every linear layer of 2 layers: (q 64+64, k 64+32, v 64+32, o 64+64, gate/up 64+128, down 128+64) * 8
    assert (lora["trainable_parameters"], lora["parameters"]) == (16384, 138688 + 16384)
    assert lora["reference_gap_before"] == 0.0 and lora["kl_first_update"] == 0.0  # adapters start at zero
    assert lora["reference_gap_after"] > 0.0

    for name in ("grpo", "envrl", "eval"):
        f = s[name]
        assert f["updates"] == 2 and f["device"] == "cpu"
        assert 0 < f["seconds_per_update"] < 30
        assert len(f["first_micro_batch"]) == 2  # one record per update
        for record in f["first_micro_batch"]:
            assert record["units"] > 0
            # the same weights scored the rollout and the first micro-batch: the ratio is ~1
            assert 0.0 <= record["log_ratio_max_abs"] < 0.05 and record["clip_fraction"] == 0.0
            # the loop re-scores the old log-probs in the loss's own pass: the ratio is exactly 1
            assert (record["terms"]["ppo/ratio_mean"], record["terms"]["ppo/approx_kl"]) == (1.0, 0.0)
            assert record["terms"]["ppo/clip_fraction"] == 0.0
        # the sampler's own log-probs differ from the training pass's by rounding only
        assert all(0.0 <= gap < 0.05 for gap in f["old_logprob/rollout_gap_max"])
        for losses in f["losses"]:
            assert math.isfinite(losses["loss"]) and "loss/policy" in losses
        assert f["peak_rss_mib"] > 100
    # ENVRL's auxiliary losses ran on the batch's transitions, their weights on the cosine decay
    envrl = s["envrl"]
    assert all(losses["loss/sp"] > 0 and losses["loss/id"] > 0 for losses in envrl["losses"])
    assert envrl["weight/sp"] == [0.01, 0.005] and envrl["weight/id"] == [0.001, 0.0005]

    overhead = s["overhead"]
    assert (overhead["action_mode"], overhead["thought_tokens"]) == ("generate", 16) and overhead["aux_samples"] > 0
    assert overhead["attention_pairs"]["envrl"] > overhead["attention_pairs"]["grpo"] > 0
    assert overhead["time_ratio"] > 0 and overhead["grpo"]["median_seconds"] > 0

    # an evaluation after each update, through the runner, of 2 episodes each
    made = s["eval"]["evaluations"]
    assert sorted(made) == ["eval@1/valid", "eval@2/valid"]
    assert all(r["episodes"] == 2 and 0.0 <= r["success_rate"] <= 1.0 for r in made.values())
    assert len(s["eval"]["eval_seconds"]) == 2


def test_cpu_check_runs_every_stage(tmp_path: Path) -> None:
    report, stdout = run_check(tmp_path)
    check_report(report, stdout, "no")
    # ~20 s on 2 idle cores; the bound leaves room for a loaded CI machine
    assert report["profile"]["name"] == "cpu" and report["seconds"] < 120


@pytest.mark.slow
def test_cpu_check_with_bf16_autocast(tmp_path: Path) -> None:
    report, stdout = run_check(tmp_path, "--mixed-precision", "bf16")
    check_report(report, stdout, "bf16")


def test_a_failing_stage_is_recorded_and_the_summary_says_why() -> None:
    check = load_check()

    def broken() -> dict[str, Any]:
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")

    result = check.run_stage("grpo", broken)
    assert (result.ok, result.error) == (False, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "Traceback" in result.figures["traceback"] and result.seconds >= 0
    assert check.summary_line("grpo", result).split() == [
        "grpo",
        "FAIL",
        f"{result.seconds:.1f}",
        "s",
        *"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB".split(),
    ]
    fine = check.run_stage("model", lambda: {"parameters": 2_500_000, "vocab": 503})
    assert (fine.ok, fine.error, fine.figures) == (True, None, {"parameters": 2_500_000, "vocab": 503})
    assert check.summary_line("model", fine).endswith("2.5M parameters, vocab 503")


def test_a_stage_failure_does_not_stop_the_others(tmp_path: Path) -> None:
    """With no checkpoint (the model stage skipped by a failure), each later stage fails on its own."""
    check = load_check()
    runner = check.Check(check.PROFILES["cpu"], tmp_path, "cpu")
    runner.stage_model = lambda: (_ for _ in ()).throw(OSError("disk full"))
    results = {name: check.run_stage(name, getattr(runner, f"stage_{name}")) for name in ("model", "grpo", "envrl")}
    assert {name: r.error for name, r in results.items()} == {
        "model": "OSError: disk full",
        "grpo": "RuntimeError: no checkpoint: the model stage failed",
        "envrl": "RuntimeError: no checkpoint: the model stage failed",
    }


def test_the_gpu_profile_builds_a_model_of_20_to_50m_parameters(tmp_path: Path) -> None:
    """The GPU run's checkpoint, built here: 8 layers of hidden 512, the tokenizer trained on Diag-Chain."""
    check = load_check()
    model = check.build_checkpoint(tmp_path / "model", check.PROFILES["gpu"])
    record = json.loads((model / "envrl_model.json").read_text(encoding="utf-8"))
    assert (record["parameters"], record["vocab_size"]) == (23080448, 509)
    assert record["architecture"]["max_position_embeddings"] == 2048
