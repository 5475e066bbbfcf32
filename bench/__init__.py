"""Benchmarks for spo-service (issue 6): memory, latency, throughput, padding, threads, HTTP soak.

Not tests: ``make bench`` / ``python -m bench [subcommand]`` runs them and writes JSON under
``bench/results/``; ``BENCHMARKS.md`` reports the figures. Models and raw data are cached in the
git-ignored ``bench/.cache/``.
"""
