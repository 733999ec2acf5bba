"""``python -m lightning_kit [fit|validate|test|predict] --model their.Module --data their.DataModule ...``.

The command line of a project that has no ``KitCLI`` of its own (``GenericCLI``): train.py's
subcommands, shortcuts and checks for any LightningModule and LightningDataModule named by class path.
"""

from .cli import GenericCLI, main

if __name__ == "__main__":
    main(GenericCLI)
