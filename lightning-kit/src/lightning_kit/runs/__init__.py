"""The table of runs: ``python -m lightning_kit.runs [FOLDER]`` lists every run below a folder (``command``)."""
