"""The measuring tools a maintainer runs again, and their recorded results (benchmarks/README.md).

A package of the repository, not of the installed distribution: run a tool from the repository root as
`python -m benchmarks.NAME`, which lets it import its helpers (`benchmarks.results_io`) and the tests' oracles
(`tests.numpy_reference`) as packages.
"""
