"""What the project knows about the models it trains: ``architectures`` (which families run with which layouts and
engines), ``files`` (model folders and their weights), ``precision`` (compute and engine dtypes), ``attention``
(the CPU attention) and ``lora`` (adapters). Read ``architectures`` first."""
