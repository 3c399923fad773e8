"""How actors run where they run: ``placement`` (which node and accelerators each actor takes), ``liveness``
(heartbeats and bounded waits on actors), ``startup`` (each process's start-up marks) and ``threads`` (the cores a
working actor is lent). Read ``placement`` first."""
