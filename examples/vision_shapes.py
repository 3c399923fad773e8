"""Vision-language RL on pictures: GRPO on the built-in shapes task (count the shapes of one colour and kind in a
seeded picture), the answer graded by the math reward.

    python examples/vision_shapes.py -m PATH_TO_VLM [--steps 20] [-b transformers]

PATH_TO_VLM is a local vision-language model folder with its processor (e.g. a SmolVLM or Idefics3 checkpoint;
LLaVA trains on the transformers engine); a text-only model is refused before anything starts. The producer renders
each prompt with its picture through the model's processor, the trainer reads the same pixels, and the vision tower
stays frozen (--no-freeze-vision-tower trains it).
"""

import argparse

import rl_example

SYSTEM = "Look at the picture and answer with one number inside \\boxed{}, for example \\boxed{3}."

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args, rest = parser.parse_known_args()
    rl_example.main(
        [
            "--algo",
            "GRPO",
            "-kl",
            "0",
            "-s",
            SYSTEM,
            "-mnt",
            "16",
            "-mpt",
            "512",
            "--max-steps",
            str(args.steps),
            "-d",
            "shapes:count?min=1&max=4&size=96",
            "-p",
            "vision_shapes",
            *rest,
        ]
    )
