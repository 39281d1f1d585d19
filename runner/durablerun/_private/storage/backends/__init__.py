"""Storage backends: memory, filesystem, S3. Each knows bytes and keys only."""
