"""LightningDataModules: where data comes from, how it is split and batched."""


class DataUnavailableError(RuntimeError):
    """The configured data set is not on disk and could not be fetched."""
