"""The agent kit on the engine's public context: tools that declare their side effects, metered LLM clients."""
