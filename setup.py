from pathlib import Path

from setuptools import find_packages, setup

# torch and colossalai are deliberately absent from install_requires: colossalai 0.5.0 pins torch<=2.5.1 and
# would replace the user's torch with a CUDA build. scripts/install.sh installs both the safe way.
requirements = [
    line.strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="coati",
    version="0.1.0",
    description="Producer/consumer RL post-training of language models with verifiable rewards, on Ray",
    packages=find_packages(include=["coati", "coati.*"]),
    py_modules=["rl_example"],
    entry_points={"console_scripts": ["coati=coati.cli:main"]},
    python_requires=">=3.10",
    install_requires=requirements,
    extras_require={
        # GPU only; each pins its own torch, so install them into an environment built for them.
        "vllm": ["vllm==0.32.0"],
        "sglang": ["sglang==0.5.23"],
    },
)
