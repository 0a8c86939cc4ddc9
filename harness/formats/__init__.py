"""The files the harness reads and writes: records, rings, maps, prompts, text and YAML."""
