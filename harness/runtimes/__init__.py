"""Booting and reading runtimes, the command driver, and engine support (llama.cpp, vLLM)."""
