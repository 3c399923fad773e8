"""TRL's side of bench_vs_trl.py; runs in a subprocess of its own (same environment). Reads a JSON workload from
argv[1], trains with GRPOTrainer, writes per-step rewards, wall time and the moment its first optimizer step ended to
argv[2]. The learning rate is constant, as coati's; with ``max_seconds`` training stops after the first step that
ends past that wall-clock budget (``steps`` is then only an upper bound). With ``save_at`` (seconds of training,
ascending, and ``save_dir``), the model is saved after the first step past each mark, the time spent saving left out
of the training wall-clock. With ``overlong`` (``[buffer tokens, factor]``), TRL's own soft overlong punishment
(DAPO's length shaping, as coati's presets apply it) is added to the reward with that weight."""

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
    from trl.rewards import get_soft_overlong_punishment

    sys.path.insert(0, spec["bench_dir"])
    from shared_reward import last_number_reward

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "gt_answer": r["gt_answer"]} for r in spec["rows"]]
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    rewards, weights = [last_number_reward], [1.0]
    if spec.get("overlong"):
        buffer, factor = spec["overlong"]
        rewards.append(get_soft_overlong_punishment(spec["max_new_tokens"], buffer))
        weights.append(factor)
    config = GRPOConfig(
        output_dir=spec["out_dir"],
        per_device_train_batch_size=spec["prompts"] * spec["generations"],
        num_generations=spec["generations"],
        max_completion_length=spec["max_new_tokens"],
        learning_rate=spec["lr"],
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        temperature=1.0,
        max_steps=spec["steps"],
        lr_scheduler_type="constant",
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=spec["seed"],
        gradient_accumulation_steps=1,
        bf16=spec.get("bf16", False),
        fp16=False,
        dataloader_num_workers=0,
        reward_weights=weights,
    )

    marks, saves, saving = list(spec.get("save_at") or []), [], [0.0]  # saving[0]: seconds spent saving

    first_step_at = []  # the wall-clock time (epoch seconds) the first optimizer step ended

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if not first_step_at:
                first_step_at.append(time.time())
            trained = time.perf_counter() - start - saving[0]
            if marks and trained >= marks[0]:
                begun, path = time.perf_counter(), f"{spec['save_dir']}/at-{len(saves)}"
                trainer.save_model(path)
                saves.append({"mark": marks.pop(0), "seconds": trained, "steps": state.global_step, "path": path})
                saving[0] += time.perf_counter() - begun
            if spec.get("max_seconds") and trained > spec["max_seconds"]:
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=rewards,
        args=config,
        callbacks=[Budget()],
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start - saving[0]
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    json.dump(
        {
            "wall": wall,
            "rewards": rewards,
            "step_times": step_times,
            "steps": trainer.state.global_step,
            "saves": saves,
            "first_step_at": first_step_at[0] if first_step_at else None,
        },
        open(sys.argv[2], "w"),
    )
