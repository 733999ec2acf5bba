"""The default logger of a run: Lightning's CSV files, which the runs table reads, and TensorBoard's event files
of the same metrics in the same run folder, so that ``tensorboard --logdir runs`` shows every run's curves."""

from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only


class CSVAndTensorBoardLogger(CSVLogger):
    """Lightning's ``CSVLogger``, handing each call on to a ``TensorBoardLogger`` of the same run folder.

    Args:
        save_dir: the folder of the runs (``runs``), as ``CSVLogger``'s.
        name: the experiment's folder in it (``lightning_logs``).
        version: the run's folder in that (``version_N``, the next free one by default).
        prefix: put before every metric's name.
        flush_logs_every_n_steps: how often ``metrics.csv`` is written out.
        tensorboard: write TensorBoard's event file too.
    """

    def __init__(
        self,
        save_dir: str,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
        tensorboard: bool = True,
    ) -> None:
        super().__init__(
            save_dir, name=name, version=version, prefix=prefix, flush_logs_every_n_steps=flush_logs_every_n_steps
        )
        self.tensorboard = tensorboard
        self._board: TensorBoardLogger | None = None

    @property
    def board(self) -> TensorBoardLogger | None:
        """The TensorBoard logger of this run's folder (made once the run's version is chosen); None without it."""
        if self.tensorboard and self._board is None:
            # The same folder as the CSV files': one run, one version. No placeholder `hp_metric` among the curves.
            self._board = TensorBoardLogger(
                self.save_dir, name=self.name, version=self.version, prefix=self._prefix, default_hp_metric=False
            )
        return self._board

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        if self.board is not None:
            self.board.log_metrics(metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace | None = None) -> None:
        super().log_hyperparams(params)
        if self.board is not None and params is not None:
            self.board.log_hyperparams(params)

    @rank_zero_only
    def save(self) -> None:
        super().save()
        if self._board is not None:
            self._board.save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self._board is not None:
            self._board.finalize(status)
