"""The execute stage: boxes, runtime profiles, the workload driver and the campaign runner."""
