"""What the driver knows of each inference backend before any engine loads: its options and the checks on them, its
capabilities (in-flight pushes, LoRA, streaming) and the engine class that implements it (``ENGINE``, imported only
where an engine starts). Nothing here imports torch or an engine, so a run's mistakes end before either loads.
``BACKEND_MAP`` names these classes; the engines subclass them (``base.InferenceBackend``)."""

from __future__ import annotations

from collections.abc import Mapping

from coati.distributed.inference.hints import INSTALL_HINTS

DEFAULT_MEM_FRACTION = 0.5
"""SGLang's share of the GPU for weights and KV cache unless mem_fraction_static is set"""


class BackendOptions:
    """A backend's options and checks (classmethods only)."""

    ENGINE: str = ""
    """the engine class, as package.module:Class"""

    @classmethod
    def engine_name(cls) -> str:
        """The engine class's name (what messages call the backend), without importing it."""
        return cls.ENGINE.rpartition(":")[2] or cls.__name__

    OPTIONS: dict[str, str] = {}
    """engine options a user may pass (``inference_model_config`` keys beside ``path``), with what each does"""
    IN_FLIGHT_UPDATES = False
    """whether ``receive_weights`` may run while ``generate`` runs (another thread): generation pauses between
    engine steps, keeping its requests and KV cache, the weights load, generation resumes; the batch it returns
    records the version that sampled each token (``token_versions``)"""
    LORA = False
    """whether the engine applies LoRA pushes (``receive_adapter``)"""
    ROUTES = False
    """whether the engine reports the experts each token was routed to (routing replay)"""
    IMAGES = False
    """whether the engine generates from prompts with images (``generate``'s ``images``: a vision-language model)"""
    STREAMS = False
    """whether the engine keeps groups across calls (``submit``, ``collect``, ``withdraw``): a producer then keeps it
    full, adding a prompt as each group finishes, instead of generating rounds to their end"""

    @classmethod
    def check_options(cls, options: Mapping) -> None:
        """Refuse options this backend does not know, naming them and the known ones (nothing is ignored)."""
        unknown = sorted(set(options) - set(cls.OPTIONS))
        if unknown:
            known = ", ".join(f"{k} ({v})" for k, v in cls.OPTIONS.items()) or "none"
            raise ValueError(f"inference option(s) {unknown} are not known to {cls.engine_name()}; known: {known}")

    @classmethod
    def check_model(cls, config: dict, where: str, options: Mapping, gpu: bool) -> None:
        """Refuse, before any actor starts, a model this engine cannot serve on this device (``config``: its
        config.json), naming the alternative; by default any causal LM is served."""

    @classmethod
    def check_available(cls) -> None:
        """Raise ImportError, with the install command, when the engine is not installed."""

    @classmethod
    def engine_options(
        cls,
        options: Mapping,
        *,
        processes: int,
        sleep: bool,
        gpu: bool,
        in_flight: bool = False,
        lora_rank: int = 0,
        routing_replay: bool = False,
    ) -> dict:
        """Constructor options for a launch: the user's ``options`` (checked), ``processes`` engine processes per
        producer (``num_proc_per_producer``), whether producers sleep while consumers train, whether pushes load
        while a batch is being generated (``in_flight_weight_updates``), and whether they are placed on GPUs."""
        cls.check_options(options)
        cls.check_processes(processes, gpu)
        if sleep and (reason := cls.cannot_sleep(options, gpu)):
            raise ValueError(f"sleep_while_training=True, but {reason}; turn sleep_while_training off")
        if in_flight and not cls.IN_FLIGHT_UPDATES:
            raise ValueError(
                f"in_flight_weight_updates=True, but the {cls.engine_name()} engine loads weights only "
                "between batches; use the vllm backend or turn in_flight_weight_updates off"
            )
        if lora_rank and not cls.LORA:
            raise ValueError(
                f"lora_rank={lora_rank}, but the {cls.engine_name()} engine cannot apply LoRA pushes yet; use "
                "the transformers or vllm backend, or lora_rank 0"
            )
        if lora_rank and in_flight:
            raise ValueError(
                "in_flight_weight_updates with LoRA is not supported yet: an adapter loads between "
                "batches; turn one of them off"
            )
        if routing_replay:
            cls.check_routing(gpu)
        options = cls.launch_options(options, processes, sleep)
        if lora_rank:
            options["lora_rank"] = lora_rank
        if routing_replay:
            options["record_routing"] = True
        return {**options, "in_flight_updates": True} if in_flight else options

    @classmethod
    def cannot_route(cls, gpu: bool) -> str:
        """Why the engine reports no routing (``ROUTES`` False)."""
        return "it has no hook for it"

    @classmethod
    def check_routing(cls, gpu: bool) -> None:
        """Refuse routing replay where the engine cannot report its routing."""
        if not cls.ROUTES:
            raise ValueError(
                f"routing_replay=True, but the {cls.engine_name()} engine does not report its routing here "
                f"({cls.cannot_route(gpu)}); use the transformers backend (-b transformers) or turn "
                "routing_replay off"
            )

    @classmethod
    def check_processes(cls, processes: int, gpu: bool) -> None:
        """Refuse a number of engine processes per producer the backend cannot run (the default engine is one)."""
        if processes != 1:
            raise ValueError(
                f"num_proc_per_producer={processes}, but the {cls.engine_name()} engine runs in the producer's "
                "process; use 1, or a backend with tensor-parallel engines (vllm, sglang)"
            )

    @classmethod
    def launch_options(cls, options: Mapping, processes: int, sleep: bool) -> dict:
        """The checked user options plus what the launch decides (by default nothing)."""
        return dict(options)

    @classmethod
    def cannot_sleep(cls, options: Mapping, gpu: bool) -> str | None:
        """Why ``sleep`` cannot be honoured with these options on this device, or None when it can."""
        return None

    @classmethod
    def weight_ranks(cls, options: Mapping) -> int:
        """Members of each weight group that one producer brings (its engine's processes that hold weights)."""
        return 1

    @staticmethod
    def _require(module: str, hint: str) -> None:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise ImportError(f"the {module} inference backend needs {module} installed: {hint}")


class TransformersOptions(BackendOptions):
    ENGINE = "coati.distributed.inference.transformers_backend:TransformersBackend"
    LORA = True
    ROUTES = True
    IMAGES = True
    OPTIONS = {
        "device": "torch device (default: cuda when available, else cpu)",
        "dtype": "weights dtype, e.g. bfloat16 (default: bfloat16 on CUDA, float32 on CPU)",
        "seed": "unused: sampling draws from the producer's seeded torch RNG",
    }


class SGLangOptions(BackendOptions):
    ENGINE = "coati.distributed.inference.sglang_backend:SGLangBackend"

    @classmethod
    def cannot_route(cls, gpu: bool) -> str:
        return "SGLang's routed-experts return is not wired into coati's records yet"

    OPTIONS = {
        "mem_fraction_static": f"fraction of the GPU for weights and KV cache (default {DEFAULT_MEM_FRACTION:g}; "
        "lower it with colocate)",
        "dtype": "weights dtype, e.g. bfloat16 (default: the checkpoint's)",
        "seed": "sampling seed (set per producer by the launcher)",
    }

    @classmethod
    def check_available(cls) -> None:
        cls._require("sglang", INSTALL_HINTS["sglang"])

    @classmethod
    def check_options(cls, options: Mapping) -> None:
        super().check_options(options)
        fraction = options.get("mem_fraction_static")
        if fraction is not None and (
            isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1
        ):
            raise ValueError(f"inference option mem_fraction_static must be in (0, 1), got {fraction!r}")

    @classmethod
    def check_processes(cls, processes: int, gpu: bool) -> None:
        if not gpu:
            raise ValueError(
                "the sglang backend runs only on CUDA GPUs, but producers are placed without GPUs; give producers "
                "GPUs (producer num_gpus > 0) or use -b vllm or -b transformers"
            )

    @classmethod
    def launch_options(cls, options: Mapping, processes: int, sleep: bool) -> dict:
        return {**options, "tensor_parallel_size": processes, "enable_memory_saver": sleep}
