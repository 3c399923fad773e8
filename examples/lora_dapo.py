"""The default DAPO job with a LoRA adapter instead of full fine-tuning.

    python examples/lora_dapo.py [--rank 16] [rl_example flags...]

Rank 16 on every linear layer of each block (alpha 32, so the adapter is scaled by 2) at a learning rate of 2e-4:
adapters want about ten times the full model's rate, since B starts at zero and the scale is fixed. Every push carries
the adapter alone; `final/` is a PEFT folder:

    from peft import PeftModel
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "runs/lora_dapo/final")

Add --lora-export-merged for a merged copy in final/merged. Supported: data parallelism, the transformers and vLLM
backends (see docs/lora.md for what is refused and why).
"""

import argparse

import rl_example

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, default=16)
    args, rest = parser.parse_known_args()
    rl_example.main(
        [
            "--algo",
            "DAPO",
            "--lora-rank",
            str(args.rank),
            "--lora-alpha",
            str(2 * args.rank),
            "-lr",
            "2e-4",
            "-p",
            "lora_dapo",
            *rest,
        ]
    )
