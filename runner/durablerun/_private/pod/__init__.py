"""The runner in a DurableRun's pod: the attempt around the engine (``attempt``) and its lease through the
run's status (``lease``)."""
