"""The names scripts import keep their paths: ColossalChat's entry point, the registries, the consumer and the tree."""

import subprocess
import sys


def test_public_names_import_from_their_documented_paths():
    import coati.distributed as distributed
    from coati.distributed.algo import ALGO_MAP
    from coati.distributed.envs import ENVIRONMENTS
    from coati.distributed.inference import BACKEND_MAP
    from coati.distributed.launch import ALGO_MAP as LAUNCH_ALGO_MAP
    from coati.distributed.launch import Config, launch, launch_distributed
    from coati.distributed.reward import REWARD_FNS

    assert LAUNCH_ALGO_MAP is ALGO_MAP and {"GRPO", "DAPO", "RLOO", "REINFORCE_PPB", "GSPO", "CISPO"} <= set(ALGO_MAP)
    assert {"transformers", "vllm", "sglang"} <= set(BACKEND_MAP)
    assert {"math", "code"} <= set(REWARD_FNS) and {"tool_math", "retry"} <= set(ENVIRONMENTS)
    assert callable(launch_distributed) and callable(launch) and Config().algo == "DAPO"
    for name in distributed.__all__:  # the package's own list, loaded on first use
        assert getattr(distributed, name) is not None, name
    assert distributed.GRPOConsumer.__name__ == "GRPOConsumer" and distributed.launch_distributed is launch_distributed
    assert callable(distributed.run_job)


def test_importing_the_package_loads_no_role_folder():
    """``import coati.distributed`` stays light: its public names load when first used."""
    code = (
        "import sys, coati.distributed; "
        "assert not [m for m in sys.modules if m.startswith('coati.distributed.')], sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_colossalchat_module_paths_keep_working():
    """A ColossalChat script's imports: the broadcast, the backends and the consumer at their old paths."""
    from coati.distributed.comm import ray_broadcast_object, ray_broadcast_tensor_dict
    from coati.distributed.grpo_consumer import GRPOConsumer
    from coati.distributed.inference import BACKEND_MAP
    from coati.distributed.inference_backend import BACKEND_MAP as CC_BACKEND_MAP
    from coati.distributed.trainer.consumer import GRPOConsumer as Consumer
    from coati.distributed.transport import push

    assert (
        ray_broadcast_tensor_dict is push.ray_broadcast_tensor_dict
        and ray_broadcast_object is push.ray_broadcast_object
    )
    assert CC_BACKEND_MAP is BACKEND_MAP and GRPOConsumer is Consumer


def test_the_tiny_model_builders_keep_their_earlier_path():
    import coati.models
    import coati.testing

    assert coati.models.build_tiny_model is coati.testing.build_tiny_model
    earlier = {
        "CHAT_TEMPLATE",
        "build_tiny_model",
        "build_tiny_reward_model",
        "char_tokenizer",
        "train_tiny_reward_model",
    }
    assert all(getattr(coati.models, name) is getattr(coati.testing, name) for name in earlier)
