"""What a run writes, below storage: the typed records and totals (``model``), their bytes (``codec``),
the key scheme (``layout``)."""
