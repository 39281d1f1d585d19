"""The durable-run operator: reconciles DurableRun resources into runner pods."""
