"""The critic role: a value model trained beside the policy for the estimators that need V (PPO's ``gae``).

A critic is a trainer with a value head: the same engine (ColossalAI Booster, HybridParallelPlugin, HybridAdam), the
same optimizer steps, shards and checkpoints as the policy's consumers, in a process group of its own. Read in order:
``config`` (its section of the run's tree), ``plan`` (what preflight resolves for it), ``step`` (values of a rollout
and one training step on the returns), ``consumer`` (the Ray actor).
"""
