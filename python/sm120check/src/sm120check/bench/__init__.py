"""Concurrency sweeps against a live LLM server and the speculation crossover analysis.

Standard library only: the HTTP client runs on asyncio streams so the bench runs on a bare node.
"""
