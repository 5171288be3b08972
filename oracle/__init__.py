"""Projection oracle: memory and throughput of a distributed LLM training config (never imports ray)."""
