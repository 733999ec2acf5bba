"""``python -m lightning_kit.placement --model their.Module --data their.DataModule``: the audit of any project."""

from .command import main

if __name__ == "__main__":
    main()
