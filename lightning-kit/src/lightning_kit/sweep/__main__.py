"""``python -m lightning_kit.sweep --space FILE --trials N --model their.Module --data their.DataModule``."""

from .command import main

if __name__ == "__main__":
    main()
