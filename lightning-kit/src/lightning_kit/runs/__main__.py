"""``python -m lightning_kit.runs [FOLDER]``: the table of the runs below FOLDER (default ``runs/``), of any project."""

from .command import main

if __name__ == "__main__":
    main()
