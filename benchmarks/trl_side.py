"""TRL's side of bench_vs_trl.py; runs in a subprocess of its own (same environment). Reads a JSON workload from
argv[1], trains with GRPOTrainer, writes per-step rewards and wall time to argv[2] (and the trained model to the
spec's ``save_to`` when given). The learning rate is constant, as coati's; with ``max_seconds`` training stops after
the first step that ends past that wall-clock budget (``steps`` is then only an upper bound)."""

import json
import sys
import time

import torch

if __name__ == "__main__":
    spec = json.loads(open(sys.argv[1]).read())
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, spec["bench_dir"])
    from bench_reward import last_number_reward

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "gt_answer": r["gt_answer"]} for r in spec["rows"]]
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    config = GRPOConfig(
        output_dir=spec["out_dir"], per_device_train_batch_size=spec["prompts"] * spec["generations"],
        num_generations=spec["generations"], max_completion_length=spec["max_new_tokens"],
        learning_rate=spec["lr"], loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.28, temperature=1.0,
        max_steps=spec["steps"], lr_scheduler_type="constant", logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=spec["seed"],
        gradient_accumulation_steps=1, bf16=spec.get("bf16", False), fp16=False, dataloader_num_workers=0,
    )  # fmt: skip

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if spec.get("max_seconds") and time.perf_counter() - start > spec["max_seconds"]:
                control.should_training_stop = True

    trainer = GRPOTrainer(model=model, reward_funcs=[last_number_reward], args=config, callbacks=[Budget()],
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer)  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    if spec.get("save_to"):  # the trained weights, for an evaluation outside this virtualenv
        trainer.save_model(spec["save_to"])
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    json.dump({"wall": wall, "rewards": rewards, "step_times": step_times, "steps": trainer.state.global_step},
              open(sys.argv[2], "w"))  # fmt: skip
