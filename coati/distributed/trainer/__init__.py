"""The consumer's role: ``consumer.py`` (the actor) trains on rollout batches with ColossalAI and pushes weights;
read ``config.py`` (its section), then ``engine.py`` (booster, plugin, optimizer, checkpoints), ``step.py`` and
``passes.py`` (a step's micro-batches), ``forward.py`` (log-probs), ``weights.py`` (pushes), and the ColossalAI
shims and policies for CPUs (``colossal_cpu.py``, ``colossal_policy.py``)."""
