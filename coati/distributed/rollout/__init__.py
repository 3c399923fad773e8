"""The producer's role: ``producer.py`` (the actor) generates with an inference backend and scores with the reward;
read ``config.py`` (its section), then ``data.py`` (rows and datasets), ``draw.py`` (which rows a draw takes),
``scoring.py`` (rewards onto the rollout record), ``evaluation.py`` (held-out shares) and ``receipt.py`` (pushes)."""
