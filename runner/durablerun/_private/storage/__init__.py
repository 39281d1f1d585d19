"""Where a run is kept: the backends (bytes and keys), the journal and its snapshots (``journal``),
stores by URI (``stores``), the run id's owner record (``owner``), optional dependencies (``extras``)."""
