"""The producers' role plan (``rollout/plan.py``), built once by preflight: a producer is made from it and its
index alone, and what it needs of the trainer arrives named and resolved, not as the trainer's section."""

import inspect
from types import SimpleNamespace

from coati.distributed.config.tree import config_from_dict
from coati.distributed.driver.preflight import rollout_plan
from coati.distributed.rollout.plan import LoraSpec, RolloutPlan, TeacherLink, TrainerPrecision
from coati.distributed.rollout.producer import Producer


def _plan(**over):
    fields = dict(
        inference_model_path="/models/m",
        inference_options={"dtype": "float32"},
        train_dataset="train-spec",
        eval_dataset=None,
        prompt_format="fmt",
        stream_prompts=0,
        tokenizer_path="/models/m",
        teacher_model_path=None,
        processor_path=None,
    )
    return SimpleNamespace(**{**fields, **over})


def test_the_rollout_plan_holds_what_a_producer_needs_resolved():
    config = config_from_dict(
        {
            "producer": {
                "num_producers": 2,
                "num_generations": 8,
                "inference_batch_size": 8,
                "backend": "transformers",
            },
            "consumer": {"lora_rank": 4, "lora_alpha": 8.0, "train_batch_size": 16},
            "run": {"seed": 5},
        }
    )
    role = rollout_plan(config, _plan())
    assert isinstance(role, RolloutPlan) and role.model_path == "/models/m" and role.backend == "transformers"
    assert (role.num_producers, role.num_generations, role.microbatch_size, role.seed) == (2, 8, 8, 5)
    assert role.lora == LoraSpec(4, 8.0, tuple(config.consumer.lora_target_modules))
    assert role.trainer_precision == TrainerPrecision(
        config.consumer.compute_dtype, config.consumer.plugin.precision, 1
    )
    assert role.algorithm == config.algo_config and role.engine_options == {"dtype": "float32"}
    assert rollout_plan(config_from_dict({}), _plan()).lora is None
    assert role.teacher is None and role.processor_path is None
    assert rollout_plan(config, _plan(processor_path="/models/vlm")).processor_path == "/models/vlm"
    tree = {"algo": "OPD", "teacher": {"model": "/t", "privileged_context": " {gt_answer}", "timeout_s": 9.0}}
    link = rollout_plan(config_from_dict(tree), _plan(teacher_model_path="/t")).teacher
    assert link == TeacherLink("/t", " {gt_answer}", 9.0)  # the teacher's own chat template
    tree["teacher"]["model"] = "self:2"
    assert (
        rollout_plan(config_from_dict(tree), _plan(teacher_model_path="/models/m")).teacher.tokenizer_path
        == "/models/m"
    )


def test_a_producer_is_built_from_its_plan_and_index_only():
    params = [p for p in inspect.signature(Producer.__init__).parameters if not p.startswith("_ray")]  # Ray adds one
    assert params == ["self", "producer_idx", "plan", "reward_servers", "teacher_servers"]
    source = inspect.getsource(Producer)
    assert "config." not in source and ".consumer" not in source  # no other role's section read by attribute


def test_a_consumer_is_built_from_its_plan_and_rank_only():
    from coati.distributed.driver.preflight import trainer_plan
    from coati.distributed.trainer.consumer import GRPOConsumer
    from coati.distributed.trainer.plan import TrainerPlan

    params = [p for p in inspect.signature(GRPOConsumer.__init__).parameters if not p.startswith("_ray")]
    assert params == ["self", "rank", "plan"]
    config = config_from_dict({"producer": {"num_generations": 8}, "consumer": {"num_consumer_procs": 1}})
    role = trainer_plan(config, SimpleNamespace(train_model_path="/models/t", ref_slots=[]), "10.0.0.1", 29500)
    assert role == TrainerPlan(
        1, "10.0.0.1", 29500, "/models/t", config.consumer, config.algo_config, config.generation, 8, config.run.seed
    )
    assert role.reference_inside  # no reference servers of its own: each consumer holds the reference
    outside = trainer_plan(config, SimpleNamespace(train_model_path="/models/t", ref_slots=["slot"]), "10.0.0.1", 1)
    assert not outside.reference_inside
